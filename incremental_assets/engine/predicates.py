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
    tiebreak: str | None = None  # with (time, id) bounds: the id column, compared second

    def admits(self, low: object, high: object) -> bool:
        """Whether values in [low, high] (a file's statistics) may fall in this range. A
        (time, id) bound is judged by its time alone, inclusively."""
        if low is None or high is None:
            return True
        lower, lower_inclusive = _leading(self.lower, self.lower_inclusive)
        upper, upper_inclusive = _leading(self.upper, self.upper_inclusive)
        below = lower is not None and (high < lower or (high == lower and not lower_inclusive))
        above = upper is not None and (low > upper or (low == upper and not upper_inclusive))
        return not (below or above)


def _leading(bound: WatermarkValue | None, inclusive: bool) -> tuple[object, bool]:
    if isinstance(bound, tuple):
        return bound[0], True
    return bound, inclusive


Part = tuple[Range, ...]


def window_parts(
    window: Window, watermark: str, partition_column: str, tiebreak: str | None = None
) -> list[Part]:
    parts: list[Part] = []
    if window.reads_incremental:
        parts.append((Range(watermark, window.lower, False, window.upper, True, tiebreak),))
    if window.backfill_range is not None:
        start, end = window.backfill_range
        parts.append(
            (
                Range(partition_column, start, True, end, False),
                Range(watermark, None, False, window.cursor_before, True, tiebreak),
            )
        )
    return parts


def probe_part(window: Window, watermark: str, tiebreak: str | None = None) -> Part:
    """Rows that can raise the high-water mark: above the cursor and below the cap."""
    lower = window.cursor_before if window.cursor_before is not None else window.lower
    return (Range(watermark, lower, False, window.cap, False, tiebreak),)


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
    if widen and r.tiebreak:
        # Widened bounds are approximate anyway: keep the time part, inclusively.
        lower, _ = _leading(r.lower, r.lower_inclusive)
        upper, _ = _leading(r.upper, r.upper_inclusive)
        r = Range(r.column, lower, True, upper, True)
    return Range(
        r.column,
        _local(r.lower, zone, -widen),
        r.lower_inclusive or bool(widen),
        _local(r.upper, zone, widen),
        r.upper_inclusive or bool(widen),
        r.tiebreak,
    )


def _local(bound: WatermarkValue | None, zone: str, shift: timedelta) -> WatermarkValue | None:
    if isinstance(bound, tuple):
        return (_wall_clock(bound[0], zone) + shift, bound[1])
    if isinstance(bound, datetime):
        return _wall_clock(bound, zone) + shift
    return bound


def _wall_clock(value: datetime, zone: str) -> datetime:
    return to_utc(value).astimezone(ZoneInfo(zone)).replace(tzinfo=None)


def _range_column(r: Range, dtype: DataType | None, zone: str) -> Column:
    r = _raw_range(r, dtype, zone)
    column = F.col(quote(r.column))
    ntz = isinstance(dtype, TimestampNTZType)
    conditions = [column.isNotNull()]
    tiebreak = F.col(quote(r.tiebreak)) if r.tiebreak else None
    for bound, inclusive, above in (
        (r.lower, r.lower_inclusive, True),
        (r.upper, r.upper_inclusive, False),
    ):
        if bound is None:
            continue
        if isinstance(bound, tuple):
            # (time, id) order: past the instant, or at it and past the id.
            assert tiebreak is not None
            time, ident = _literal(bound[0], ntz), F.lit(bound[1])
            beyond = column > time if above else column < time
            at_id = tiebreak >= ident if inclusive else tiebreak > ident
            if not above:
                at_id = tiebreak <= ident if inclusive else tiebreak < ident
            conditions.append(beyond | ((column == time) & at_id))
        else:
            literal = _literal(bound, ntz)
            if above:
                conditions.append(column >= literal if inclusive else column > literal)
            else:
                conditions.append(column <= literal if inclusive else column < literal)
    return _all(conditions)


def _literal(value: WatermarkValue, ntz: bool) -> Column:
    if isinstance(value, datetime):
        if ntz:
            naive = value.replace(tzinfo=None) if value.tzinfo else value
            return F.lit(naive.isoformat(sep=" ")).cast("timestamp_ntz")
        return instant(value)
    return F.lit(value)


def instant(value: datetime) -> Column:
    """The instant ``value`` (naive: UTC) as a Spark timestamp literal, given as text with
    its zone offset and cast: ``F.lit`` of a ``datetime`` asks a Spark Connect server for
    the session's preferred timestamp type first, a round trip for each literal. Spark
    folds the cast before it plans the scan, so files and row groups are skipped as with a
    typed literal."""
    return F.lit(to_utc(value).isoformat(sep=" ")).cast("timestamp")


def _all(columns: list[Column]) -> Column:
    return reduce(lambda a, b: a & b, columns) if columns else F.lit(True)


def _any(columns: list[Column]) -> Column:
    return reduce(lambda a, b: a | b, columns) if columns else F.lit(False)
