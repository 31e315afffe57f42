"""An aggregate layer (gold): its aggregates per group (and window), where a run
recomputes only the groups the upstream's changes touched, from the upstream as it is now,
and deletes the touched groups that no longer have a row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine.declared_layers.changes import changes_since, having_keys
from incremental_assets.engine.declared_layers.commit import write_layer
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.declared_layers.result import WINDOWS_LISTED, LayerResult
from incremental_assets.engine.errors import LayerError
from incremental_assets.engine.layers import covered_version
from incremental_assets.engine.transforms import quote
from incremental_assets.specs.layers import (
    WINDOW_END,
    WINDOW_START,
    AggregateLayerSpec,
    AggregateSpec,
)


def refresh_aggregate_layer(spark: SparkSession, inputs: LayerInputs) -> LayerResult:
    layer = inputs.layer
    assert isinstance(layer, AggregateLayerSpec)
    since = covered_version(inputs.target, inputs.upstream)
    changes = changes_since(spark, inputs.upstream, inputs.upstream_keys, since)
    if changes is None:
        return LayerResult(since, since)
    check_columns(layer, changes.after)
    keys = list(layer.keys_of_layer)
    if changes.first:
        groups = aggregate(layer, changes.after).cache()
        touched = None
    else:
        touched = (
            placed(layer, changes.before)
            .select(*keys)
            .unionByName(placed(layer, changes.after).select(*keys))
            .distinct()
            .cache()
        )
        current = inputs.upstream.to_spark(spark, version=changes.until)
        current = having_keys(placed(layer, near(layer, current, touched)), touched, keys)
        groups = aggregate(layer, current, placed_already=True).cache()
    try:
        rows_in = changes.after.count()
        count = groups.count()
        if not changes.first and count == 0 and touched.isEmpty():
            return LayerResult(since, since, rows_in, changes_from=changes.found_by)
        windows = _windows(layer, groups if touched is None else touched)
        written = write_layer(spark, inputs, groups, touched, changes.until)
    finally:
        groups.unpersist()
        if touched is not None:
            touched.unpersist()
    return LayerResult.of_commit(
        since, changes, rows_in, written, groups_recomputed=count, windows=windows
    )


def _windows(layer: AggregateLayerSpec, groups: DataFrame) -> tuple[datetime, ...]:
    """The starts of the windows of ``groups`` (the earliest ``WINDOWS_LISTED``), as UTC
    instants (read as microseconds: a collected timestamp would be turned into the
    driver's local time)."""
    if layer.window is None:
        return ()
    starts = (
        groups.select(F.unix_micros(F.col(WINDOW_START)).alias("start"))
        .where(F.col("start").isNotNull())
        .distinct()
        .orderBy("start")
        .limit(WINDOWS_LISTED)
        .collect()
    )
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return tuple(epoch + timedelta(microseconds=r["start"]) for r in starts)


def placed(layer: AggregateLayerSpec, rows: DataFrame) -> DataFrame:
    """``rows`` with their window's bounds (when the layer has a window)."""
    if layer.window is None:
        return rows
    window = F.window(F.col(quote(layer.window.column)), layer.window.spark_duration)
    return rows.withColumn(WINDOW_START, window.start).withColumn(WINDOW_END, window.end)


def aggregate(
    layer: AggregateLayerSpec, rows: DataFrame, placed_already: bool = False
) -> DataFrame:
    """The layer's aggregates per group of ``rows`` (computed from scratch over them)."""
    rows = rows if placed_already else placed(layer, rows)
    keys = [F.col(quote(k)) for k in layer.keys_of_layer]
    return rows.groupBy(*keys).agg(*[measure(a).alias(a.name) for a in layer.aggregates])


def measure(spec: AggregateSpec) -> Column:
    if spec.column is None:
        return F.count(F.lit(1))
    column = F.col(quote(spec.column))
    # count_distinct is exact: a run recomputes a touched group from all its rows.
    functions = {"sum": F.sum, "count": F.count, "count_distinct": F.count_distinct}
    return {**functions, "min": F.min, "max": F.max}[spec.function](column)


def near(layer: AggregateLayerSpec, rows: DataFrame, touched: DataFrame) -> DataFrame:
    """``rows`` within the touched windows' span (Delta skips the files outside it by
    their statistics); all of them without a window."""
    if layer.window is None:
        return rows
    low, high = touched.agg(F.min(WINDOW_START), F.max(WINDOW_END)).first()
    time = F.col(quote(layer.window.column))
    if low is None:
        return rows.filter(time.isNull())
    return rows.filter(time.isNull() | ((time >= F.lit(low)) & (time < F.lit(high))))


def check_columns(layer: AggregateLayerSpec, rows: DataFrame) -> None:
    have = {c.lower() for c in rows.columns}
    named = [("group_by", c) for c in layer.group_by]
    named += [("aggregates", a.column) for a in layer.aggregates if a.column]
    named += [("window.column", layer.window.column)] if layer.window else []
    for field, column in named:
        if column.lower() not in have:
            raise LayerError(
                layer.name,
                field,
                f"the upstream '{layer.upstream}' has no column {column!r} (it has "
                f"{', '.join(rows.columns)})",
                "name a column of the upstream",
            )
