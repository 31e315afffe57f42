"""A window as column ranges, and those ranges as Spark filters and file-pruning tests.

A window is an OR of parts; each part is an AND of ranges on single columns. The same
ranges drive the Spark filter (pushed down to Parquet row groups, JDBC queries) and the
pruning of Delta files by their min/max statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import reduce
from zoneinfo import ZoneInfo

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, TimestampNTZType

from incremental_assets.engine.transforms import quote
from incremental_assets.engine.watermarks import WatermarkValue, to_utc
from incremental_assets.engine.windows import Window

# Wall-clock bounds in a zone with daylight saving are widened by this much before they
# are pushed to the source; the exact filter runs after conversion to UTC.
_DST_MARGIN = timedelta(hours=3)


@dataclass(frozen=True)
class Range:
    column: str
    lower: WatermarkValue | None = None
    lower_inclusive: bool = False
    upper: WatermarkValue | None = None
    upper_inclusive: bool = False

    def admits(self, low: object, high: object) -> bool:
        """Whether values in [low, high] (a file's statistics) may fall in this range."""
        if low is None or high is None:
            return True
        below = self.lower is not None and (
            high < self.lower or (high == self.lower and not self.lower_inclusive)
        )
        above = self.upper is not None and (
            low > self.upper or (low == self.upper and not self.upper_inclusive)
        )
        return not (below or above)


Part = tuple[Range, ...]


def window_parts(window: Window, watermark: str, partition_column: str) -> list[Part]:
    parts: list[Part] = []
    if window.reads_incremental:
        parts.append((Range(watermark, window.lower, False, window.upper, True),))
    if window.backfill_range is not None:
        start, end = window.backfill_range
        parts.append(
            (
                Range(partition_column, start, True, end, False),
                Range(watermark, None, False, window.cursor_before, True),
            )
        )
    return parts


def probe_part(window: Window, watermark: str) -> Part:
    """Rows that can raise the high-water mark: above the cursor and below the cap."""
    lower = window.cursor_before if window.cursor_before is not None else window.lower
    return (Range(watermark, lower, False, window.cap, False),)


def to_filter(parts: list[Part]) -> Column:
    """Exact filter on normalized columns (timestamps as UTC instants)."""
    return _any([_all([_range_column(r, None, "UTC") for r in part]) for part in parts])


def to_source_filter(parts: list[Part], types: dict[str, DataType], zone: str) -> Column:
    """Filter on the source's raw columns, for push-down: zone-less timestamps are compared
    with wall-clock bounds in the source's zone (widened where that zone has DST). Ranges on
    columns the raw source lacks (they appear only after reshaping, e.g. inside a Debezium
    image) are left to the exact filter."""
    return _any(
        [
            _all([_range_column(r, types[r.column], zone) for r in part if r.column in types])
            for part in parts
        ]
    )


def to_source_ranges(parts: list[Part], types: dict[str, DataType], zone: str) -> list[Part]:
    """The same parts with bounds expressed in the source's raw value space."""
    return [tuple(_raw_range(r, types.get(r.column), zone) for r in part) for part in parts]


def _raw_range(r: Range, dtype: DataType | None, zone: str) -> Range:
    if not isinstance(dtype, TimestampNTZType):
        return r
    widen = timedelta(0) if zone == "UTC" else _DST_MARGIN
    return Range(
        r.column,
        _wall_clock(r.lower, zone) - widen if isinstance(r.lower, datetime) else r.lower,
        r.lower_inclusive or bool(widen),
        _wall_clock(r.upper, zone) + widen if isinstance(r.upper, datetime) else r.upper,
        r.upper_inclusive or bool(widen),
    )


def _wall_clock(value: datetime, zone: str) -> datetime:
    return to_utc(value).astimezone(ZoneInfo(zone)).replace(tzinfo=None)


def _range_column(r: Range, dtype: DataType | None, zone: str) -> Column:
    r = _raw_range(r, dtype, zone)
    column = F.col(quote(r.column))
    ntz = isinstance(dtype, TimestampNTZType)
    conditions = [column.isNotNull()]
    if r.lower is not None:
        bound = _literal(r.lower, ntz)
        conditions.append(column >= bound if r.lower_inclusive else column > bound)
    if r.upper is not None:
        bound = _literal(r.upper, ntz)
        conditions.append(column <= bound if r.upper_inclusive else column < bound)
    return _all(conditions)


def _literal(value: WatermarkValue, ntz: bool) -> Column:
    if isinstance(value, datetime):
        if ntz:
            naive = value.replace(tzinfo=None) if value.tzinfo else value
            return F.lit(naive.isoformat(sep=" ")).cast("timestamp_ntz")
        return F.lit(to_utc(value))
    return F.lit(value)


def _all(columns: list[Column]) -> Column:
    return reduce(lambda a, b: a & b, columns) if columns else F.lit(True)


def _any(columns: list[Column]) -> Column:
    return reduce(lambda a, b: a | b, columns) if columns else F.lit(False)
