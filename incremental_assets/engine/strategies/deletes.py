"""The guard shared by strategies that delete target rows (cdc, snapshot): a run that
would delete more than ``strategy.max_delete_share`` of the live rows is refused."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import changes, staging
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget, TargetState, row_count
from incremental_assets.engine.guards import FROM_SPARK, FROM_STATISTICS, DeleteGuard, GuardReport
from incremental_assets.specs import TableSpec


def judge_deletes(
    spark: SparkSession,
    spec: TableSpec,
    guard: DeleteGuard,
    state: TargetState,
    target: DeltaTarget,
    rows_extracted: int,
    staged_path: str,
    staged_deletes: int,
    *,
    soft: bool,
    upper_bound: bool,
    deleted_from: str,
) -> GuardReport:
    """Judge the run's deletes against ``guard`` before anything is written (raises
    DeleteGuardError). ``upper_bound``: the staged deletes may name keys the target does
    not hold (a feed's), so a count over the limit is made exact before judging.
    ``staged_deletes``: the increment's delete rows, as its write counted them;
    ``deleted_from``: the column soft deletes take their ``deleted_at`` from."""
    if not state.exists:
        return guard.judge(spec.name, rows_extracted, 0, 0)
    # Staged deletes: a snapshot's vanished rows (live target keys, exact); a feed's newest
    # change per key when it is a delete (an upper bound: its key may not be in the target).
    deleting = staged_deletes
    judged = bool(deleting or not rows_extracted)
    live, counted_from = _live_rows(spark, target, state, soft, judged, deleted_from)
    if deleting and live and deleting / live > guard.limit and upper_bound:
        deleting = _deletes_of_live_keys(spark, spec, target, staged_path, soft)
    return guard.judge(spec.name, rows_extracted, deleting, live, counted_from)


def _live_rows(
    spark: SparkSession,
    target: DeltaTarget,
    state: TargetState,
    soft: bool,
    judged: bool,
    deleted_from: str,
) -> tuple[int, str | None]:
    """The target's rows (from the Delta log's statistics), less soft-deleted ones when
    ``soft``: the nulls of ``deleted_at`` by the statistics where they tell
    (``delta_io.unflagged_rows``), else, when they are ``judged`` (the run deletes, or its
    snapshot is empty), counted by Spark, a scan of the whole table; and how they were
    counted (None: not counted, every row given)."""
    assert state.table is not None
    if not soft:
        return row_count(state.table), FROM_STATISTICS
    unflagged = delta_io.unflagged_rows(state.table, changes.DELETED_AT, deleted_from)
    if unflagged is not None:
        return unflagged, FROM_STATISTICS
    if not judged:
        return row_count(state.table), None
    flag = F.coalesce(F.col(changes.IS_DELETED), F.lit(False))
    return target.to_spark(spark).filter(~flag).count(), FROM_SPARK


def _deletes_of_live_keys(
    spark: SparkSession, spec: TableSpec, target: DeltaTarget, staged_path: str, soft: bool
) -> int:
    """The staged deletes whose key is live in the target: what the merge would delete."""
    deletes = staging.read(spark, staged_path).filter(F.col(changes.OP) == "D").select(*spec.keys)
    live = target.to_spark(spark)
    if soft:
        live = live.filter(~F.coalesce(F.col(changes.IS_DELETED), F.lit(False)))
    return deletes.join(live.select(*spec.keys), list(spec.keys), "left_semi").count()
