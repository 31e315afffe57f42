"""Per-partition reconciliation: source and target row counts for a range of partitions.

A time partition is a window of the table's partition column. For each partition in the
range, the source side counts what the target should hold for it, and the target side
what it does hold, each in one grouped Spark aggregation over the whole range:

- **source**: the source rows up to the table's cursor (rows above it are the next run's),
  shaped as a load shapes them, without rows a ``quarantine`` rule diverts, one row per key
  (its newest version, as the merge keeps it; a CDC key whose newest change is a hard
  delete is not counted), placed in the partition of that newest version;
- **target**: the target's rows by their partition column (files pruned by their min/max
  statistics first).

A partition whose counts differ holds rows the target lacks (late rows that arrived after
their window was loaded, beyond the lookback) or rows the source no longer has. A backfill
of that partition re-reads its whole window, which repairs the first kind. The second kind
it cannot repair when the strategy never sees a delete (``upsert``, ``append``): those
target rows whose key the source no longer holds at all are counted apart
(``gone_from_source``), and the report names the strategies that would capture them.

Snapshot tables (no past states), history tables (versions, not rows) and landing folders
(loaded by file) are refused: their partitions are not windows of source rows.

Example:
    >>> report = reconcile(spark, spec, target, start, end)  # doctest: +SKIP
    >>> [p.partition for p in report.differing]  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import predicates, quality, transforms
from incremental_assets.engine.changes import OP
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import IncrementalLoadError
from incremental_assets.engine.load import prepared_rows
from incremental_assets.engine.predicates import Range
from incremental_assets.engine.sources import open_source
from incremental_assets.engine.strategies.base import last_load_time
from incremental_assets.engine.watermarks import format_value, to_utc
from incremental_assets.specs import TableSpec
from incremental_assets.specs.strategies import CdcStrategy

# Partition keys as Dagster writes them for daily and hourly time partitions.
_LABELS = {"daily": ("%Y-%m-%d", "yyyy-MM-dd"), "hourly": ("%Y-%m-%d-%H:%M", "yyyy-MM-dd-HH:mm")}
_STEP = {"daily": timedelta(days=1), "hourly": timedelta(hours=1)}
_LABEL = "_ia_partition"


@dataclass(frozen=True)
class PartitionCount:
    partition: str
    source_rows: int
    target_rows: int
    # Target rows whose key the source no longer holds, for a strategy that cannot see
    # deletes: no backfill removes them.
    gone_from_source: int = 0

    @property
    def difference(self) -> int:
        """Source rows minus target rows (positive: the target lacks rows)."""
        return self.source_rows - self.target_rows

    @property
    def repairable(self) -> int:
        """The difference a backfill of the partition would repair: all of it, less the
        rows gone from the source."""
        return self.difference + self.gone_from_source


@dataclass(frozen=True)
class Reconciliation:
    table: str
    column: str
    cursor: str
    partitions: list[PartitionCount] = field(default_factory=list)

    strategy: str = ""

    @property
    def differing(self) -> list[PartitionCount]:
        return [p for p in self.partitions if p.difference]

    @property
    def repairable(self) -> list[PartitionCount]:
        """Partitions a backfill would change."""
        return [p for p in self.partitions if p.repairable]

    @property
    def unrepairable(self) -> list[PartitionCount]:
        """Partitions holding rows gone from the source, which no backfill removes."""
        return [p for p in self.partitions if p.gone_from_source]

    def unrepairable_note(self) -> str | None:
        """What the rows gone from the source are, and what would capture them."""
        gone = self.unrepairable
        if not gone:
            return None
        rows = sum(p.gone_from_source for p in gone)
        listed = ", ".join(p.partition for p in gone)
        return (
            f"{rows} target rows in {len(gone)} partitions ({listed}) "
            f"have keys the source no longer holds (deleted there). A {self.strategy} table "
            "never sees a delete, so no backfill removes them; strategy cdc (a change feed "
            "with deletes) or snapshot (a diff of the whole source) would capture them."
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "partition_column": self.column,
            "watermark": self.cursor,
            "partitions": [
                {
                    "partition": p.partition,
                    "source_rows": p.source_rows,
                    "target_rows": p.target_rows,
                    "difference": p.difference,
                    "gone_from_source": p.gone_from_source,
                    "repairable": p.repairable,
                }
                for p in self.partitions
            ],
            "differing": [p.partition for p in self.differing],
            "repairable": [p.partition for p in self.repairable],
            "unrepairable": [p.partition for p in self.unrepairable],
            "unrepairable_note": self.unrepairable_note(),
        }


def reconcile(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    start: datetime,
    end: datetime,
    *,
    source_storage: Mapping[str, str] | None = None,
    count_gone: bool = True,
) -> Reconciliation:
    """Source and target row counts of each partition in ``[start, end)``. With
    ``count_gone=False`` the rows gone from the source are not counted, which spares a read
    of every source key (the cost then follows the range).

    Raises:
        IncrementalLoadError: the table's partitions are not windows of source rows
            (snapshot, scd2 and landing tables), or its source cannot be read.
    """
    refuse_unless_windows(spec)
    start, end = to_utc(start), to_utc(end)
    granularity = spec.partitioning.granularity
    state = target.state(spec.watermark.kind)
    labels = _labels(start, end, granularity)
    in_range = (Range(spec.partition_column, start, True, end, False),)
    source = _source_rows(spark, spec, state.cursor, start, source_storage, state.row_hash)
    source_counts = _counts(source.filter(predicates.to_filter([in_range])), spec)
    target_counts, gone = {}, {}
    if state.exists:
        held = _target_rows(spark, target, in_range)
        target_counts = _counts(held, spec)
        if count_gone and not sees_deletes(spec):
            keys = _source_keys(spark, spec, state.cursor, source_storage)
            gone = _counts(held.join(keys, list(spec.keys), "left_anti"), spec)
    return Reconciliation(
        table=spec.name,
        column=spec.partition_column,
        cursor=format_value(state.cursor) if state.cursor is not None else "-",
        partitions=[
            PartitionCount(
                label, source_counts.get(label, 0), target_counts.get(label, 0), gone.get(label, 0)
            )
            for label in labels
        ],
        strategy=spec.strategy.kind,
    )


def recent_partitions(
    spec: TableSpec, target: DeltaTarget, count: int
) -> tuple[datetime, datetime] | None:
    """The last ``count`` partitions the table's loads have reached (by the partition
    column's highest loaded value), as ``[start, end)``; None before any load."""
    state = target.state(spec.watermark.kind)
    reached = last_load_time(state, "partition_high_water")
    cursor = state.cursor[0] if isinstance(state.cursor, tuple) else state.cursor
    if reached is None and isinstance(cursor, datetime):
        reached = cursor
    if reached is None:
        return None
    reached = to_utc(reached)
    if spec.partitioning.granularity == "daily":
        step, floor = timedelta(days=1), reached.replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        step, floor = timedelta(hours=1), reached.replace(minute=0, second=0, microsecond=0)
    end = floor + step
    return end - count * step, end


def sees_deletes(spec: TableSpec) -> bool:
    """Whether the table's runs can remove a row the source deleted (a CDC feed carries
    the delete; an upsert or append reads only rows that exist)."""
    return isinstance(spec.strategy, CdcStrategy)


def refuse_unless_windows(spec: TableSpec) -> None:
    """Raise, saying why and what to do instead, unless the table's partitions are windows
    of source rows (checked before any Spark work)."""
    if spec.landing is not None:
        why = "a landing table loads each file once, by path and version, not by window"
        fix = "incremental-assets explain TABLE lists the files the next run would load"
    elif spec.takes_snapshots:
        why = "a snapshot table holds its source's current state; past partitions cannot be "
        why += "re-read from the source"
        fix = "materialize the latest partition, which diffs the whole source"
    elif spec.history:
        why = "a history (scd2) table holds versions of keys, not one row per source row"
        fix = "check it with its history_consistent and keys_unique asset checks"
    else:
        return
    raise IncrementalLoadError(spec.name, f"cannot reconcile by partition: {why}.", fix)


def _labels(start: datetime, end: datetime, granularity: str) -> list[str]:
    fmt, step = _LABELS[granularity][0], _STEP[granularity]
    labels, at = [], start
    while at < end:
        labels.append(at.strftime(fmt))
        at += step
    return labels


def _label(spec: TableSpec) -> Column:
    granularity = spec.partitioning.granularity
    unit = "day" if granularity == "daily" else "hour"
    column = F.col(transforms.quote(spec.partition_column))
    return F.date_format(F.date_trunc(unit, column), _LABELS[granularity][1])


def _counts(rows: DataFrame, spec: TableSpec) -> dict[str, int]:
    grouped = rows.groupBy(_label(spec).alias(_LABEL)).count().collect()
    return {r[_LABEL]: int(r["count"]) for r in grouped}


def _source_rows(
    spark: SparkSession,
    spec: TableSpec,
    cursor: object,
    start: datetime,
    source_storage: Mapping[str, str] | None,
    row_hash: int,
) -> DataFrame:
    """One row per key as the target should hold it, for keys whose newest version (up to
    the cursor) lies at or after ``start`` (ties of the watermark broken by the target's
    row hash, ``row_hash``)."""
    source = open_source(spark, spec.name, spec.source, dict(source_storage or {}))
    wm = spec.watermark
    ranges = []
    if spec.partitions_cut_watermark:
        # A key's newest version is at least as new as any of its versions in the range,
        # so versions before it cannot be the newest of a key counted in the range.
        ranges.append(Range(spec.partition_column, start, True))
    if cursor is not None:
        ranges.append(Range(wm.column, None, False, cursor, True, wm.tiebreak))  # type: ignore[arg-type]
    parts = [tuple(ranges)]
    types = {f.name: f.dataType for f in source.schema.fields}
    zone = spec.source.timezone
    rows = (
        source.read(predicates.to_source_ranges(parts, types, zone))
        .filter(predicates.to_source_filter(parts, types, zone))
        .transform(prepared_rows(spec, row_hash=row_hash))
        .filter(predicates.to_filter(parts))
    )
    rules = spec.quality.rules
    if any(r.action == "quarantine" for r in rules):
        checked = quality.failed_rules(spec.name, rows, rules)
        rows = checked.filter(~quality.diverted(rules)).drop(quality.FAILED)
    newest = rows.transform(transforms.newest_per_key(spec.keys, wm.column))
    strategy = spec.strategy
    if isinstance(strategy, CdcStrategy) and strategy.deletes == "hard":
        newest = newest.filter(F.col(OP) != "D")
    return newest


def _source_keys(
    spark: SparkSession, spec: TableSpec, cursor: object, source_storage: Mapping[str, str] | None
) -> DataFrame:
    """Every key the source holds up to the cursor, whatever its rows' partitions (one
    pass over the key and watermark columns)."""
    source = open_source(spark, spec.name, spec.source, dict(source_storage or {}))
    wm = spec.watermark
    parts = [(Range(wm.column, None, False, cursor, True, wm.tiebreak),)] if cursor else [()]
    types = {f.name: f.dataType for f in source.schema.fields}
    zone = spec.source.timezone
    rows = (
        source.read(predicates.to_source_ranges(parts, types, zone))
        .filter(predicates.to_source_filter(parts, types, zone))
        .transform(prepared_rows(spec))
        .filter(predicates.to_filter(parts))
    )
    return rows.select(*[F.col(transforms.quote(k)) for k in spec.keys]).distinct()


def _target_rows(spark: SparkSession, target: DeltaTarget, in_range: tuple[Range]) -> DataFrame:
    """The target's rows in the range (files pruned by their statistics first)."""
    table = target.open()
    files = delta_io.prune_files(delta_io.live_files(table), [in_range])
    return delta_io.read_files(spark, table, files).filter(predicates.to_filter([in_range]))
