"""A row layer (silver): its SELECT applied to the upstream rows whose keys changed, the
result merged by the layer's keys; keys the SELECT gave before the change and no longer
gives (a deleted upstream row, a row the filter now drops, a key that moved) are deleted.

The SELECT names its upstream; each run binds that name to the changed rows (a common
table expression in front of the query), and every other table or layer it names to that
table as it is at the run (a change to a joined table alone does not refresh the layer's
rows: docs/layers.md).

With ``newest`` (over an upstream keeping every version of a row), the select's rows are
cut to the newest versions first, and the merge replaces a row only with a newer one
(engine/declared_layers/versions.py). A column the select gains (``*`` over an upstream
that gained one) is added to the layer.
"""

from __future__ import annotations

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine.declared_layers import versions
from incremental_assets.engine.declared_layers.changes import changes_since
from incremental_assets.engine.declared_layers.commit import write_layer
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.declared_layers.result import LayerResult
from incremental_assets.engine.errors import LayerError
from incremental_assets.engine.layers import covered_version
from incremental_assets.engine.transforms import quote
from incremental_assets.specs.layers import RowLayerSpec, names_read


def refresh_row_layer(spark: SparkSession, inputs: LayerInputs) -> LayerResult:
    layer = inputs.layer
    assert isinstance(layer, RowLayerSpec)
    since = covered_version(inputs.target, inputs.upstream)
    changes = changes_since(spark, inputs.upstream, inputs.upstream_keys, since)
    if changes is None:
        return LayerResult(since, since)
    emptied = versions.emptied_files(inputs, since)
    after = changes.after.cache()
    rows = layer_rows(spark, inputs, after, emptied).cache()
    replaced = None
    try:
        rows_in = after.count()
        if rows_in == 0 and not changes.first and not emptied and changes.before.isEmpty():
            # Versions that changed no row (compaction, properties): nothing to write.
            return LayerResult(since, since, changes_from=changes.found_by)
        check_keys(layer, rows)
        upserts, replaced = versions.replaced_rows(spark, inputs, rows, emptied, since)
        gone = _keys_gone(spark, inputs, changes, replaced)
        newer = versions.newer(layer.newest.by) if layer.newest else None
        written = write_layer(
            spark, inputs, upserts, gone, changes.until, newer=newer, schema_evolution=True
        )
    finally:
        rows.unpersist()
        after.unpersist()
        if replaced is not None:
            replaced.unpersist()
    return LayerResult.of_commit(since, changes, rows_in, written)


def layer_rows(
    spark: SparkSession,
    inputs: LayerInputs,
    upstream_rows: DataFrame,
    emptied: frozenset[str] = frozenset(),
) -> DataFrame:
    """The layer's rows from ``upstream_rows``: its select's, cut to the newest versions
    when the layer says ``newest`` (``emptied``: landing files whose newest version has no
    rows)."""
    rows = select_rows(spark, inputs, upstream_rows)
    _check_key_columns(inputs.layer, rows)
    versions.check_columns(inputs, rows)
    return versions.newest_rows(inputs, rows, emptied)


def _keys_gone(spark, inputs: LayerInputs, changes, replaced: DataFrame | None):
    """Keys the select gave before the change (and may no longer give), and the keys of the
    layer's rows that newer group versions replace."""
    keys = [quote(k) for k in inputs.layer.keys_of_layer]
    gone = None
    if not changes.first:
        gone = select_rows(spark, inputs, changes.before).select(*keys)
    if replaced is not None:
        gone = replaced.select(*keys) if gone is None else gone.unionByName(replaced.select(*keys))
    return gone


def select_rows(spark: SparkSession, inputs: LayerInputs, upstream_rows: DataFrame) -> DataFrame:
    """The layer's SELECT with its upstream's name bound to ``upstream_rows`` and every
    other table or layer it names bound to that table."""
    layer = inputs.layer
    assert isinstance(layer, RowLayerSpec)
    named = names_read(layer.select)
    tables = [
        f"{quote(name)} AS (SELECT * FROM {_escaped(sql)})"
        for name, sql in inputs.tables.items()
        if name.lower() in named and name != layer.upstream
    ]
    # The query goes through PySpark's SQL formatter (the rows as {rows}, which works
    # through Spark Connect too): braces of the user's text are escaped for it.
    query = _escaped(layer.select)
    statement = (
        f"WITH {', '.join([f'{quote(layer.upstream)} AS (SELECT * FROM {{rows}})', *tables])} "
        f"SELECT * FROM (\n{query}\n) AS ia_layer_rows"
    )
    try:
        frame = spark.sql(statement, rows=upstream_rows)
        _ = frame.columns  # analysed now (Spark Connect analyses lazily): errors name the layer
        return frame
    except AnalysisException as exc:
        raise LayerError(
            layer.name,
            "select",
            f"Spark cannot run the select over '{layer.upstream}': {_first_line(exc)}",
            "name only columns of the upstream and tables or layers of the project",
        ) from None


def _check_key_columns(layer: RowLayerSpec, rows: DataFrame) -> None:
    missing = [k for k in layer.keys if k.lower() not in {c.lower() for c in rows.columns}]
    if missing:
        raise LayerError(
            layer.name,
            "keys",
            f"the select gives no column {', '.join(missing)} (it gives {', '.join(rows.columns)})",
            "list columns of the select as keys, or select them",
        )


def check_keys(layer: RowLayerSpec, rows: DataFrame, fix: str | None = None) -> None:
    """Raise a :class:`LayerError` naming up to three keys the select gives more than one
    row for (``fix``: what to change, when not the batch layer's)."""
    keys = [F.col(quote(k)) for k in layer.keys]
    twice = rows.groupBy(*keys).count().filter("count > 1").limit(3).collect()
    if twice:
        sample = ", ".join(str(tuple(r[k] for k in layer.keys)) for r in twice)
        raise LayerError(
            layer.name,
            "keys",
            f"the select gives more than one row for a key ({sample})",
            fix
            or "add the columns that tell those rows apart to keys, make the select give one "
            "row per key, or keep the newest row of a key with newest.by",
        )


def _escaped(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:500]
