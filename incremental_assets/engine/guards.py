"""What a run refuses or reports before it writes: deletes beyond a share of the target
(a vanished source), and source rows whose watermark no window can reach.

A nightly export that failed half-way, a source table truncated by mistake, or a CDC feed
replayed from a wrong offset all look, to a loader, like a lot of deletes. A snapshot
strategy turns an empty export into "every row vanished"; a CDC batch of deletes removes
what it names. Before anything is written (side tables included), a run that would delete
more than ``strategy.max_delete_share`` of the target's live rows, or a snapshot that is
empty while the target is not (unless ``strategy.allow_empty``), fails with the numbers
and the setting that allows it.

Example:
    >>> guard = DeleteGuard(limit=0.5, allow_empty=False)
    >>> guard.judge("orders", rows_in_batch=10, deleting=2, live_rows=100).share
    0.02
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import NamedTuple

from pyspark.sql import functions as F

from incremental_assets.engine import predicates
from incremental_assets.engine.errors import DeleteGuardError
from incremental_assets.engine.predicates import Part, Range
from incremental_assets.engine.sources import Source
from incremental_assets.engine.spark.aggregates import aggregated
from incremental_assets.engine.transforms import quote, to_utc_instants
from incremental_assets.engine.watermarks import (
    WatermarkKind,
    WatermarkValue,
    from_transaction_version,
)

# How a guard's live rows were counted (``GuardReport.live_rows_from``).
FROM_STATISTICS, FROM_SPARK = "statistics", "spark"


@dataclass(frozen=True)
class GuardReport:
    """What the guard saw: rows the run deletes, the target's live rows before it, the
    share and the limit."""

    deleting: int
    live_rows: int
    limit: float
    empty_snapshot: bool = False
    # How the live rows were counted: ``FROM_STATISTICS`` (the Delta log's) or
    # ``FROM_SPARK`` (a scan: soft deletes the statistics cannot tell apart); None: not
    # counted (a soft-delete run that deletes nothing, its rows soft-deleted or not).
    live_rows_from: str | None = None

    @property
    def share(self) -> float:
        return round(self.deleting / self.live_rows, 6) if self.live_rows else 0.0

    def metadata(self) -> dict[str, float | int]:
        return {
            "rows_deleting": self.deleting,
            "delete_share": self.share,
            "max_delete_share": self.limit,
            **(
                {"live_rows": self.live_rows, "live_rows_from": self.live_rows_from}
                if self.live_rows_from
                else {}
            ),
        }


@dataclass(frozen=True)
class DeleteGuard:
    """The table's guard settings (``strategy.max_delete_share``, ``allow_empty``); the
    empty-snapshot rule applies to snapshot sources only (``allow_empty`` None)."""

    limit: float
    allow_empty: bool | None = None

    def judge(
        self,
        table: str,
        rows_in_batch: int,
        deleting: int,
        live_rows: int,
        live_rows_from: str | None = FROM_STATISTICS,
    ) -> GuardReport:
        """The report for a run, or DeleteGuardError when the run must not write."""
        empty = self.allow_empty is not None and rows_in_batch == 0 and live_rows > 0
        report = GuardReport(
            deleting, live_rows, self.limit, empty_snapshot=empty, live_rows_from=live_rows_from
        )
        if empty and not self.allow_empty:
            raise DeleteGuardError(
                table,
                f"the snapshot is empty (0 rows) while the target holds {live_rows} live rows: "
                "loading it would delete every row. Nothing was written.",
                "check the source (a failed or truncated export looks like this); if the "
                "source really is empty now, set strategy.allow_empty: true for one run",
                report,
            )
        if live_rows and report.share > self.limit:
            raise DeleteGuardError(
                table,
                f"this run would delete {deleting} of the target's {live_rows} live rows "
                f"({report.share:.1%}), more than strategy.max_delete_share "
                f"({self.limit:.0%}). Nothing was written.",
                "check the source for a failed or partial export (or a feed replayed from the "
                "wrong place); if the deletes are real, raise strategy.max_delete_share (1.0 "
                "turns the guard off) for this run",
                report,
            )
        return report


# Rows this far ahead of the source clock are reported: a few seconds or minutes ahead is
# clock skew between systems and loads on a later run; a day ahead is a bad value (9999-12-31).
FUTURE_TOLERANCE = timedelta(days=1)


@dataclass(frozen=True)
class OutOfRange:
    """Source rows a time watermark can never bring into a window: before the table's
    ``partitioning.start`` (the first load starts there) or stamped more than
    ``FUTURE_TOLERANCE`` ahead of the source clock."""

    before_start: int
    in_future: int
    start: datetime
    earliest: datetime | None = None
    latest: datetime | None = None

    @property
    def total(self) -> int:
        return self.before_start + self.in_future

    def metadata(self) -> dict[str, int | str]:
        return {
            "rows_before_start": self.before_start,
            "rows_in_future": self.in_future,
            **({"earliest_before_start": self.earliest.isoformat()} if self.earliest else {}),
            **({"latest_in_future": self.latest.isoformat()} if self.latest else {}),
        }

    def describe(self) -> str:
        if not self.total:
            return (
                f"every source watermark lies between partitioning.start "
                f"({self.start.date().isoformat()}) and a day past the source clock"
            )
        parts = []
        if self.before_start:
            earliest = self.earliest.date().isoformat() if self.earliest else "?"
            parts.append(
                f"{self.before_start} rows have a watermark before partitioning.start "
                f"({self.start.date().isoformat()}; earliest {earliest}) and are never "
                f"loaded: move partitioning.start to {earliest} or earlier, or correct them"
            )
        if self.in_future:
            latest = self.latest.isoformat() if self.latest else "?"
            parts.append(
                f"{self.in_future} rows have a watermark more than a day ahead of the source "
                f"clock (latest {latest}) and wait until then: correct them in the source"
            )
        return "; ".join(parts)


def out_of_range(
    source: Source, column: str, start: datetime, clock: datetime, zone: str
) -> OutOfRange | None:
    """Count the source rows whose ``column`` (a time watermark) lies before ``start`` or
    beyond ``clock + FUTURE_TOLERANCE``. One filtered aggregation: Delta files and Parquet
    row groups whose statistics hold no such value are skipped, a database counts in its
    WHERE. None when the column is not a top-level source column (e.g. inside a Debezium
    image)."""
    return _scan(source, column, zone, (start, clock)).outside


class Probed(NamedTuple):
    """What the probe found (``probe_source``), by a scan of the source or from its
    statistics: the rows no window reaches, the high-water mark of the probe part and the
    rows whose watermark (and a hybrid watermark's tie-break) is null, as the scan counted
    them or the source's statistics knew them (None: a database source, which counts them
    in a query of its own, ``Source.count_nulls``, or no tie-break asked for)."""

    outside: OutOfRange | None
    high_water: WatermarkValue | None
    nulls: int | None = None
    tiebreak_nulls: int | None = None


def probe_source(
    source: Source,
    column: str,
    zone: str,
    in_range: tuple[datetime, datetime] | None,
    high_water: tuple[Part, WatermarkKind] | None,
    tiebreak: str | None = None,
) -> Probed:
    """What a run's probe asks of the source about its watermark ``column``: from the
    source's statistics where they answer (a Delta log's; no Spark job), else in one
    filtered aggregation where there were up to three Spark jobs, each of which planned
    the source (its files, their statistics) anew:

    - with ``in_range`` (the table's ``partitioning.start`` and the source clock, time
      watermarks): the rows out of range, as ``out_of_range``; none, with no scan, where
      the source's statistics put every row in range (``Source.holds_none``);
    - with ``high_water`` (a probe part without a tie-break, and the watermark's kind):
      the part's high-water mark, as ``Source.high_water``; where the source's statistics
      state it (``stated_high_water``: a Delta table read by its path) and no other
      question needs a scan, that value, with no Spark job;
    - where only a scan can count them (a folder of files; a Delta source whose log
      statistics do not count live rows: ``Source.known_nulls``), the rows whose
      ``column`` is null: the scan takes them too (Parquet row groups without a null are
      skipped, as ``count_nulls`` skips them); where the source knows them without a scan
      (a Delta log's exact statistics), that count, read once. A database source
      (``remote``) leaves ``Probed.nulls`` None and counts them in its own query
      (``Source.count_nulls``). With ``tiebreak`` (a hybrid watermark's id column), the
      rows whose tie-break is null, the same way (``Probed.tiebreak_nulls``).

    The scan reads the rows of each part only: the same files as the high-water mark
    alone when no row is out of range; for the high-water mark, where the source's
    statistics bound its highest value, the rows at or above that bound (``narrowed``).
    A database answers each in a query of its own (a COUNT and a MAX in its WHERE),
    cheaper than one scan that would fetch rows into Spark.
    """
    if source.remote or column not in source.schema.fieldNames():
        outside = None if in_range is None else out_of_range(source, column, *in_range, zone)
        high = None if high_water is None else source.high_water(*high_water)
        return Probed(outside, high)
    known = source.known_nulls(column)
    ties = None if tiebreak not in source.schema.fieldNames() else tiebreak
    known_ties = None if ties is None else source.known_nulls(ties)
    to_count = ties if ties is not None and known_ties is None else None
    stated_outside = None
    if in_range is not None and source.holds_none(_outside_parts(column, *in_range), zone):
        # The statistics put every row in range: no scan needs to count any outside it.
        stated_outside, in_range = OutOfRange(0, 0, in_range[0]), None
    if in_range is None and known is not None and to_count is None:
        # Nothing a scan alone can tell: the statistics may state the high-water mark too.
        stated = None if high_water is None else stated_high_water(source, *high_water)
        if high_water is None or stated is not _UNSTATED:
            return Probed(stated_outside, stated, known, known_ties)
    whole = high_water
    if high_water is not None:
        high_water = (narrowed(source, high_water[0]), high_water[1])
    probed = _scan(source, column, zone, in_range, high_water, known is None, to_count)
    if whole is not None and high_water != whole and probed.high_water is None:
        # Cut (the part began below the bound), so the part holds the source's highest
        # row, which the statistics put at or above their bound, and the scan found none
        # there: they do not describe the rows Spark reads (a catalog table's row filter,
        # bounds looser than the protocol's tight ones). The whole part decides.
        warnings.warn(
            f"{source.describe()}: the log's maximum statistics of '{column}' hold no row "
            "Spark reads; its high-water mark came from a scan of every file above the "
            "cursor",
            stacklevel=2,
        )
        probed = probed._replace(high_water=_scan(source, column, zone, None, whole).high_water)
    if known is not None:
        probed = probed._replace(nulls=known)
    if stated_outside is not None:
        probed = probed._replace(outside=stated_outside)
    return probed if known_ties is None else probed._replace(tiebreak_nulls=known_ties)


_UNSTATED = object()


def stated_high_water(source: Source, part: Part, kind: WatermarkKind) -> object:
    """The high-water mark of the probe ``part`` (one range on the watermark column) as
    the source's statistics state it (``Source.stated_highest``), with no scan: that value
    where the part holds it, None where it lies at or below the part's lower bound (no
    row is new). ``_UNSTATED`` where only a scan can tell: no stated value, a tie-break,
    or a value at or above the part's upper bound (the window's cap; the highest row
    below it is the mark)."""
    if len(part) != 1 or part[0].tiebreak is not None or kind == "hybrid":
        return _UNSTATED
    (probe,) = part
    top = source.stated_highest(probe.column)
    if top is None or isinstance(top, datetime) != (kind == "timestamp"):
        return _UNSTATED
    try:
        if probe.upper is not None and (
            top > probe.upper or (top == probe.upper and not probe.upper_inclusive)
        ):
            return _UNSTATED
        if probe.lower is not None and (
            top < probe.lower or (top == probe.lower and not probe.lower_inclusive)
        ):
            return None
    except TypeError:
        return _UNSTATED  # statistics of another type than the bounds
    return top


def narrowed(source: Source, part: Part) -> Part:
    """The probe ``part`` (one range on the watermark column) cut to the rows at or above
    the lowest value the source's highest can be (``Source.highest_bounds``: a Delta log's
    maximum statistics), so the scan for its high-water mark reads the files and row
    groups that may hold that value, not all the part's (a reload's probe read every file
    of the source). The same mark: when the part holds a row, it holds the source's
    highest, which lies in those bounds. Kept whole where that does not hold: an upper
    bound (the window's cap) not above the bounds, or a tie-break. Statistics that hold
    no row Spark reads are caught by ``probe_source``, which scans the whole part then."""
    if len(part) != 1 or part[0].tiebreak is not None:
        return part
    (probe,) = part
    bounds = source.highest_bounds(probe.column)
    if bounds is None:
        return part
    low, high = bounds
    try:
        if probe.upper is not None and not probe.upper > high:
            return part
        if probe.lower is not None and probe.lower >= low:
            return part  # the part begins above the bound: nothing to cut
    except TypeError:
        return part  # statistics of another type than the bound
    return (*part, Range(probe.column, low, True))


def _scan(
    source: Source,
    column: str,
    zone: str,
    in_range: tuple[datetime, datetime] | None,
    high_water: tuple[Part, WatermarkKind] | None = None,
    nulls: bool = False,
    tiebreak: str | None = None,
) -> Probed:
    """One aggregation over the source's rows: with ``in_range`` (the table's start and the
    source clock) the rows outside it, with ``high_water`` the highest value in its part,
    with ``nulls`` the rows whose ``column`` is null, with ``tiebreak`` the rows whose
    ``tiebreak`` is null."""
    types = {f.name: f.dataType for f in source.schema.fields}
    if column not in types:
        return Probed(None, None)
    parts: list[Part] = []
    if in_range is not None:
        start, clock = in_range
        horizon = clock + FUTURE_TOLERANCE
        parts += _outside_parts(column, start, clock)
    if high_water is not None:
        parts.append(high_water[0])
    value = F.col(quote(column))
    source_filter = predicates.to_source_filter(parts, types, zone)
    row_filter = predicates.to_filter(parts)
    if nulls:
        # A null watermark lies in no part: its rows are taken as well, to be counted.
        source_filter, row_filter = source_filter | value.isNull(), row_filter | value.isNull()
    ties = None if tiebreak is None else F.col(quote(tiebreak))
    if ties is not None:
        # So does a null tie-break, wherever its row lies.
        source_filter, row_filter = source_filter | ties.isNull(), row_filter | ties.isNull()
    rows = (
        source.read(predicates.to_source_ranges(parts, types, zone))
        .select(value, *([] if ties is None else [ties]))
        .filter(source_filter)
        .transform(to_utc_instants(zone))
        .filter(row_filter)
    )
    aggregates = []
    if in_range is not None:
        early, late = value < predicates.instant(start), value > predicates.instant(horizon)
        aggregates += [
            F.sum(early.cast("int")).alias("before"),
            F.sum(late.cast("int")).alias("after"),
            F.min(F.when(early, F.unix_micros(value))).alias("earliest"),
            F.max(F.when(late, F.unix_micros(value))).alias("latest"),
        ]
    if high_water is not None:
        part, kind = high_water
        # As Source.high_water: microseconds for times (PySpark would turn timestamps into
        # naive local values), the value itself otherwise.
        mark = F.unix_micros(value) if kind in ("timestamp", "hybrid") else value
        in_part = predicates.to_filter([part])
        aggregates.append(F.max(F.when(in_part, mark)).alias("hw"))
    if nulls:
        aggregates.append(F.sum(value.isNull().cast("int")).alias("nulls"))
    if ties is not None:
        aggregates.append(F.sum(ties.isNull().cast("int")).alias("ties"))
    found = aggregated(rows, *aggregates, one_job=not source.reads_deletion_vectors)
    outside = None
    if in_range is not None:
        outside = OutOfRange(
            int(found["before"] or 0),
            int(found["after"] or 0),
            in_range[0],
            _instant(found["earliest"]),
            _instant(found["latest"]),
        )
    counted = int(found["nulls"] or 0) if nulls else None
    ties_counted = None if ties is None else int(found["ties"] or 0)
    high = None
    if high_water is not None and found["hw"] is not None:
        high = from_transaction_version(int(found["hw"]), high_water[1])
    return Probed(outside, high, counted, ties_counted)


def _outside_parts(column: str, start: datetime, clock: datetime) -> list[Part]:
    """The rows of a time watermark ``column`` before ``start`` or more than
    ``FUTURE_TOLERANCE`` after ``clock``."""
    horizon = clock + FUTURE_TOLERANCE
    return [(Range(column, None, False, start, False),), (Range(column, horizon, False),)]


def _instant(micros: int | None) -> datetime | None:
    if micros is None:
        return None
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=int(micros))
