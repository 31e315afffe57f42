"""What a streaming layer's query reads: its upstream table's folder of files, or its
upstream's Delta table.

- A table whose source is a folder of CSV, JSON or Parquet files: the folder, with the
  declared schema or the one the layer's first run inferred and kept
  (engine/declared_layers/streaming_layer.py says how files are taken).
- Any other upstream (a layer, a table loaded from a database or a Delta source): the
  upstream's Delta table, from its first version. Where the upstream records its change
  data feed (every layer does), the stream reads the feed: an insert or an update's new
  row counts once, an update's old row or a deleted row counts against its group (the
  aggregates subtract it: :data:`SIGN`), so the layer follows updates and deletes. Without
  a feed the stream reads appended rows only, and fails naming the fix at the first
  upstream commit that updated or deleted rows.

Each reader also gives the entries of the declared query that name what it reads
(engine/streaming/checkpoint.py): a change to them needs the checkpoint reset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.delta_lake.io import spark_uri
from incremental_assets.engine.errors import LayerError, StreamCheckpointError
from incremental_assets.engine.sources.delta_log import change_feed_enabled
from incremental_assets.engine.sources.files import reader_options
from incremental_assets.engine.streaming.checkpoint import (
    QUERY,
    CheckpointState,
    folder_query,
    last_stream_commit,
)
from incremental_assets.engine.transforms import to_utc_instants
from incremental_assets.specs.layers import RETRACTABLE, AggregateLayerSpec
from incremental_assets.specs.models import SourceSpec

# +1 for a row that counts toward its group, -1 for one an update replaced or a delete
# removed (change data feed only).
SIGN = "_ia_sign"
CHANGE_FEED = "change data feed"
APPENDS = "appended rows"
# Spark's file source skips files older than this behind the newest it has seen.
_NO_AGE_LIMIT = "36500d"
# The change data feed's own columns.
FEED_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


@dataclass(frozen=True)
class StreamedRows:
    """``rows``: the stream (with :data:`SIGN` when ``signed``); ``query``: the declared
    query's entries for the source."""

    rows: DataFrame
    query: dict[str, str]
    signed: bool = False


def streamed_rows(
    spark: SparkSession, inputs: LayerInputs, checkpoint: CheckpointState, location: str
) -> StreamedRows | None:
    """The stream the layer's query reads (None: a folder without a schema declared or
    kept, and no file yet to infer one from: nothing to read)."""
    source = inputs.source
    if source is not None and source.streams_files:
        return folder_stream(spark, inputs, checkpoint, location)
    return read_table(spark, inputs)


def folder_stream(
    spark: SparkSession,
    inputs: LayerInputs,
    checkpoint: CheckpointState,
    location: str,
    one_file_per_batch: bool = False,
) -> StreamedRows | None:
    """The upstream's folder as a stream (:func:`read_folder`) with the schema of
    :func:`folder_schema` (None: no schema yet and no file to infer one from)."""
    source = inputs.source
    assert source is not None and source.streams_files
    schema = folder_schema(spark, inputs, checkpoint, location)
    if schema is None:
        return None
    rows = read_folder(spark, inputs, checkpoint, location, schema, one_file_per_batch)
    return StreamedRows(rows, folder_query(source, schema))


def folder_schema(
    spark: SparkSession, inputs: LayerInputs, checkpoint: CheckpointState, location: str
) -> str | None:
    """The schema the layer's stream reads its folder with: ``source.schema`` (Spark DDL);
    without one, the schema its first run inferred, kept in the layer's commits (the
    recorded query's ``source.schema``, Spark's JSON form of a schema: inferred once, so
    that every batch, and the query's state, sees the same columns); else inferred now
    from the folder's files as a batch read of the table's source would (a CSV header's
    columns as text unless ``source.options.inferSchema``; every Parquet footer). None:
    no file yet."""
    source = inputs.source
    assert source is not None
    if source.schema_ddl is not None:
        return str(source.schema_ddl)
    record = last_stream_commit(inputs.target)
    kept = json.loads(str(record[QUERY])).get("source.schema") if record else None
    if kept:
        return str(kept)
    path = spark_uri(str(source.path))
    try:
        reader = spark.read.format(source.format).options(**_reading(source))
        schema = reader.load(path).schema
    except AnalysisException as exc:
        if "UNABLE_TO_INFER_SCHEMA" in str(exc):
            return None
        if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
            raise _unreadable(inputs, checkpoint, location, path, exc) from None
        layer = inputs.layer
        raise LayerError(
            layer.name,
            "from",
            f"the schema of the files in {path} of '{layer.upstream}' cannot be inferred: "
            f"{_first_line(exc)}",
            f"declare source.schema of '{layer.upstream}' (Spark DDL), or rewrite the files "
            "whose columns disagree",
        ) from None
    return schema.json() if schema.fields else None


def _reading(source: SourceSpec, stream: bool = False) -> dict[str, str]:
    """The reader options of the upstream's folder: a batch read's
    (``files.reader_options``) and the landing pattern; a stream's also fail on a
    malformed CSV or JSON row (FAILFAST) and skip no file for its age (Spark's file
    source skips a file 7 days older than the newest it has seen, ``maxFileAge``, and a
    file moved in keeps its time), unless ``source.options`` say otherwise."""
    options: dict[str, str] = {}
    if stream:
        options["maxFileAge"] = _NO_AGE_LIMIT
        if source.format in ("csv", "json"):
            options["mode"] = "FAILFAST"
    options |= reader_options(source)
    if source.landing is not None and source.landing.pattern:
        options["pathGlobFilter"] = source.landing.pattern
    return options


def as_schema(text: str) -> str | StructType:
    """A schema as :func:`folder_schema` gives it, for a reader: DDL text, or a kept
    inferred schema (JSON)."""
    return StructType.fromJson(json.loads(text)) if text.lstrip().startswith("{") else text


def read_folder(
    spark: SparkSession,
    inputs: LayerInputs,
    checkpoint: CheckpointState,
    location: str,
    schema: str,
    one_file_per_batch: bool = False,
) -> DataFrame:
    """The upstream's folder as a stream of rows, with ``schema`` (:func:`folder_schema`),
    zone-less times read in the source's zone. A malformed CSV or JSON row fails the run
    (Spark's FAILFAST; ``source.options.mode`` chooses otherwise), as a stream cannot
    quarantine a file it has half read. ``one_file_per_batch``: each batch reads one
    file, oldest first, unless ``source.options`` paces batches otherwise
    (maxFilesPerTrigger, maxBytesPerTrigger)."""
    source = inputs.source
    assert source is not None
    options = _reading(source, stream=True)
    paced = {k.lower() for k in source.options} & {"maxfilespertrigger", "maxbytespertrigger"}
    if one_file_per_batch and not paced:
        options["maxFilesPerTrigger"] = "1"
    path = spark_uri(str(source.path))
    try:
        reader = spark.readStream.format(source.format).schema(as_schema(schema))
        rows = reader.options(**options).load(path)
        _ = rows.columns  # analysed now (Spark Connect analyses lazily)
    except AnalysisException as exc:
        raise _unreadable(inputs, checkpoint, location, path, exc) from None
    return rows.transform(to_utc_instants(source.timezone))


def _unreadable(
    inputs: LayerInputs, checkpoint: CheckpointState, location: str, path: str, exc: Exception
) -> LayerError:
    """The error for a folder the stream cannot read: the checkpoint's folder gone, or a
    folder to create or correct."""
    layer = inputs.layer
    if checkpoint.query_id is not None:
        return StreamCheckpointError(
            layer.name,
            "from",
            location,
            f"the folder {path} of '{layer.upstream}' that the checkpoint was made for "
            f"cannot be read: {_first_line(exc)}",
        )
    return LayerError(
        layer.name,
        "from",
        f"the folder {path} of '{layer.upstream}' cannot be read: {_first_line(exc)}",
        f"create the folder, or correct source.path of '{layer.upstream}'",
    )


def table_stream(spark: SparkSession, inputs: LayerInputs) -> StreamedRows:
    """The upstream's Delta table as a stream: its change data feed where it records one
    (``signed``; the feed's own columns kept, no :data:`SIGN`), else its appended rows."""
    upstream = inputs.upstream
    inputs.require_upstream()
    feed = change_feed_enabled(upstream.open().metadata().configuration)
    query = {"source.table": str(upstream.path), "source.read": CHANGE_FEED if feed else APPENDS}
    reader = spark.readStream.format("delta")
    if feed:
        reader = reader.option("readChangeFeed", "true")
    return StreamedRows(reader.load(upstream.spark_path), query, signed=feed)


def read_table(spark: SparkSession, inputs: LayerInputs) -> StreamedRows:
    """The upstream's Delta table as a stream: its change data feed, signed, where it
    records one, else its appended rows."""
    layer = inputs.layer
    assert isinstance(layer, AggregateLayerSpec)
    stream = table_stream(spark, inputs)
    if not stream.signed:
        return stream
    kept = [a.name for a in layer.aggregates if a.function not in RETRACTABLE]
    if kept:
        raise LayerError(
            layer.name,
            "aggregates",
            f"{', '.join(kept)}: the upstream '{layer.upstream}' records its change data feed, "
            "which the stream reads, subtracting the rows an update or a delete replaced; "
            "only sum and count can be subtracted",
            "use sum and count, or set run: batch",
        )
    gone = F.col("_change_type").isin("update_preimage", "delete")
    signed = stream.rows.withColumn(SIGN, F.when(gone, F.lit(-1)).otherwise(F.lit(1)))
    return StreamedRows(signed.drop(*FEED_COLUMNS), stream.query, signed=True)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:500]
