"""A row layer's ``newest`` (specs/layers.py NewestSpec): over an upstream that keeps every
version of a row (a landing table keeps each version of each file), which rows of the
select the layer keeps, and which of its rows a newer version of their group replaces.

- ``newest_rows``: of each group (``replaces``) only the rows of its newest version (those
  sharing the group's greatest first ``by`` column), none of a landing file whose newest
  version has no rows; then of each key the row greatest by ``by``;
- ``replaced_rows``: the keys of the layer's rows that those versions replace (the layer's
  rows of a group older than its newest version), for the commit to delete, and a flag on
  the upserts whose key such a row held (they replace it whatever the order);
- ``newer``: the merge condition under which an upsert replaces the layer's row of its key.

Applied to the changed rows of a run, or to the whole upstream (the layer's checks): both
give the same rows for the keys they hold.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import reduce

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from incremental_assets.engine.declared_layers.commit import REPLACES
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import LayerError
from incremental_assets.engine.layers import rewritten_files
from incremental_assets.engine.spark.local_rows import local_rows
from incremental_assets.engine.transforms import quote
from incremental_assets.specs.landing import SOURCE_FILE
from incremental_assets.specs.layers import NewestSpec, RowLayerSpec

_VERSION = "_ia_group_version"
_FILES = pa.schema([("f", pa.string())])


def newest_spec(inputs: LayerInputs) -> NewestSpec | None:
    layer = inputs.layer
    return layer.newest if isinstance(layer, RowLayerSpec) else None


def check_columns(inputs: LayerInputs, rows: DataFrame) -> None:
    """The select gives the columns ``newest`` names (else a LayerError naming the field)."""
    newest = newest_spec(inputs)
    if newest is None:
        return
    have = {c.lower() for c in rows.columns}
    for field, columns in (("newest.by", newest.by), ("newest.replaces", newest.replaces)):
        missing = [c for c in columns if c.lower() not in have]
        if missing:
            raise LayerError(
                inputs.layer.name,
                field,
                f"the select gives no column {', '.join(missing)} (it gives "
                f"{', '.join(rows.columns)})",
                "select those columns (a landing table's are _ia_source_file, "
                "_ia_file_version, _ia_file_row and _ia_ingested_at), or name others",
            )


def emptied_files(inputs: LayerInputs, since: int, until: int | None = None) -> frozenset[str]:
    """Over a landing table with ``replaces`` naming its file column: the files whose newest
    version loaded after upstream version ``since`` (up to ``until``, default the latest)
    has no rows (a version with no rows leaves no row to see, only the load's record)."""
    newest = newest_spec(inputs)
    if newest is None or not inputs.upstream_landing:
        return frozenset()
    if SOURCE_FILE.lower() not in {c.lower() for c in newest.replaces}:
        return frozenset()
    return frozenset(files_emptied_since(inputs.upstream, since, until))


def files_emptied_since(bronze: DeltaTarget, since: int, until: int | None = None) -> set[str]:
    """Files whose newest load after version ``since`` (-1: any; up to ``until``) listed no
    rows, from the loads' records (``[path, version, rows]`` per file), not the data."""
    table = bronze.open()
    newest: dict[str, tuple[int, int]] = {}
    limit = None if since < 0 else max(table.version() - since, 0)
    for load in bronze.loads(table, limit=limit):
        version = int(load["version"])
        if version <= since or (until is not None and version > until):
            continue
        for path, _, rows in json.loads(load.get("files") or "[]"):
            if path not in newest or newest[path][0] < version:
                newest[path] = (version, int(rows))
    return {path for path, (_, rows) in newest.items() if rows == 0}


def newest_rows(inputs: LayerInputs, rows: DataFrame, emptied: frozenset[str]) -> DataFrame:
    """``rows`` (the select's) without those older versions replace (see the module)."""
    newest = newest_spec(inputs)
    if newest is None:
        return rows
    if newest.replaces:
        rows = _without_emptied(rows, emptied).withColumn(
            _VERSION, F.max(_col(newest.by[0])).over(Window.partitionBy(*_cols(newest.replaces)))
        )
        rows = rows.filter(_col(newest.by[0]).eqNullSafe(F.col(_VERSION))).drop(_VERSION)
    order = Window.partitionBy(*_cols(inputs.layer.keys_of_layer)).orderBy(
        *[_col(c).desc_nulls_last() for c in newest.by]
    )
    return (
        rows.withColumn("_ia_rank", F.row_number().over(order))
        .filter("_ia_rank = 1")
        .drop("_ia_rank")
    )


def replaced_rows(
    spark: SparkSession,
    inputs: LayerInputs,
    upserts: DataFrame,
    emptied: frozenset[str],
    since: int,
) -> tuple[DataFrame, DataFrame | None]:
    """``upserts`` with the ``REPLACES`` flag, and the keys of the layer's rows that the
    groups' newest versions in ``upserts`` (and the ``emptied`` files) replace, cached (the
    caller unpersists them); None when the layer has no ``replaces`` or no table yet."""
    newest = newest_spec(inputs)
    if newest is None or not newest.replaces or not inputs.target.exists():
        return upserts, None
    keys = list(inputs.layer.keys_of_layer)
    groups = upserts.groupBy(*_cols(newest.replaces)).agg(F.max(_col(newest.by[0])).alias(_VERSION))
    first = newest.replaces[0]
    files = _files_with_earlier_versions(inputs, first, since)
    if files is not None:
        # Over a landing table only a file loaded before in another version can have rows
        # in the layer: a run of new files alone reads nothing of the layer.
        if not files and not emptied:
            return upserts, None
        groups = groups.filter(_col(first).isin(sorted(files)))
    touched = groups.select(_col(first))
    if emptied and first.lower() == SOURCE_FILE.lower():
        files = local_rows(spark, [{"f": f} for f in sorted(emptied)], _FILES)
        touched = touched.unionByName(files.select(F.col("f").alias(first)))
    held = inputs.target.to_spark(spark, holding=delta_io.touched_keys(touched, [first]))
    older = _older_than_version(held, groups, newest)
    if emptied:
        older = older.unionByName(held.filter(_col(SOURCE_FILE).isin(sorted(emptied))))
    # Kept in the executors' memory: the MERGE's source must not read the table it writes.
    stale = older.select(*_cols(keys)).distinct().cache()
    stale.count()
    return _flagged(upserts, stale, keys), stale


def _files_with_earlier_versions(inputs: LayerInputs, first: str, since: int) -> set[str] | None:
    """Over a landing table whose files are the groups: the files loaded after upstream
    version ``since`` of which another version was loaded too (from the loads' records and
    the file index); None for any other upstream (every group may have rows)."""
    if not inputs.upstream_landing or first.lower() != SOURCE_FILE.lower():
        return None
    return set(rewritten_files(inputs.upstream, since))


def newer(by: Sequence[str]) -> str:
    """SQL: the upsert ``s`` is newer than the layer's row ``t`` by the ``by`` columns
    (compared in order; a null is older than any value)."""
    condition = "FALSE"
    for column in reversed(by):
        s, t = f"s.{quote(column)}", f"t.{quote(column)}"
        greater = f"({s} > {t} OR ({s} IS NOT NULL AND {t} IS NULL))"
        condition = f"({greater} OR ({s} <=> {t} AND {condition}))"
    return condition


def _older_than_version(held: DataFrame, groups: DataFrame, newest: NewestSpec) -> DataFrame:
    """The layer's rows of ``groups`` older than the group's newest version."""
    named = groups.select(
        *[_col(c).alias(f"_ia_group{i}") for i, c in enumerate(newest.replaces)], _VERSION
    )
    same = [_col(c).eqNullSafe(F.col(f"_ia_group{i}")) for i, c in enumerate(newest.replaces)]
    version = _col(newest.by[0])
    older = version.isNull() | (version < F.col(_VERSION))
    return held.join(named, reduce(lambda a, b: a & b, same) & older, "left_semi")


def _without_emptied(rows: DataFrame, emptied: frozenset[str]) -> DataFrame:
    if not emptied:
        return rows
    return rows.filter(~_col(SOURCE_FILE).isin(sorted(emptied)))


def _flagged(upserts: DataFrame, stale: DataFrame, keys: list[str]) -> DataFrame:
    """``upserts`` with ``REPLACES`` true where ``stale`` holds their key."""
    named = stale.select(*[_col(k).alias(f"_ia_stale{i}") for i, k in enumerate(keys)])
    named = named.withColumn(REPLACES, F.lit(True))
    same = [_col(k).eqNullSafe(F.col(f"_ia_stale{i}")) for i, k in enumerate(keys)]
    joined = upserts.join(named, reduce(lambda a, b: a & b, same), "left")
    return joined.select(
        *[_col(c) for c in upserts.columns],
        F.coalesce(F.col(REPLACES), F.lit(False)).alias(REPLACES),
    )


def _col(name: str) -> Column:
    return F.col(quote(name))


def _cols(names: Sequence[str]) -> list[Column]:
    return [_col(n) for n in names]
