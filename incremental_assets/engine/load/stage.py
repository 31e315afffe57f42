"""The extract and stage phase of a run: the window's rows, read, checked and reduced by
the strategy to a staged increment, and what the run learns from it before committing."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import quality
from incremental_assets.engine.delta_lake.store import DeltaTarget, TargetState, acting_rows_path
from incremental_assets.engine.gaps import Gaps, sequence_gaps
from incremental_assets.engine.guards import GuardReport
from incremental_assets.engine.sources import Source
from incremental_assets.engine.strategies import Strategy, strategy_for
from incremental_assets.engine.strategies.base import last_load_time
from incremental_assets.engine.strategies.rows import count_staged
from incremental_assets.engine.watermarks import from_transaction_version
from incremental_assets.engine.windows import Window
from incremental_assets.specs import TableSpec


def prepared_rows(spec: TableSpec, taken_at: datetime | None = None):
    """Raw source rows as the loader lands them: reshaped by the strategy, timestamps as UTC
    instants, keys and watermark first, the row hash, and soft-delete flags for CDC tables
    that keep deleted rows (added after the hash, so a replay hashes the same)."""
    return strategy_for(spec).prepared(taken_at)


def window_rows(spec: TableSpec, source: Source, window: Window) -> DataFrame:
    """The source rows of the window, prepared (a snapshot: every row, stamped)."""
    return strategy_for(spec).window_rows(source, window)


@dataclass(frozen=True)
class Extract:
    """A staged window: where its increment is, and what the run knows of it."""

    staged_path: str
    quarantined_path: str
    logged_path: str | None
    new_columns: list[str]
    rows_extracted: int
    rows_staged: int
    partition_high_water: datetime | None
    changes: dict[str, int]
    unchanged: int | None
    gaps: Gaps | None
    guard: GuardReport | None
    quality: quality.QualityReport | None
    rows_late: int = 0
    files_late: int = 0


def extract(
    spark: SparkSession,
    strategy: Strategy,
    source: Source,
    window: Window,
    state: TargetState,
    target: DeltaTarget,
    stage_root: str,
    run_id: str,
) -> Extract:
    """Stage the window's increment under ``stage_root`` and judge it (counts, gaps, the
    delete guard) before anything is written."""
    spec = strategy.spec
    staged_path = f"{stage_root}/increment"
    rows = strategy.window_rows(source, window)
    # Late files are few and new: counting their rows apart reads only them once more.
    rows_late, files_late = _late_counts(strategy, source, window)
    staged = strategy.stage(
        spark, rows, window, state, target, stage_root, run_id, remote=source.remote
    )
    observed = staged.observed
    rows_extracted = int(observed["rows"])
    quarantined_path = f"{stage_root}/quarantine"
    report = _quality_report(spec, observed, quarantined_path)
    partition_high_water = _later(
        last_load_time(state, "partition_high_water"),
        from_transaction_version(int(observed["pc_max"]), "timestamp")
        if observed["pc_max"] is not None
        else None,
    )
    rows_staged = count_staged(staged_path)
    change_counts = strategy.change_counts(staged_path)
    unchanged = strategy.unchanged(rows_extracted, change_counts, staged.logged_path)
    gaps = _gaps(spec, window, staged_path)
    guard = strategy.delete_guard(spark, state, target, rows_extracted, staged_path)
    return Extract(
        staged_path=staged_path,
        quarantined_path=quarantined_path,
        logged_path=staged.logged_path,
        new_columns=staged.new_columns,
        rows_extracted=rows_extracted,
        rows_staged=rows_staged,
        partition_high_water=partition_high_water,
        changes=change_counts,
        unchanged=unchanged,
        gaps=gaps,
        guard=guard,
        quality=report,
        rows_late=rows_late,
        files_late=files_late,
    )


def rows_by_partition(spec: TableSpec, staged_path: str) -> dict[str, int]:
    """The rows a committed run wrote, counted by partition key (``2026-01-02``, or
    ``2026-01-02-13:00`` for hourly tables) from the partition column: the rows its merge
    acted on (re-read rows that changed nothing are not counted), or all staged rows when
    it created the table. A run of an ``id`` watermark reads every row above its cursor,
    so it may load rows of later partitions (or, reading a late file, of earlier ones);
    this says which."""
    acting = acting_rows_path(staged_path)
    path = acting if os.path.isdir(acting) else staged_path
    if not os.path.isdir(path):
        return {}
    dataset = pads.dataset(path, format="parquet")
    column = spec.partition_column
    if column not in dataset.schema.names:
        return {}
    values = dataset.to_table(columns=[column]).column(0)
    if pa.types.is_date(values.type):
        values = values.cast(pa.timestamp("us"))
    if not pa.types.is_timestamp(values.type) or len(values) == 0:
        return {}
    pattern = "%Y-%m-%d" if spec.partitioning.granularity == "daily" else "%Y-%m-%d-%H:00"
    counts = pc.value_counts(pc.strftime(values, format=pattern))
    return {
        key: int(count)
        for key, count in zip(
            counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True
        )
        if key is not None
    }


def _quality_report(
    spec: TableSpec, observed: dict, quarantined_path: str
) -> quality.QualityReport | None:
    rules = spec.quality.rules
    if not rules:
        return None
    diverted = count_staged(quarantined_path) if os.path.isdir(quarantined_path) else 0
    return quality.report(rules, observed, diverted)


def _gaps(spec: TableSpec, window: Window, staged_path: str) -> Gaps | None:
    """Ids missing above the previous cursor, for 'sequence' watermarks."""
    if spec.watermark.kind != "sequence" or not window.reads_incremental:
        return None
    ids = pads.dataset(staged_path, format="parquet").to_table(columns=[spec.watermark.column])
    after = window.cursor_before if isinstance(window.cursor_before, int) else None
    return sequence_gaps(ids.column(0), after)


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    values = [v for v in (a, b) if v is not None]
    return max(values) if values else None


def _late_counts(strategy: Strategy, source: Source, window: Window) -> tuple[int, int]:
    """The late rows a run reads, and the files that hold them (of the files read for
    them, those with a row at or below the cursor)."""
    if not window.late_files:
        return 0, 0  # nor any file to read: a database source has none
    files = strategy.late_rows(source, window).select(F.input_file_name().alias("file"))
    found = files.agg(F.count(F.lit(1)).alias("rows"), F.count_distinct("file").alias("files"))
    found = found.first()
    return int(found["rows"]), int(found["files"])
