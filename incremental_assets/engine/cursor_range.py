"""The values a table's cursor can hold end to end, so that ``rewind --to`` refuses a value
the next run could not use (and a run names the fix for a cursor set to one before).

A run reads ``(cursor - lookback, high-water mark]``; the bounds go to Spark as literals of
the column's type, to a database as SQL text and to Delta's file pruning:

- ``id`` and ``sequence``: Spark compares a 64-bit integer, so ``cursor - lookback`` must
  be one. The lowest one stood for "reset" in earlier releases, so the range starts above
  it: ``[-2**63 + 1 + lookback, 2**63 - 1]``.
- ``timestamp`` and ``hybrid``: Python's and Spark's instants run from 0001-01-01 to
  9999-12-31 (UTC). A zone-less source is read in its own zone, with bounds widened by
  hours where the zone has daylight saving, so a day is kept free at each end:
  ``[0001-01-02 + lookback, 9999-12-30T23:59:59.999999Z]``. A hybrid cursor's id part is
  a 64-bit integer. (As microseconds since 1970, watermarks.to_transaction_version's form,
  every such instant fits a 64-bit integer with room to spare.)

Example:
    >>> refusal(spec, datetime(1, 1, 1, tzinfo=timezone.utc))  # doctest: +SKIP
    'it is before the earliest watermark ... (0001-01-02T01:00:00Z) ...'
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from incremental_assets.engine.errors import CursorRangeError
from incremental_assets.engine.watermarks import ID_MAX, ID_MIN, WatermarkValue, format_value
from incremental_assets.specs import TableSpec
from incremental_assets.specs.durations import format_duration

TIME_MIN = datetime(1, 1, 2, tzinfo=timezone.utc)
TIME_MAX = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=timezone.utc)


def bounds(spec: TableSpec) -> tuple[datetime | int, datetime | int] | None:
    """The lowest and highest cursor (its time part, for a hybrid watermark) a run of
    ``spec`` can read from; None when the lookback leaves no value."""
    wm = spec.watermark
    lookback = wm.lookback
    if wm.kind in ("id", "sequence"):
        assert isinstance(lookback, int)
        low = ID_MIN + 1 + lookback
        return (low, ID_MAX) if low <= ID_MAX else None
    assert isinstance(lookback, timedelta)
    try:
        low_time = TIME_MIN + lookback
    except OverflowError:
        return None
    return (low_time, TIME_MAX) if low_time <= TIME_MAX else None


def describe(spec: TableSpec) -> str:
    """The range as the fix of a refusal says it."""
    found = bounds(spec)
    wm = spec.watermark
    if found is None:
        return f"no value: watermark.lookback ({wm.lookback}) reaches past the earliest one"
    low, high = found
    kind = "an instant" if wm.kind in ("timestamp", "hybrid") else "an integer"
    text = f"{kind} from {format_value(low)} to {format_value(high)}"
    if wm.lookback:
        lookback = (
            format_duration(wm.lookback) if isinstance(wm.lookback, timedelta) else wm.lookback
        )
        text += f" (the lowest a run can read from, plus the lookback {lookback})"
    if wm.kind == "hybrid":
        text += f", with an id part from {ID_MIN} to {ID_MAX}"
    return text


def refusal(spec: TableSpec, value: WatermarkValue) -> str | None:
    """Why a run could not read from the cursor ``value`` (None: it can)."""
    found = bounds(spec)
    if found is None:
        return describe(spec)
    low, high = found
    leading = value[0] if isinstance(value, tuple) else value
    if leading < low:  # type: ignore[operator]
        return f"{format_value(value)} is below the lowest watermark a run can read from"
    if leading > high:  # type: ignore[operator]
        return f"{format_value(value)} is above the highest watermark a run can read from"
    if isinstance(value, tuple) and not ID_MIN <= value[1] <= ID_MAX:
        return f"the id part of {format_value(value)} is not a 64-bit integer"
    return None


def check_cursor(spec: TableSpec, cursor: WatermarkValue | None) -> None:
    """Refuse a run whose cursor no run can read from (a rewind of an earlier release set
    it): the fix is a rewind to a usable value."""
    problem = None if cursor is None else refusal(spec, cursor)
    if problem is None:
        return
    raise CursorRangeError(
        spec.name,
        f"the watermark cannot be used: {problem}; nothing was read or written.",
        f"set a usable one with `incremental-assets rewind {spec.name} --to VALUE --reason "
        f"TEXT`, VALUE being {describe(spec)}, or reload with --reset",
    )
