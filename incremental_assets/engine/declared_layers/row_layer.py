"""A row layer (silver): its SELECT applied to the upstream rows whose keys changed, the
result merged by the layer's keys; keys the SELECT gave before the change and no longer
gives (a deleted upstream row, a row the filter now drops, a key that moved) are deleted.

The SELECT names its upstream; each run binds that name to the changed rows (a common
table expression in front of the query), and every other table or layer it names to that
table as it is at the run (a change to a joined table alone does not refresh the layer's
rows: docs/layers.md).
"""

from __future__ import annotations

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

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
    after = changes.after.cache()
    rows = select_rows(spark, inputs, after).cache()
    try:
        rows_in = after.count()
        if rows_in == 0 and not changes.first and changes.before.isEmpty():
            # Versions that changed no row (compaction, properties): nothing to write.
            return LayerResult(since, since, changes_from=changes.found_by)
        _check_keys(layer, rows)
        gone = None if changes.first else select_rows(spark, inputs, changes.before)
        written = write_layer(spark, inputs, rows, gone, changes.until)
    finally:
        rows.unpersist()
        after.unpersist()
    return LayerResult(
        upstream_from=since,
        upstream_to=changes.until if written.version is not None else since,
        rows_in=rows_in,
        rows_inserted=written.inserted,
        rows_updated=written.updated,
        rows_deleted=written.deleted,
        version=written.version,
        changes_from=changes.found_by,
    )


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


def _check_keys(layer: RowLayerSpec, rows: DataFrame) -> None:
    missing = [k for k in layer.keys if k.lower() not in {c.lower() for c in rows.columns}]
    if missing:
        raise LayerError(
            layer.name,
            "keys",
            f"the select gives no column {', '.join(missing)} (it gives {', '.join(rows.columns)})",
            "list columns of the select as keys, or select them",
        )
    keys = [F.col(quote(k)) for k in layer.keys]
    twice = rows.groupBy(*keys).count().filter("count > 1").limit(3).collect()
    if twice:
        sample = ", ".join(str(tuple(r[k] for k in layer.keys)) for r in twice)
        raise LayerError(
            layer.name,
            "keys",
            f"the select gives more than one row for a key ({sample})",
            "add the columns that tell those rows apart to keys, or make the select give one "
            "row per key",
        )


def _escaped(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:500]
