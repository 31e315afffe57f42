"""One incremental load: probe -> window -> extract -> validate -> stage -> commit.

Example:
    >>> result = run_load(spark, spec, DeltaTarget(spec.name, path), request)  # doctest: +SKIP
    >>> result.rows_inserted, result.cursor_after  # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow.dataset as pads
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from incremental_assets.engine import (
    changes,
    delta_io,
    history,
    predicates,
    quality,
    staging,
    transforms,
    validation,
)
from incremental_assets.engine.delta_store import (
    ChangeLog,
    CommitResult,
    DeltaTarget,
    TargetState,
    Tombstones,
    row_count,
)
from incremental_assets.engine.errors import IncrementalLoadError, NullValuesError
from incremental_assets.engine.faults import crash_point
from incremental_assets.engine.gaps import Gaps, sequence_gaps
from incremental_assets.engine.guards import DeleteGuard, GuardReport, OutOfRange, out_of_range
from incremental_assets.engine.quarantine import Quarantine, identity_of
from incremental_assets.engine.snapshots import CHANGE, snapshot_changes
from incremental_assets.engine.sources import Source, open_source
from incremental_assets.engine.strategies import MergePlan, merge_plan
from incremental_assets.engine.unreadable import naming_source_files
from incremental_assets.engine.watermarks import (
    WatermarkValue,
    format_value,
    from_transaction_version,
    lag_seconds,
    parse_value,
)
from incremental_assets.engine.windows import (
    LoadRequest,
    Window,
    WindowPolicy,
    plan_window,
    snapshot_window,
)
from incremental_assets.specs import TableSpec
from incremental_assets.specs.models import SNAPSHOT_AT
from incremental_assets.specs.strategies import CdcStrategy, SnapshotStrategy

Hook = Callable[[str], None]


@dataclass(frozen=True)
class LoadResult:
    """What a run did, for metadata and checks. Counts come from the write itself."""

    table: str
    mode: str
    window: str
    cursor_before: WatermarkValue | None
    cursor_after: WatermarkValue | None
    high_water: WatermarkValue | None
    rows_extracted: int
    rows_staged: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    committed: bool
    delta_version: int | None
    lag_seconds: float | None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    files_added: int = 0
    files_removed: int = 0
    new_columns: tuple[str, ...] = ()
    source: str = ""
    gaps: Gaps | None = None
    # Snapshot and history tables: staged change rows by kind (insert/change/vanish, or
    # open/close/update/remove versions) and the rows that needed no write.
    changes: dict[str, int] = field(default_factory=dict)
    unchanged: int | None = None
    quality: quality.QualityReport | None = None
    # Landing tables: the files seen, loaded, waiting and quarantined (landing.LandingReport).
    landing: object | None = None
    # Snapshot and CDC tables: the deletes this run makes against the guard's limit.
    guard: GuardReport | None = None
    # Time watermarks: source rows no window can reach (before the start, far in the future).
    out_of_range: OutOfRange | None = None

    @property
    def rows_unchanged(self) -> int:
        if self.unchanged is not None:
            return self.unchanged
        # Staged rows the merge did not write (a CDC delete is staged and deletes a row).
        return self.rows_staged - self.rows_inserted - self.rows_updated - self.rows_deleted

    @property
    def duplicates_in_batch(self) -> int:
        """Extracted rows superseded by a newer row of their key in the same batch (or by a
        tombstone); quarantined rows are counted apart."""
        if self.unchanged is not None:
            return 0
        quarantined = self.quality.rows_quarantined if self.quality else 0
        return self.rows_extracted - self.rows_staged - quarantined


class _Phases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 3)


def window_policy(spec: TableSpec) -> WindowPolicy:
    return WindowPolicy(
        kind=spec.watermark.kind,
        lookback=spec.watermark.lookback,
        settle_lag=spec.watermark.settle_lag,
        partitions_cut_watermark=spec.partitions_cut_watermark,
        history_start=spec.partitioning.start,
    )


@dataclass(frozen=True)
class Probe:
    """What a run knows before it reads a row: the opened source, the target's committed
    state, the source's clock, and the window with the high-water mark captured."""

    source: Source
    state: TargetState
    clock: datetime
    window: Window
    out_of_range: OutOfRange | None = None


def probe(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    request: LoadRequest,
    source_storage: Mapping[str, str] | None = None,
) -> Probe:
    """The probe phase of a run, which writes nothing (``explain`` stops after it): open
    the source, check its columns, read the cursor from the target's Delta log, plan the
    window and capture the source's high-water mark."""
    source = open_source(spark, spec.name, spec.source, dict(source_storage or {}))
    validation.check_source_columns(spec, source.read([]).transform(_shape(spec)).schema)
    state = target.state(spec.watermark.kind)
    clock = source.clock()
    if spec.takes_snapshots:
        last_end = _last_load_time(state, "partition_end")
        window = snapshot_window(spec.name, state.cursor, request, clock, last_end)
    else:
        window = plan_window(
            window_policy(spec),
            state.cursor,
            request,
            clock,
            partition_high_water=_last_load_time(state, "partition_high_water"),
        )
        _fail_on_null_watermarks(spec, source)
        window = window.with_high_water(_high_water(spec, source, window))
    return Probe(source, state, clock, window, _out_of_range(spec, source, clock))


def _out_of_range(spec: TableSpec, source: Source, clock: datetime) -> OutOfRange | None:
    if not spec.watermark.is_time or spec.takes_snapshots:
        return None
    zone = spec.source.timezone
    return out_of_range(source, spec.watermark.column, spec.partitioning.start, clock, zone)


def run_load(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    request: LoadRequest,
    *,
    source_storage: Mapping[str, str] | None = None,
    staging_dir: str | None = None,
    hook: Hook | None = None,
) -> LoadResult:
    """Load one window of ``spec``'s source into ``target``, exactly once.

    ``hook`` is called with a phase name (``probed``, ``staged``, ``committed``) as the run
    passes it; tests use it to change the source mid-run.

    Raises:
        IncrementalLoadError: bad source, schema or rows; nothing is committed.
    """
    if spec.landing is not None:
        # A landing folder is loaded by file, not by watermark window (engine/landing.py).
        from incremental_assets.engine.landing import run_landing_load

        return run_landing_load(spark, spec, target, request, staging_dir)
    hook = hook or (lambda _phase: None)
    phase = _Phases()
    started = time.perf_counter()

    source_path = spec.source.path or ""
    with phase("probe"), naming_source_files(spec.name, source_path):
        probed = probe(spark, spec, target, request, source_storage)
    source, state, clock, window = probed.source, probed.state, probed.clock, probed.window
    hook("probed")

    if window.is_empty:
        return _result(
            spec,
            source,
            window,
            state,
            None,
            0,
            0,
            clock,
            phase,
            started,
            out_of_range=probed.out_of_range,
        )

    stage_root = staging.create(spec.name, staging_dir)
    try:
        with phase("extract"), naming_source_files(spec.name, source_path):
            staged_path = f"{stage_root}/increment"
            if spec.history:
                observed, new_columns, logged_path = _stage_history(
                    spark, spec, source, window, state, target, stage_root
                )
            else:
                logged_path = None
                increment, observation, new_columns = _increment(
                    spark, spec, source, window, state, target, stage_root, request.run_id
                )
                increment.write.mode("overwrite").parquet(staged_path)
                observed = observation.get
                _fail_on_bad_rows(spec, observed)
            rows_extracted = int(observed["rows"])
            quarantined_path = f"{stage_root}/quarantine"
            report = _quality_report(spec, observed, quarantined_path)
            partition_high_water = _later(
                _last_load_time(state, "partition_high_water"),
                from_transaction_version(int(observed["pc_max"]), "timestamp")
                if observed["pc_max"] is not None
                else None,
            )
            rows_staged = _count_staged(staged_path)
            change_counts = _change_counts(spec, staged_path)
            unchanged = _unchanged(spec, rows_extracted, change_counts, logged_path)
            gaps = _gaps(spec, window, staged_path)
            guard = _delete_guard(spark, spec, state, target, rows_extracted, staged_path)
        hook("staged")
        crash_point("after_extract")

        with phase("commit"):
            _record_beside_target(spec, target, staged_path, logged_path, quarantined_path)
            crash_point("before_commit")
            commit = target.commit(
                state,
                staged_path,
                merge_plan_of(spec),
                kind=spec.watermark.kind,
                cursor_before=window.cursor_before,
                cursor_after=window.cursor_after,
                metadata={
                    "run_id": request.run_id,
                    "partition": request.partition_label,
                    "partition_end": format_value(request.partition_end),
                    "mode": window.mode,
                    "window": window.describe(),
                    "cursor_before": format_value(window.cursor_before),
                    "cursor_after": format_value(window.cursor_after),
                    "watermark_kind": spec.watermark.kind,
                    "rows_extracted": rows_extracted,
                    "rows_staged": rows_staged,
                    "partition_high_water": format_value(partition_high_water),
                    **({"sequence_gaps": gaps.missing} if gaps else {}),
                    **(guard.metadata() if guard else {}),
                    **(probed.out_of_range.metadata() if probed.out_of_range else {}),
                    **({f"changes.{k}": v for k, v in change_counts.items()}),
                    **(_quality_metadata(report) if report else {}),
                },
                partition_by=list(spec.target.partition_by),
                add_new_columns=spec.on_schema_change == "append_new_columns",
            )
        hook("committed")
        crash_point("after_commit")
    finally:
        staging.remove(stage_root)

    return _result(
        spec,
        source,
        window,
        state,
        commit,
        rows_extracted,
        rows_staged,
        clock,
        phase,
        started,
        new_columns=tuple(new_columns),
        gaps=gaps,
        changes=change_counts,
        unchanged=unchanged,
        quality=report,
        guard=guard,
        out_of_range=probed.out_of_range,
    )


def _record_beside_target(
    spec: TableSpec,
    target: DeltaTarget,
    staged_path: str,
    logged_path: str | None,
    quarantined_path: str,
) -> None:
    """Side tables are written before the target's commit: quarantined rows, hard-delete
    tombstones, and a history table's new changes. Each, left by a run that died before
    its commit, is harmless to the re-run (see Quarantine, Tombstones and ChangeLog)."""
    if os.path.isdir(quarantined_path):
        Quarantine(target).record(quarantined_path, identity_of(spec))
    plan = merge_plan_of(spec)
    if plan.tombstones:
        staged = pads.dataset(staged_path, format="parquet")
        Tombstones(target).record(staged, list(plan.keys), plan.watermark)
    if logged_path:
        ChangeLog(target).append(logged_path)


def _quality_report(
    spec: TableSpec, observed: dict, quarantined_path: str
) -> quality.QualityReport | None:
    rules = spec.quality.rules
    if not rules:
        return None
    diverted = _count_staged(quarantined_path) if os.path.isdir(quarantined_path) else 0
    return quality.report(rules, observed, diverted)


def _quality_metadata(report: quality.QualityReport) -> dict:
    return {
        "quality_score": report.score,
        "rows_quarantined": report.rows_quarantined,
        **{f"rule.{name}": n for name, n in report.failures.items()},
    }


def merge_plan_of(spec: TableSpec) -> MergePlan:
    """How the table's increments merge (also used to replay its quarantine)."""
    history = spec.history
    return merge_plan(
        spec.strategy.kind,
        spec.keys,
        spec.watermark.column,
        getattr(spec.strategy, "deletes", "hard"),
        valid_from=history.valid_from if history else None,
    )


def _change_counts(spec: TableSpec, staged_path: str) -> dict[str, int]:
    """Staged rows per kind of change, for snapshot and history tables."""
    if not (spec.takes_snapshots or spec.history):
        return {}
    kinds = pads.dataset(staged_path, format="parquet").to_table(columns=[CHANGE]).column(0)
    counts = {str(v["values"]): int(v["counts"]) for v in kinds.value_counts().to_pylist()}
    names = ("open", "close", "update", "remove") if spec.history else SNAPSHOT_KINDS
    return {name: counts.get(name, 0) for name in names}


SNAPSHOT_KINDS = ("insert", "change", "vanish")


def _unchanged(
    spec: TableSpec, extracted: int, counts: dict[str, int], logged_path: str | None
) -> int | None:
    """Snapshot rows that matched the target exactly; for history tables, the changes
    already in the change log (replays, duplicates)."""
    if spec.history:
        fresh = _count_staged(logged_path) if logged_path else 0
        return max(extracted - fresh, 0)
    if not spec.takes_snapshots:
        return None
    return max(extracted - counts.get("insert", 0) - counts.get("change", 0), 0)


def _gaps(spec: TableSpec, window: Window, staged_path: str) -> Gaps | None:
    """Ids missing above the previous cursor, for 'sequence' watermarks."""
    if spec.watermark.kind != "sequence" or not window.reads_incremental:
        return None
    ids = pads.dataset(staged_path, format="parquet").to_table(columns=[spec.watermark.column])
    after = window.cursor_before if isinstance(window.cursor_before, int) else None
    return sequence_gaps(ids.column(0), after)


def _delete_guard(
    spark: SparkSession,
    spec: TableSpec,
    state: TargetState,
    target: DeltaTarget,
    rows_extracted: int,
    staged_path: str,
) -> GuardReport | None:
    """Judge the run's deletes against ``strategy.max_delete_share`` (and an empty snapshot
    against ``allow_empty``) before anything is written; raises DeleteGuardError."""
    strategy = spec.strategy
    if not isinstance(strategy, (CdcStrategy, SnapshotStrategy)):
        return None
    allow_empty = strategy.allow_empty if isinstance(strategy, SnapshotStrategy) else None
    guard = DeleteGuard(strategy.max_delete_share, allow_empty)
    if not state.exists:
        return guard.judge(spec.name, rows_extracted, 0, 0)
    staged = pads.dataset(staged_path, format="parquet")
    # Staged deletes: a snapshot's vanished rows (live target keys, exact); a feed's newest
    # change per key when it is a delete (an upper bound: its key may not be in the target).
    deleting = staged.count_rows(filter=pads.field(changes.OP) == "D")
    soft = strategy.deletes == "soft"
    live = _live_rows(spark, target, state, soft=soft and bool(deleting or not rows_extracted))
    if deleting and live and deleting / live > strategy.max_delete_share and spec.feed:
        deleting = _deletes_of_live_keys(spark, spec, target, staged_path, soft)
    return guard.judge(spec.name, rows_extracted, deleting, live)


def _live_rows(spark: SparkSession, target: DeltaTarget, state: TargetState, soft: bool) -> int:
    """The target's rows (from the Delta log's statistics), less soft-deleted ones when
    ``soft`` (counted by Spark: only when the run deletes, or its snapshot is empty)."""
    assert state.table is not None
    if not soft:
        return row_count(state.table)
    flag = F.coalesce(F.col(changes.IS_DELETED), F.lit(False))
    return target.to_spark(spark).filter(~flag).count()


def _deletes_of_live_keys(
    spark: SparkSession, spec: TableSpec, target: DeltaTarget, staged_path: str, soft: bool
) -> int:
    """The staged deletes whose key is live in the target: what the merge would delete."""
    deletes = spark.read.parquet(staged_path).filter(F.col(changes.OP) == "D").select(*spec.keys)
    live = target.to_spark(spark)
    if soft:
        live = live.filter(~F.coalesce(F.col(changes.IS_DELETED), F.lit(False)))
    return deletes.join(live.select(*spec.keys), list(spec.keys), "left_semi").count()


def _fail_on_null_watermarks(spec: TableSpec, source: Source) -> None:
    # A row with no watermark can never enter a window: fail rather than skip it silently.
    column = spec.watermark.column
    count = source.count_nulls(column)
    if count:
        raise NullValuesError(
            spec.name,
            {column: count},
            f"fill '{column}' in the source (rows without a watermark can never be "
            "loaded incrementally)",
        )


def _high_water(spec: TableSpec, source: Source, window: Window) -> WatermarkValue | None:
    """The source's high-water mark, captured before extraction: max watermark above the
    cursor and below the cap, or None when no such row exists."""
    if not window.incremental:
        return None
    part = predicates.probe_part(window, spec.watermark.column, spec.watermark.tiebreak)
    return source.high_water(part, spec.watermark.kind, spec.watermark.max_rows)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _shape(spec: TableSpec, taken_at: datetime | None = None):
    """The strategy's reshaping of raw source rows: CDC feeds become rows plus an op, a
    snapshot's rows are stamped with the time it was taken."""
    feed = spec.feed
    if feed is not None:
        keep = (spec.watermark.column, spec.partition_column)
        return changes.normalize(spec.name, feed, keep)
    if spec.takes_snapshots:
        stamp = F.lit(taken_at or _EPOCH).cast("timestamp")
        return lambda df: df.withColumn(SNAPSHOT_AT, stamp)
    return lambda df: df


def _hash_excludes(spec: TableSpec, columns: list[str]) -> tuple[str, ...]:
    """Columns the row hash ignores: a snapshot's time (the same row in two snapshots is
    unchanged), and a snapshot table's untracked columns."""
    if not spec.takes_snapshots:
        return ()
    tracked = spec.strategy.tracked if isinstance(spec.strategy, SnapshotStrategy) else None
    if tracked is None:
        return (SNAPSHOT_AT,)
    keep = {*spec.keys, *tracked}
    return tuple(c for c in columns if c not in keep)


def prepared_rows(spec: TableSpec, taken_at: datetime | None = None):
    """Raw source rows as the loader lands them: reshaped by the strategy, timestamps as UTC
    instants, keys and watermark first, the row hash, and soft-delete flags for CDC tables
    that keep deleted rows (added after the hash, so a replay hashes the same)."""

    def transform(df: DataFrame) -> DataFrame:
        df = (
            df.transform(_shape(spec, taken_at))
            .transform(transforms.to_utc_instants(spec.source.timezone))
            .transform(transforms.ordered_columns(spec.keys, spec.watermark.column))
        )
        df = df.transform(transforms.with_row_hash(_hash_excludes(spec, df.columns)))
        if isinstance(spec.strategy, CdcStrategy) and spec.strategy.deletes == "soft":
            df = df.transform(changes.soft_delete_columns(spec.partition_column))
        return df

    return transform


def _tombstones(spark: SparkSession, spec: TableSpec, target: DeltaTarget) -> DataFrame | None:
    if isinstance(spec.strategy, CdcStrategy) and spec.strategy.deletes == "hard":
        return Tombstones(target).to_spark(spark)
    return None


def window_rows(spec: TableSpec, source: Source, window: Window) -> DataFrame:
    """The source rows of the window, prepared (a snapshot: every row, stamped)."""
    if spec.takes_snapshots:
        assert isinstance(window.high_water, datetime)
        prepared = source.read().transform(prepared_rows(spec, window.high_water))
        # A snapshot should hold a key once; if not, one version wins by content hash.
        return prepared.transform(transforms.newest_per_key(spec.keys, SNAPSHOT_AT))
    wm, part_col = spec.watermark.column, spec.partition_column
    parts = predicates.window_parts(window, wm, part_col, spec.watermark.tiebreak)
    types = {f.name: f.dataType for f in source.schema.fields}
    zone = spec.source.timezone
    raw = source.read(predicates.to_source_ranges(parts, types, zone))
    return (
        raw.filter(predicates.to_source_filter(parts, types, zone))
        .transform(prepared_rows(spec))
        .filter(predicates.to_filter(parts))
    )


def _checked(spec: TableSpec, rows: DataFrame) -> DataFrame:
    """The rows with the names of the quality rules each fails (when there are rules)."""
    if not spec.quality.rules:
        return rows
    return quality.failed_rules(spec.name, rows, spec.quality.rules)


def _observed(spec: TableSpec, rows: DataFrame) -> tuple[DataFrame, Observation]:
    """Count rows, null keys, unknown CDC operations, quality-rule failures and the
    partition column's maximum as the rows are written (no second pass over the source).
    The rule names are dropped after counting."""
    observation = Observation(f"extract_{spec.name}")
    rules = spec.quality.rules if quality.FAILED in rows.columns else []
    checked = [*spec.keys, *([spec.effective_column] if spec.history else [])]
    observed = rows.observe(
        observation,
        F.count(F.lit(1)).alias("rows"),
        *[transforms.null_count(k).alias(f"null:{k}") for k in dict.fromkeys(checked)],
        F.max(F.unix_micros(F.col(transforms.quote(spec.partition_column)))).alias("pc_max"),
        *([transforms.null_count(changes.OP).alias("unknown_ops")] if spec.feed else []),
        *(quality.counters(rules) if rules else []),
    )
    return observed, observation


def _increment(
    spark: SparkSession,
    spec: TableSpec,
    source: Source,
    window: Window,
    state: TargetState,
    target: DeltaTarget,
    stage_root: str,
    run_id: str = "manual",
) -> tuple[DataFrame, Observation, list[str]]:
    wm = spec.watermark.column
    key_columns = [F.col(transforms.quote(k)) for k in spec.keys]
    rows = _checked(spec, window_rows(spec, source, window))
    staged_first = (
        spec.takes_snapshots
        or source.remote
        or any(r.action == "quarantine" for r in spec.quality.rules)
    )
    if staged_first:
        rows, observation = _observed(spec, rows)
        if source.remote and not spec.takes_snapshots:
            # Range partitioning samples its input in a job of its own before the write.
            rows = _staged(rows, stage_root, "window")
        rows = _divert(spark, spec, rows, stage_root, run_id)
    else:
        # Observed above the range shuffle: the shuffle's sampling job runs the plan below
        # it once more, and an observation there would count every row twice.
        rows, observation = _observed(spec, rows.repartitionByRange(*key_columns))
        rows = rows.drop(quality.FAILED)
    if spec.takes_snapshots:
        # The diff reads the snapshot twice (changed rows, vanished keys): stage it once.
        snapshot = _staged(rows, stage_root, "snapshot")
        increment = _snapshot_diff(spark, spec, snapshot, state, target, window.high_water)
    else:
        # Range-partition by key (one shuffle serves both the per-key window and the
        # layout): each staged file, and so each file the merge writes, covers a narrow key
        # range, which is what lets later merges skip target files by their statistics.
        if staged_first:
            rows = rows.repartitionByRange(*key_columns)
        increment = rows.transform(transforms.newest_per_key(spec.keys, wm))
        tombstones = _tombstones(spark, spec, target)
        if tombstones is not None:
            increment = changes.not_older_than_tombstones(increment, tombstones, spec.keys, wm)
    new_columns: list[str] = []
    if state.schema is not None:
        incoming = increment.drop(changes.OP, CHANGE)
        new_columns = validation.check_against_target(spec, incoming.schema, state.schema)
    return increment.sortWithinPartitions(*key_columns), observation, new_columns


def _divert(
    spark: SparkSession, spec: TableSpec, rows: DataFrame, stage_root: str, run_id: str
) -> DataFrame:
    """Stage the rows that fail a quarantine rule apart (with the rules they failed, the run
    and the time) and return the others, without the rule names."""
    rules = spec.quality.rules
    if not any(r.action == "quarantine" for r in rules):
        return rows.drop(quality.FAILED)
    # Both parts come from one staged copy: the window is read from the source once.
    checked = _staged(rows, stage_root, "checked")
    diverted = quality.diverted(rules)
    (
        checked.filter(diverted)
        .withColumn(quality.RUN_ID, F.lit(run_id))
        .withColumn(quality.QUARANTINED_AT, F.current_timestamp())
        .write.mode("overwrite")
        .parquet(f"{stage_root}/quarantine")
    )
    return checked.filter(~diverted).drop(quality.FAILED)


def _snapshot_diff(
    spark: SparkSession,
    spec: TableSpec,
    snapshot: DataFrame,
    state: TargetState,
    target: DeltaTarget,
    taken_at: object,
) -> DataFrame:
    assert isinstance(spec.strategy, SnapshotStrategy) and isinstance(taken_at, datetime)
    soft = spec.strategy.deletes == "soft"
    current = target.to_spark(spark) if state.exists else None
    diff = snapshot_changes(
        snapshot,
        current,
        spec.keys,
        SNAPSHOT_AT,
        taken_at,
        deleted_column=changes.IS_DELETED if soft else None,
    )
    if soft:
        diff = diff.transform(changes.soft_delete_columns(SNAPSHOT_AT))
    return diff.repartitionByRange(*[F.col(transforms.quote(k)) for k in spec.keys])


def _stage_history(
    spark: SparkSession,
    spec: TableSpec,
    source: Source,
    window: Window,
    state: TargetState,
    target: DeltaTarget,
    stage_root: str,
) -> tuple[dict, list[str], str]:
    """Stage a history (scd2) table's run in two steps: the window's change events, then,
    from them, the versions to write (``increment``) and the events new to the change log.
    Returns the observed counts, new columns and the path of the new events."""
    scd2 = spec.history
    assert scd2 is not None
    rows = window_rows(spec, source, window)
    if spec.takes_snapshots:
        current = None
        if state.exists:
            live = target.to_spark(spark).filter(F.col(transforms.quote(scd2.is_current)))
            current = live.drop(scd2.valid_from, scd2.valid_to, scd2.is_current)
        assert isinstance(window.high_water, datetime)
        rows = snapshot_changes(rows, current, spec.keys, SNAPSHOT_AT, window.high_water)
        rows = rows.drop(CHANGE)
    elif changes.OP not in rows.columns:
        rows = rows.withColumn(changes.OP, F.lit("U"))
    new_columns: list[str] = []
    if state.schema is not None:
        validity = {scd2.valid_from, scd2.valid_to, scd2.is_current}
        held = StructType([f for f in state.schema.fields if f.name not in validity])
        new_columns = validation.check_against_target(spec, rows.drop(changes.OP).schema, held)
    observed_rows, observation = _observed(spec, _checked(spec, rows))
    events = _staged(observed_rows.drop(quality.FAILED), stage_root, "events")
    observed = observation.get
    _fail_on_bad_rows(spec, observed)

    columns = history_columns(spec, events.columns)
    # Only the files of the log and the target that may hold a touched key are read (both
    # are written in key order), and their rows of those keys are staged once: the run's
    # cost follows its keys, not the table.
    touched = delta_io.touched_keys(events, spec.keys) if state.exists else None
    stored = target.to_spark(spark, holding=touched) if state.exists else None
    logged = ChangeLog(target).to_spark(spark, holding=touched)
    keys = events.select(*[F.col(transforms.quote(k)) for k in spec.keys]).distinct()
    if stored is not None:
        stored = _staged(stored.join(F.broadcast(keys), spec.keys, "left_semi"), stage_root, "held")
    if logged is not None:
        logged = _staged(logged.join(F.broadcast(keys), spec.keys, "left_semi"), stage_root, "log")
    increment, _ = history.history_changes(
        events, logged, stored, columns, stage=lambda rows, name: _staged(rows, stage_root, name)
    )
    key_columns = [F.col(transforms.quote(k)) for k in spec.keys]
    (
        increment.repartitionByRange(*key_columns)
        .sortWithinPartitions(*key_columns)
        .write.mode("overwrite")
        .parquet(f"{stage_root}/increment")
    )
    return observed, new_columns, f"{stage_root}/new_changes"  # staged by history_changes


def _staged(rows: DataFrame, stage_root: str, name: str) -> DataFrame:
    path = f"{stage_root}/{name}"
    rows.write.mode("overwrite").parquet(path)
    return rows.sparkSession.read.parquet(path)


def history_columns(spec: TableSpec, columns: list[str]) -> history.HistoryColumns:
    scd2 = spec.history
    assert scd2 is not None
    effective = spec.effective_column
    untracked = (*spec.keys, effective, spec.watermark.column, spec.partition_column)
    tracked = tuple(scd2.tracked) if scd2.tracked else history.default_tracked(columns, untracked)
    return history.HistoryColumns(
        keys=tuple(spec.keys),
        effective=effective,
        order=spec.watermark.column,
        tracked=tracked,
        valid_from=scd2.valid_from,
        valid_to=scd2.valid_to,
        is_current=scd2.is_current,
    )


def _fail_on_bad_rows(spec: TableSpec, observed: dict) -> None:
    _fail_on_null_keys(spec, observed)
    _fail_on_unknown_operations(spec, observed)
    rules = spec.quality.rules
    if rules:
        quality.fail_on_failed_rules(spec.name, rules, quality.report(rules, observed, 0))


def _fail_on_unknown_operations(spec: TableSpec, observed: dict) -> None:
    unknown = int(observed.get("unknown_ops") or 0)
    if unknown:
        feed = spec.feed
        assert feed is not None
        raise IncrementalLoadError(
            spec.name,
            f"{unknown} change rows carry an operation code that is not one of "
            f"{changes.EXPECTED[feed.encoding]} (column "
            f"'{feed.operation_column}', encoding '{feed.encoding}').",
            "correct strategy.encoding / strategy.operation, or fix the feed",
        )


def _last_load_time(state: TargetState, name: str) -> datetime | None:
    """A time the last load recorded in its commit metadata (None when absent)."""
    text = state.last_load.get(name)
    if not text or text == "-":
        return None
    value = parse_value(text, "timestamp")
    assert isinstance(value, datetime)
    return value


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    values = [v for v in (a, b) if v is not None]
    return max(values) if values else None


def _fail_on_null_keys(spec: TableSpec, observed: dict) -> None:
    counts = {k: int(observed[f"null:{k}"]) for k in spec.keys if observed[f"null:{k}"]}
    if counts:
        raise NullValuesError(
            spec.name,
            counts,
            "fill the key columns in the source, or choose keys that are never null",
        )
    effective = spec.effective_column if spec.history else None
    if effective and observed.get(f"null:{effective}"):
        raise NullValuesError(
            spec.name,
            {effective: int(observed[f"null:{effective}"])},
            f"fill '{effective}' (the time a change took effect), or set "
            "strategy.effective to a column that is never null",
        )


def _count_staged(path: str) -> int:
    return pads.dataset(path, format="parquet").count_rows()


def _result(
    spec: TableSpec,
    source: Source,
    window: Window,
    state: TargetState,
    commit: CommitResult | None,
    rows_extracted: int,
    rows_staged: int,
    clock: datetime,
    phase: _Phases,
    started: float,
    new_columns: tuple[str, ...] = (),
    gaps: Gaps | None = None,
    changes: dict[str, int] | None = None,
    unchanged: int | None = None,
    quality: quality.QualityReport | None = None,
    guard: GuardReport | None = None,
    out_of_range: OutOfRange | None = None,
) -> LoadResult:
    phase.seconds["total"] = round(time.perf_counter() - started, 3)
    committed = bool(commit and commit.committed)
    cursor_after = window.cursor_after if committed else window.cursor_before
    return LoadResult(
        table=spec.name,
        mode=window.mode,
        window=window.describe(),
        cursor_before=window.cursor_before,
        cursor_after=cursor_after,
        high_water=window.high_water,
        rows_extracted=rows_extracted,
        rows_staged=rows_staged,
        rows_inserted=commit.rows_inserted if commit else 0,
        rows_updated=commit.rows_updated if commit else 0,
        rows_deleted=commit.rows_deleted if commit else 0,
        committed=committed,
        delta_version=commit.version if commit else state.version,
        lag_seconds=lag_seconds(cursor_after, clock),
        phase_seconds=dict(phase.seconds),
        files_added=commit.files_added if commit else 0,
        files_removed=commit.files_removed if commit else 0,
        new_columns=new_columns,
        source=source.describe(),
        gaps=gaps,
        changes=dict(changes or {}),
        unchanged=unchanged,
        quality=quality,
        guard=guard,
        out_of_range=out_of_range,
    )
