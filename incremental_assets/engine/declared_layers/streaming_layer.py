"""A streaming aggregate layer (``run: streaming``): one Structured Streaming query per
run over its upstream table's folder of files, read with the declared schema; the layer's
aggregates per group and tumbling window of event time, with the window's watermark; each
micro-batch's updated windows merged into the layer's Delta table exactly once
(engine/streaming/batches.py); the checkpoint beside the layer's table
(engine/streaming/checkpoint.py).

A window stays open in the query's state until the watermark (the latest event time seen,
minus the declared delay) passes its end: a late row within the delay updates its window
in the table; a row behind the watermark is dropped and counted (``late_rows_dropped``).
Spark judges a batch's rows against the watermark of the batch before it, so a row behind a
watermark that moved only in the last batch still updates its window.

Example:
    >>> inputs = layer_inputs(project, project.layer("invoice_totals_hourly"))  # doctest: +SKIP
    >>> stream_layer(spark, inputs).late_rows_dropped  # doctest: +SKIP
    0
"""

from __future__ import annotations

import json

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine.declared_layers.aggregate_layer import check_columns, measure
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.delta_lake.io import spark_uri
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import LayerError, StreamCheckpointError
from incremental_assets.engine.streaming.batches import merge_batches
from incremental_assets.engine.streaming.checkpoint import (
    CheckpointState,
    check_matches,
    checkpoint_location,
    declared_query,
    read_checkpoint,
)
from incremental_assets.engine.streaming.progress import StreamResult, summarize
from incremental_assets.engine.streaming.query import run_available_now
from incremental_assets.engine.transforms import quote, to_utc_instants
from incremental_assets.specs.layers import WINDOW_END, WINDOW_START, AggregateLayerSpec
from incremental_assets.specs.models import SourceSpec

_WINDOW = "_ia_window"


def stream_layer(spark: SparkSession, inputs: LayerInputs) -> StreamResult:
    """Run the layer's streaming query once over the files its upstream's folder holds
    and the checkpoint has not seen. Refused, with nothing written, when the checkpoint
    no longer matches the declaration or the layer's table (:class:`StreamCheckpointError`)."""
    layer, source, target = inputs.layer, inputs.source, inputs.target
    assert isinstance(layer, AggregateLayerSpec) and layer.streaming and source is not None
    location = checkpoint_location(target)
    declared = declared_query(layer, source)
    checkpoint = read_checkpoint(spark, location, target)
    check_matches(layer, target, location, checkpoint, declared)
    rows = read_folder(spark, layer, source, checkpoint, location)
    check_columns(layer, rows)
    groups = windowed_aggregates(layer, rows)
    text = json.dumps(declared, sort_keys=True)
    before = _version(target)
    write = merge_batches(
        layer.name, target.spark_path, layer.keys_of_layer, location, text, before is not None
    )
    query_id, reports = run_available_now(layer.name, groups, write, location)
    after = _version(target)
    return summarize(location, query_id, reports, after, committed=after != before)


def read_folder(
    spark: SparkSession,
    layer: AggregateLayerSpec,
    source: SourceSpec,
    checkpoint: CheckpointState,
    location: str,
) -> DataFrame:
    """The upstream's folder as a stream of rows, with the declared schema, zone-less
    times read in the source's zone. A malformed CSV or JSON row fails the run (Spark's
    FAILFAST; ``source.options.mode`` chooses otherwise), as a stream cannot quarantine a
    file it has half read."""
    options = {"mode": "FAILFAST"} if source.format in ("csv", "json") else {}
    options |= dict(source.options)
    if source.landing is not None and source.landing.pattern:
        options["pathGlobFilter"] = source.landing.pattern
    path = spark_uri(str(source.path))
    try:
        rows = (
            spark.readStream.format(source.format)
            .schema(str(source.schema_ddl))
            .options(**options)
            .load(path)
        )
        _ = rows.columns  # analysed now (Spark Connect analyses lazily)
    except AnalysisException as exc:
        if checkpoint.query_id is not None:
            raise StreamCheckpointError(
                layer.name,
                "from",
                location,
                f"the folder {path} of '{layer.upstream}' that the checkpoint was made for "
                f"cannot be read: {_first_line(exc)}",
            ) from None
        raise LayerError(
            layer.name,
            "from",
            f"the folder {path} of '{layer.upstream}' cannot be read: {_first_line(exc)}",
            f"create the folder, or correct source.path of '{layer.upstream}'",
        ) from None
    return rows.transform(to_utc_instants(source.timezone))


def windowed_aggregates(layer: AggregateLayerSpec, rows: DataFrame) -> DataFrame:
    """The layer's aggregates per group and window of ``rows`` (a stream), with the
    watermark on the window's column: the columns the batch aggregate gives (group_by,
    window_start, window_end, the aggregates)."""
    window = layer.window
    assert window is not None and window.watermark is not None
    time = window.column
    watermarked = rows.withWatermark(time, window.spark_delay)
    # Grouped by the window itself: Spark drops a window's state (and rows late for it)
    # once the watermark passes the window's end only when the window is a group key.
    by_window = F.window(F.col(quote(time)), window.spark_duration).alias(_WINDOW)
    groups = watermarked.groupBy(*[F.col(quote(k)) for k in layer.group_by], by_window)
    measures = groups.agg(*[measure(a).alias(a.name) for a in layer.aggregates])
    return measures.select(
        *[F.col(quote(k)) for k in layer.group_by],
        F.col(f"{_WINDOW}.start").alias(WINDOW_START),
        F.col(f"{_WINDOW}.end").alias(WINDOW_END),
        *[F.col(quote(a.name)) for a in layer.aggregates],
    )


def _version(target: DeltaTarget) -> int | None:
    return target.open().version() if target.exists() else None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:500]
