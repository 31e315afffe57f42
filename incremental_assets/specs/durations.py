"""Parsing of durations written in table specs ("2h", "90m", "1d 6h", "PT2H")."""

from __future__ import annotations

import math
import re
from datetime import timedelta

MAX_DURATION = timedelta(days=3650)
"""The longest duration a spec may set (lookback, settle_lag, max_lag, retry_delay, ...):
ten years is longer than any of them needs, and keeps ``instant - duration`` inside the
years datetimes and Spark timestamps can hold for any instant after 1900 (see
``partitioning.start``)."""
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_ISO = re.compile(
    r"^P(?:(?P<days>\d+)D)?(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)S)?)?$"
)


def parse_duration(value: object) -> timedelta:
    """Parse a duration such as ``"2h"``, ``"1d 6h"``, ``"90m"``, ``"PT2H"`` or seconds as a number.

    Durations are never negative (a negative lookback would open a gap above the cursor)
    and at most :data:`MAX_DURATION`.

    Raises:
        ValueError: with the accepted forms, when ``value`` is not a duration or is out of
            range.
    """
    try:
        result = _parse(value)
    except OverflowError:
        result = timedelta.max  # more days than a timedelta holds: reported as too long
    if result < timedelta(0):
        raise ValueError(f"{value!r} is not a duration: it is negative; write e.g. '2h'")
    if result > MAX_DURATION:
        raise ValueError(
            f"{value!r} is too long: a duration is at most {MAX_DURATION.days}d (ten years); "
            "set a shorter one (rows older than a lookback are re-read once by a backfill of "
            "their partitions)"
        )
    return result


def _parse(value: object) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write it like '30s', '15m' or '2h'")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a duration; write it like '30s', '15m' or '2h'")
        return timedelta(seconds=value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("0", ""):
            return timedelta(0)
        iso = _ISO.match(value.strip().upper())
        if iso and any(iso.groupdict().values()):
            parts = {k: int(v) for k, v in iso.groupdict().items() if v}
            return timedelta(**parts)
        compact = text.replace(" ", "")
        if _PART.sub("", compact) == "" and compact:
            total = timedelta(0)
            for number, unit in _PART.findall(compact):
                total += timedelta(**{_UNITS[unit]: float(number)})
            return total
    raise ValueError(
        f"{value!r} is not a duration; write it like '30s', '15m', '2h', '1d 6h' or 'PT2H'"
    )


def format_duration(value: timedelta) -> str:
    """Render a duration compactly, the inverse of :func:`parse_duration` for whole seconds."""
    seconds = int(value.total_seconds())
    if seconds == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            out.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(out)
