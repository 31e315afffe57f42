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
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from incremental_assets.engine.declared_layers.changes import having_keys
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake.merge_plan import (
    delete,
    insert,
    run_merge,
    same_keys,
    update,
)
from incremental_assets.engine.faults import crash_point
from incremental_assets.engine.layers import covering
from incremental_assets.engine.transforms import quote

# A merge source row that deletes its key (true) or upserts it.
DROPS = "_ia_layer_drops"
# An upsert that replaces the layer's row of its key whatever their order (that row came
# from a group version the upsert's replaces: engine/declared_layers/versions.py).
REPLACES = "_ia_layer_replaces"
NEW_TABLE_OPTIONS = {"delta.enableChangeDataFeed": "true"}


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
    newer: str | None = None,
    schema_evolution: bool = False,
) -> Written:
    """Write ``upserts`` (the layer's new rows of the changed keys) and delete the keys of
    ``gone`` that ``upserts`` does not hold, recording ``until`` as the upstream version
    covered. A missing layer table is created with ``upserts`` (its rows counted).

    ``newer`` (SQL over ``s`` and ``t``): an upsert replaces the layer's row of its key
    only where it holds (or where the upsert's ``REPLACES`` column is true);
    ``schema_evolution``: columns ``upserts`` has and the layer lacks are added."""
    commit = covering(inputs.target, inputs.upstream, until, extra)
    return write_rows(
        spark, inputs, upserts, gone, commit, newer=newer, schema_evolution=schema_evolution
    )


def write_rows(
    spark: SparkSession,
    inputs: LayerInputs,
    upserts: DataFrame,
    gone: DataFrame | None,
    commit: dict,
    newer: str | None = None,
    schema_evolution: bool = False,
) -> Written:
    """:func:`write_layer`'s commit, as the idempotent write ``commit`` names (its
    ``app_id``, ``version`` and ``metadata``)."""
    target, keys = inputs.target, inputs.layer.keys_of_layer
    columns = [c for c in upserts.columns if c != REPLACES]
    if not target.exists():
        rows = upserts.count()
        crash_point("before_commit")
        delta_commits.append(
            upserts.select(*[quote(c) for c in columns]),
            target.spark_path,
            mode="error",
            options=NEW_TABLE_OPTIONS,
            **commit,
        )
        crash_point("after_commit")
        return Written(rows, 0, 0, target.open().version())
    source = upserts.withColumn(DROPS, F.lit(False))
    if gone is not None:
        dropped = _without(gone.select(*[quote(k) for k in keys]), upserts, keys)
        dropped = dropped.withColumn(DROPS, F.lit(True))
        source = source.unionByName(dropped, allowMissingColumns=True)
    updates = f"NOT s.{DROPS}"
    differs = _differs(upserts, target.open().schema().fields, keys)
    if differs is not None:
        # A row equal to the layer's is left alone: no new version of it, and no
        # update in the layer's change data feed for the layers after it to re-read.
        updates = f"{updates} AND ({differs})"
    if newer is not None:
        forced = f"s.{REPLACES}" if REPLACES in upserts.columns else "FALSE"
        updates = f"{updates} AND ({forced} OR {newer})"
    clauses = [delete(f"s.{DROPS}"), update(updates), insert(f"NOT s.{DROPS}")]
    with delta_commits.idempotent(spark, **commit):
        crash_point("before_commit")
        counts = run_merge(
            spark,
            target.spark_path,
            source,
            same_keys(keys),
            clauses,
            columns,
            schema_evolution=schema_evolution,
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


def _differs(upserts: DataFrame, held: Sequence, keys: Sequence[str]) -> str | None:
    """SQL over ``s`` and ``t`` true where the upsert ``s`` changes the layer's row ``t``
    of its key (a column the layer gains counts where the upsert gives it a value); None
    when a column's type cannot be compared (a map), so every matched upsert updates."""
    skipped = {k.lower() for k in keys} | {DROPS.lower(), REPLACES.lower()}
    present = {f.name.lower() for f in held}
    parts = []
    for field in upserts.schema.fields:
        if field.name.lower() in skipped:
            continue
        name = quote(field.name)
        if field.name.lower() not in present:
            parts.append(f"s.{name} IS NOT NULL")
        elif not _comparable(field.dataType):
            return None
        else:
            parts.append(f"NOT (t.{name} <=> s.{name})")
    return " OR ".join(parts) if parts else "FALSE"


def _comparable(kind: DataType) -> bool:
    """Whether Spark's ``<=>`` takes values of ``kind`` (not a map, nor holds one)."""
    if isinstance(kind, MapType):
        return False
    if isinstance(kind, StructType):
        return all(_comparable(f.dataType) for f in kind.fields)
    if isinstance(kind, ArrayType):
        return _comparable(kind.elementType)
    return True


def _without(rows: DataFrame, other: DataFrame, keys: Sequence[str]) -> DataFrame:
    """``rows`` whose keys ``other`` does not hold."""
    return having_keys(rows, other, keys, how="left_anti").distinct()
