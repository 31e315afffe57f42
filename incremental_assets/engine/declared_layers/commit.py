"""A layer's commit: its upserted rows and the keys it no longer holds, merged by key in
Delta's SQL, with the upstream version the refresh covered in the same commit (the
idempotent write ``incremental_assets/<layer>#<upstream>`` at that version, as
engine/layers.py records it). A run killed before the commit leaves the covered version
where it was, so the next run reads the same changes again; one killed after it finds the
version covered and reads nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine.declared_layers.changes import having_keys
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake.merge_plan import delete, insert, run_merge, update
from incremental_assets.engine.faults import crash_point
from incremental_assets.engine.layers import covering
from incremental_assets.engine.transforms import quote

# A merge source row that deletes its key (true) or upserts it.
DROPS = "_ia_layer_drops"


@dataclass(frozen=True)
class Written:
    inserted: int
    updated: int
    deleted: int
    version: int | None


def write_layer(
    spark: SparkSession,
    inputs: LayerInputs,
    upserts: DataFrame,
    gone: DataFrame | None,
    until: int,
    extra: dict | None = None,
) -> Written:
    """Write ``upserts`` (the layer's new rows of the changed keys) and delete the keys of
    ``gone`` that ``upserts`` does not hold, recording ``until`` as the upstream version
    covered. A missing layer table is created with ``upserts`` (its rows counted)."""
    target, keys = inputs.target, inputs.layer.keys_of_layer
    commit = covering(target, inputs.upstream, until, extra)
    if not target.exists():
        rows = upserts.count()
        crash_point("before_commit")
        delta_commits.append(upserts, target.spark_path, mode="error", **commit)
        crash_point("after_commit")
        return Written(rows, 0, 0, target.open().version())
    source = upserts.withColumn(DROPS, F.lit(False))
    if gone is not None:
        dropped = _without(gone.select(*[quote(k) for k in keys]), upserts, keys)
        dropped = dropped.withColumn(DROPS, F.lit(True))
        source = source.unionByName(dropped, allowMissingColumns=True)
    clauses = [delete(f"s.{DROPS}"), update(f"NOT s.{DROPS}"), insert(f"NOT s.{DROPS}")]
    with delta_commits.idempotent(spark, **commit):
        crash_point("before_commit")
        counts = run_merge(
            spark, target.spark_path, source, _same_keys(keys), clauses, upserts.columns
        )
    crash_point("after_commit")
    if counts is None:  # another run committed this version first
        return Written(0, 0, 0, None)
    return Written(
        counts.get("num_inserted_rows", 0),
        counts.get("num_updated_rows", 0),
        counts.get("num_deleted_rows", 0),
        target.open().version(),
    )


def _without(rows: DataFrame, other: DataFrame, keys: Sequence[str]) -> DataFrame:
    """``rows`` whose keys ``other`` does not hold."""
    return having_keys(rows, other, keys, how="left_anti").distinct()


def _same_keys(keys: Sequence[str]) -> str:
    # Null-safe: a group whose key is null is still one group.
    return " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys)
