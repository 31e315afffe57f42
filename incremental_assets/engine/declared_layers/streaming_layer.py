"""A streaming aggregate layer (``run: streaming``): one Structured Streaming query per
run over its upstream table's folder of files (read with the declared schema) or its
upstream's Delta table (engine/declared_layers/stream_sources.py); the layer's
aggregates per group and tumbling window of event time, with the window's watermark; each
micro-batch's updated windows merged into the layer's Delta table exactly once
(engine/streaming/batches.py); the checkpoint beside the layer's table
(engine/streaming/checkpoint.py).

A window stays open in the query's state until the watermark (the latest event time seen,
minus the declared delay) passes its end: a late row within the delay updates its window
in the table; a row behind the watermark is dropped and counted (``late_rows_dropped``).
Spark judges a batch's rows against the watermark of the batch before it, so a row behind a
watermark that moved only in the last batch still updates its window.

Over a Delta change data feed a row an update replaced or a delete removed is subtracted
from its group (sum and count only), and a group left with no row is deleted from the
layer; a change to a row whose window the watermark has closed is dropped and counted like
any late row.

Example:
    >>> inputs = layer_inputs(project, project.layer("invoice_totals_hourly"))  # doctest: +SKIP
    >>> stream_layer(spark, inputs).late_rows_dropped  # doctest: +SKIP
    0
"""

from __future__ import annotations

import json

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampNTZType, TimestampType

from incremental_assets.engine.declared_layers.aggregate_layer import check_columns, measure
from incremental_assets.engine.declared_layers.commit import NEW_TABLE_OPTIONS
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.declared_layers.stream_sources import SIGN, streamed_rows
from incremental_assets.engine.declared_layers.streaming_rows import stream_row_layer
from incremental_assets.engine.errors import LayerError
from incremental_assets.engine.streaming.batches import HELD, merge_batches
from incremental_assets.engine.streaming.checkpoint import (
    check_matches,
    checkpoint_location,
    declared_query,
    read_checkpoint,
)
from incremental_assets.engine.streaming.progress import StreamResult, summarize
from incremental_assets.engine.streaming.query import run_available_now
from incremental_assets.engine.transforms import quote
from incremental_assets.specs.layers import (
    WINDOW_END,
    WINDOW_START,
    AggregateLayerSpec,
    AggregateSpec,
    RowLayerSpec,
)

_WINDOW = "_ia_window"


def stream_layer(spark: SparkSession, inputs: LayerInputs) -> StreamResult:
    """Run the layer's streaming query once over what its source holds and the checkpoint
    has not seen (engine/declared_layers/stream_sources.py; a row layer's:
    engine/declared_layers/streaming_rows.py). Refused, with nothing
    written, when the checkpoint no longer matches the declaration or the layer's table
    (:class:`StreamCheckpointError`)."""
    layer, target = inputs.layer, inputs.target
    if isinstance(layer, RowLayerSpec):
        return stream_row_layer(spark, inputs)
    assert isinstance(layer, AggregateLayerSpec) and layer.streaming
    location = checkpoint_location(target)
    checkpoint = read_checkpoint(spark, location, target)
    source = streamed_rows(spark, inputs, checkpoint, location)
    if source is None:  # no file yet to infer the folder's schema from: nothing to read
        return StreamResult(location, version=target.current_version())
    declared = declared_query(layer, source.query)
    check_matches(layer, target, location, checkpoint, declared)
    check_columns(layer, source.rows)
    check_event_time(layer, source.rows)
    groups = windowed_aggregates(layer, source.rows, signed=source.signed)
    text = json.dumps(declared, sort_keys=True)
    before = target.current_version()
    write = merge_batches(
        layer.name,
        target.spark_path,
        layer.keys_of_layer,
        location,
        text,
        before is not None,
        counted=source.signed,
        # Like a batch layer's table, it records its change data feed for the layers after it.
        new_table=NEW_TABLE_OPTIONS,
    )
    query_id, reports = run_available_now(layer.name, groups, write, location)
    after = target.current_version()
    return summarize(location, query_id, reports, after, committed=after != before)


def check_event_time(layer: AggregateLayerSpec, rows: DataFrame) -> None:
    """Refuse a window column that is not a timestamp (a CSV column read as text, when the
    folder's schema was inferred from its header): Spark's watermark needs event times."""
    assert layer.window is not None
    column = layer.window.column.lower()
    kind = next(f.dataType for f in rows.schema.fields if f.name.lower() == column)
    if not isinstance(kind, (TimestampType, TimestampNTZType)):
        raise LayerError(
            layer.name,
            "window.column",
            f"the upstream '{layer.upstream}''s column {layer.window.column!r} is "
            f"{kind.simpleString()}, not a timestamp: a streaming window's watermark "
            "needs event times",
            f"declare source.schema of '{layer.upstream}' with {layer.window.column} "
            "TIMESTAMP (Spark DDL), then reset the layer if it ran "
            f"(incremental-assets reset-layer {layer.name})",
        )


def windowed_aggregates(
    layer: AggregateLayerSpec, rows: DataFrame, signed: bool = False
) -> DataFrame:
    """The layer's aggregates per group and window of ``rows`` (a stream), with the
    watermark on the window's column: the columns the batch aggregate gives (group_by,
    window_start, window_end, the aggregates). ``signed``: ``rows`` carry a sign (a change
    data feed), each row added to its group or subtracted from it, and :data:`HELD`
    counts the rows a group still holds (0: the layer deletes the group)."""
    window = layer.window
    assert window is not None and window.watermark is not None
    time = window.column
    watermarked = rows.withWatermark(time, window.spark_delay)
    # Grouped by the window itself: Spark drops a window's state (and rows late for it)
    # once the watermark passes the window's end only when the window is a group key.
    by_window = F.window(F.col(quote(time)), window.spark_duration).alias(_WINDOW)
    groups = watermarked.groupBy(*[F.col(quote(k)) for k in layer.group_by], by_window)
    if signed:
        sign = F.col(SIGN)
        measures = [signed_measure(a, sign).alias(a.name) for a in layer.aggregates]
        measures.append(F.sum(sign).alias(HELD))
    else:
        measures = [measure(a).alias(a.name) for a in layer.aggregates]
    return groups.agg(*measures).select(
        *[F.col(quote(k)) for k in layer.group_by],
        F.col(f"{_WINDOW}.start").alias(WINDOW_START),
        F.col(f"{_WINDOW}.end").alias(WINDOW_END),
        *[F.col(quote(a.name)) for a in layer.aggregates],
        *([F.col(HELD)] if signed else []),
    )


def signed_measure(spec: AggregateSpec, sign: Column) -> Column:
    """A retractable aggregate over signed rows: a row with sign -1 takes back what the
    same row with sign +1 added."""
    if spec.column is None:
        return F.sum(sign)
    column = F.col(quote(spec.column))
    if spec.function == "count":
        return F.sum(F.when(column.isNotNull(), sign).otherwise(F.lit(0)))
    assert spec.function == "sum", spec.function
    return F.sum(F.when(sign < 0, -column).otherwise(column))
