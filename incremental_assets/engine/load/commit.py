"""The commit phase of a run: side tables first, then the increment and the new cursor in
one Delta commit."""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql import DataFrame, SparkSession

from incremental_assets.engine import late_files, quality
from incremental_assets.engine.changes import DELETED_AT
from incremental_assets.engine.delta_lake.commits import SOURCE_IDENTITY
from incremental_assets.engine.delta_lake.merge_plan import MergePlan
from incremental_assets.engine.delta_lake.store import CommitResult, DeltaTarget, TargetState
from incremental_assets.engine.faults import crash_point
from incremental_assets.engine.guards import OutOfRange
from incremental_assets.engine.load.stage import LOGGED_ROWS, Extract, counted_in_one_pass
from incremental_assets.engine.quarantine import Quarantine, identity_of
from incremental_assets.engine.strategies import Strategy, strategy_for
from incremental_assets.engine.strategies.rows import partition_counters
from incremental_assets.engine.watermarks import format_value
from incremental_assets.engine.windows import LoadRequest, Window
from incremental_assets.specs import TableSpec


def merge_plan_of(spec: TableSpec) -> MergePlan:
    """How the table's increments merge (also used to replay its quarantine)."""
    return strategy_for(spec).merge_plan()


def commit(
    spark: SparkSession,
    strategy: Strategy,
    target: DeltaTarget,
    state: TargetState,
    request: LoadRequest,
    window: Window,
    extracted: Extract,
    out_of_range: OutOfRange | None,
    ledger: late_files.FileLedger | None = None,
    source_identity: str | None = None,
) -> CommitResult:
    """Record the side tables, then commit the staged increment with the new cursor and
    the run's metadata (with ``source_identity``, what the run read: the next run's source
    must be the same, see engine/sources/identity.py)."""
    spec = strategy.spec
    logged = _record_beside_target(spark, strategy, target, extracted, state.next_sequence)
    crash_point("before_commit")
    gaps, guard, report = extracted.gaps, extracted.guard, extracted.quality
    increment = extracted.increment
    if increment is not None and not isinstance(increment, DataFrame):
        increment = increment()  # it reads what was just recorded beside the target
    committed = target.commit(
        spark,
        state,
        extracted.staged_path,
        strategy.merge_plan(),
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
            **({SOURCE_IDENTITY: source_identity} if source_identity else {}),
            "rows_extracted": extracted.rows_extracted,
            # Not known before the write of an increment written once, as the table it
            # creates: then as many as it inserts (the commit's num_output_rows).
            **({"rows_staged": extracted.rows_staged} if extracted.increment is None else {}),
            "partition_high_water": format_value(extracted.partition_high_water),
            **({"sequence_gaps": gaps.missing} if gaps else {}),
            **(guard.metadata() if guard else {}),
            **(out_of_range.metadata() if out_of_range else {}),
            **({f"changes.{k}": v for k, v in extracted.changes.items()}),
            **(_quality_metadata(report) if report else {}),
            **late_files.metadata(ledger),
            **(
                {"rows_late": extracted.rows_late, "files_late": extracted.files_late}
                if ledger is not None
                else {}
            ),
        },
        partition_by=list(spec.target.partition_by),
        add_new_columns=spec.on_schema_change == "append_new_columns",
        # An increment written once has rows when its window had any.
        staged_rows=extracted.rows_staged
        if extracted.increment is None
        else extracted.rows_extracted,
        staged_counts=extracted.partition_keys,
        staged_keys=extracted.key_range,
        acting_counters=partition_counters(extracted.partition_key),
        deletion_vectors=spec.target.deletion_vectors,
        above_cursor=_above_cursor(spec, window, extracted),
        # A small table's merge takes one pass when its rows by partition need no recount.
        one_pass_below=int(spec.target.one_pass_below) if counted_in_one_pass(extracted) else 0,
        increment=increment,
        increment_counters=extracted.counters,
        stats_columns=_stats_columns(spec, strategy.merge_plan()),
        bytes_per_row=extracted.bytes_per_row,
        file_bytes=spec.target.file_size,
    )
    if logged is None:
        return committed
    return replace(committed, written={**committed.written, LOGGED_ROWS: logged})


def _stats_columns(spec: TableSpec, plan: MergePlan) -> list[str]:
    """The columns whose file statistics later runs read instead of the table: the keys
    (the files a merge touches, the keys_not_null check, Z-ordering), the watermark, the
    partition column, and a soft-delete table's ``deleted_at`` (the delete guard's live
    rows)."""
    wanted = [*spec.keys, spec.watermark.column, spec.partition_column]
    if plan.deletes == "soft":
        wanted.append(DELETED_AT)
    return wanted


def _above_cursor(spec: TableSpec, window: Window, extracted: Extract) -> bool:
    """Whether every staged row's watermark is above the cursor: a window above it with no
    late file's row read. A hybrid watermark's rows above the cursor may tie the table's on
    the timestamp (the merge orders by it, not the tiebreak): they are not surely newer."""
    return window.above_cursor and not extracted.rows_late and spec.watermark.kind != "hybrid"


def _record_beside_target(
    spark: SparkSession,
    strategy: Strategy,
    target: DeltaTarget,
    extracted: Extract,
    sequence: int,
) -> int | None:
    """Side tables are written before the target's commit: quarantined rows, and the
    strategy's own (hard-delete tombstones, a history table's new changes). Each, left by a
    run that died before its commit, is harmless to the re-run (see Quarantine, Tombstones
    and ChangeLog). The rows recorded beside a table written once, where counted."""
    if extracted.rows_quarantined:
        Quarantine(target).record(spark, extracted.quarantined_path, identity_of(strategy.spec))
    if extracted.increment is not None:
        # Written once, as the table it creates: what the strategy records beside it
        # (Staged.beside: found in the window's rows, Strategy.once_beside, or a history
        # table's new events).
        if extracted.beside is None:
            return None
        return strategy.record_once_beside_target(spark, target, extracted.beside, sequence)
    strategy.record_beside_target(
        spark,
        target,
        extracted.staged_path,
        extracted.logged_path,
        extracted.staged_deletes,
        sequence,
        extracted.deletes_renewed,
        extracted.beside,
    )
    return None


def _quality_metadata(report: quality.QualityReport) -> dict:
    return {
        "quality_score": report.score,
        "rows_quarantined": report.rows_quarantined,
        **{f"rule.{name}": n for name, n in report.failures.items()},
    }
