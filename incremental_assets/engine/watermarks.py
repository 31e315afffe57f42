"""Watermark values: how a table's cursor is compared, shifted, stored and shown.

A cursor is the highest watermark value a table has loaded (inclusive). Timestamps are
UTC instants with microsecond precision (Spark's); ids are integers. In the Delta log the
cursor is stored twice in the same commit as the data: as readable commit metadata, and as
the version of a Delta application transaction (``txn``), which survives checkpoints and
log clean-up. The transaction version is a 64-bit integer, so timestamps are stored as
microseconds since the Unix epoch.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Literal, Union

WatermarkKind = Literal["timestamp", "id", "sequence", "hybrid"]
# A hybrid cursor is (timestamp, tie-breaking id), compared lexicographically.
WatermarkValue = Union[datetime, int, tuple[datetime, int]]

# Lexicographic extremes of a hybrid cursor's id part.
ID_MIN, ID_MAX = -(2**63), 2**63 - 1

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICRO = timedelta(microseconds=1)
# The lowest bound a lookback reaches: a day after the first instant a datetime (and a
# Spark timestamp) holds, so the bound can still be moved into any source's time zone.
EARLIEST_BOUND = datetime(1, 1, 2, tzinfo=timezone.utc)


def to_utc(value: datetime) -> datetime:
    """Naive datetimes here are already UTC (the engine never uses the machine's zone)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def instant(value: WatermarkValue) -> datetime | int:
    """The leading (time) part of a hybrid cursor; other values as they are."""
    return value[0] if isinstance(value, tuple) else value


def to_transaction_version(value: WatermarkValue, kind: WatermarkKind) -> int:
    """The cursor's (leading) value as a Delta transaction version; a hybrid cursor's id
    goes into a second application transaction (see ``delta_lake.store``)."""
    value = instant(value)
    if isinstance(value, datetime):
        return (to_utc(value) - _EPOCH) // _MICRO
    return int(value)


def from_transaction_version(version: int, kind: WatermarkKind) -> WatermarkValue:
    if kind in ("timestamp", "hybrid"):
        return _EPOCH + timedelta(microseconds=version)
    return version


def format_value(value: WatermarkValue | None) -> str:
    """A stable, sortable text form: ISO-8601 UTC with 'Z' for timestamps."""
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return f"{format_value(value[0])}|{value[1]}"
    if isinstance(value, datetime):
        text = to_utc(value).isoformat(timespec="microseconds").replace("+00:00", "Z")
        return text.replace(".000000Z", "Z")
    return str(value)


def parse_value(text: str, kind: WatermarkKind) -> WatermarkValue:
    if kind == "hybrid":
        time_text, _, id_text = text.partition("|")
        return (to_utc(datetime.fromisoformat(time_text.replace("Z", "+00:00"))), int(id_text))
    if kind != "timestamp":
        return int(text)
    return to_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))


def shift_back(value: WatermarkValue, lookback: timedelta | int) -> WatermarkValue:
    """The lower bound of a window that re-reads ``lookback`` before ``value``.

    Shifts the instant, not a wall clock: a lookback of 2h across a DST change is still
    exactly two hours, because values are UTC. A cursor too close to the year 1, or to the
    lowest 64-bit id, for the whole lookback stops at :data:`EARLIEST_BOUND` (or at the
    cursor, if that is earlier) or at ``ID_MIN`` instead of overflowing.
    """
    if isinstance(value, tuple):
        # Exactly after the cursor without a lookback; else every id of the earlier instant.
        assert isinstance(lookback, timedelta)
        return value if not lookback else (_earlier(value[0], lookback), ID_MIN)
    if isinstance(value, datetime):
        assert isinstance(lookback, timedelta)
        return _earlier(value, lookback)
    assert isinstance(lookback, int)
    return max(value - lookback, ID_MIN)


def _earlier(value: datetime, lookback: timedelta) -> datetime:
    floor = EARLIEST_BOUND if value.tzinfo else EARLIEST_BOUND.replace(tzinfo=None)
    if value - floor > lookback:
        return value - lookback
    return min(value, floor)  # never above the cursor: that would skip rows


def lag_seconds(watermark: WatermarkValue | None, clock: datetime) -> float | None:
    """How far the table trails the source clock (timestamps only)."""
    watermark = instant(watermark) if watermark is not None else None
    if not isinstance(watermark, datetime):
        return None
    return max(0.0, (to_utc(clock) - to_utc(watermark)).total_seconds())
