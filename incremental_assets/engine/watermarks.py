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

WatermarkKind = Literal["timestamp", "id", "sequence"]
WatermarkValue = Union[datetime, int]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICRO = timedelta(microseconds=1)


def to_utc(value: datetime) -> datetime:
    """Naive datetimes here are already UTC (the engine never uses the machine's zone)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def to_transaction_version(value: WatermarkValue, kind: WatermarkKind) -> int:
    if kind != "timestamp":
        return int(value)
    assert isinstance(value, datetime)
    return (to_utc(value) - _EPOCH) // _MICRO


def from_transaction_version(version: int, kind: WatermarkKind) -> WatermarkValue:
    if kind != "timestamp":
        return version
    return _EPOCH + timedelta(microseconds=version)


def format_value(value: WatermarkValue | None) -> str:
    """A stable, sortable text form: ISO-8601 UTC with 'Z' for timestamps."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        text = to_utc(value).isoformat(timespec="microseconds").replace("+00:00", "Z")
        return text.replace(".000000Z", "Z")
    return str(value)


def parse_value(text: str, kind: WatermarkKind) -> WatermarkValue:
    if kind != "timestamp":
        return int(text)
    return to_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))


def shift_back(value: WatermarkValue, lookback: timedelta | int) -> WatermarkValue:
    """The lower bound of a window that re-reads ``lookback`` before ``value``.

    Shifts the instant, not a wall clock: a lookback of 2h across a DST change is still
    exactly two hours, because values are UTC.
    """
    if isinstance(value, datetime):
        assert isinstance(lookback, timedelta)
        return value - lookback
    assert isinstance(lookback, int)
    return value - lookback


def lag_seconds(watermark: WatermarkValue | None, clock: datetime) -> float | None:
    """How far the table trails the source clock (timestamps only)."""
    if not isinstance(watermark, datetime):
        return None
    return max(0.0, (to_utc(clock) - to_utc(watermark)).total_seconds())
