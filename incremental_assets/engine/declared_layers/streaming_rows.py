"""A streaming row layer (``kind: row``, ``run: streaming``): one Structured Streaming
query per run over the upstream's Delta table (or, ``reads: files``, the upstream table's
folder of files), ``trigger(availableNow=True)``; each micro-batch's changes go through the
layer's SELECT and are merged into the layer's Delta table by its keys, exactly once.

What a batch holds depends on what the query reads (engine/declared_layers/stream_sources.py):

- with ``reads: files``, the **new files of the upstream table's folder** (a table whose
  source is a folder of CSV, JSON or Parquet files), read as they arrive with the declared
  schema (or the one the first run inferred and kept): the SELECT over their rows,
  upserted by key. The folder's table need not be loaded at all: the layer is that folder
  streamed into Delta (Spark's file source keeps the files it read in the checkpoint).
  A batch reads one file, oldest first, unless the source's options pace it otherwise;
  rows of one key in one batch fail the run, naming the key: they have no order;
- its **change data feed** (every layer records one; a table where
  ``delta.enableChangeDataFeed`` is set): for each upstream key the batch changed, the row
  as the batch's first change found it (an update's old row, a deleted row; none when the
  batch inserted the key) and as its last change left it (none when it deleted the key),
  in commit order. The SELECT over the rows as they are now gives the upserts; keys it
  gave over the rows as they were and no longer gives (a deleted row, a row the filter now
  drops, a key that moved) are deleted. The same rule as a batch row layer's
  (engine/declared_layers/row_layer.py), over the batch's changes;
- its **appended rows** (a table without a feed): the SELECT over them, upserted by key.
  A commit that updates or deletes upstream rows fails the run, with nothing written,
  naming the fix (turn the feed on and reset the layer, or ``run: batch``).

Exactly once: each batch's MERGE is Delta's idempotent write
``(incremental_assets/<layer>#stream/<query id>, <batch id>)``
(engine/streaming/batches.py says why), so a batch replayed after a kill commits nothing;
each commit records the declared query (source, select, keys), which a later run compares
with the declaration before it starts (engine/streaming/checkpoint.py).

The run's result counts the rows its commits inserted, updated and deleted (from the
commits' own metrics) and the upstream version it covered (from the query's last offset):
the version the reconciliation check counts the SELECT at (none for files).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from incremental_assets.engine.declared_layers.commit import write_rows
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.declared_layers.row_layer import check_keys, layer_rows, select_rows
from incremental_assets.engine.declared_layers.stream_sources import (
    FEED_COLUMNS,
    folder_stream,
    table_stream,
)
from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.spark.local_rows import no_rows
from incremental_assets.engine.streaming.batches import stream_app_id
from incremental_assets.engine.streaming.checkpoint import (
    BATCH_ID,
    QUERY,
    QUERY_ID,
    check_matches,
    checkpoint_location,
    declared_query,
    query_id_of,
    read_checkpoint,
)
from incremental_assets.engine.streaming.progress import StreamResult, summarize
from incremental_assets.engine.streaming.query import run_available_now
from incremental_assets.engine.transforms import quote
from incremental_assets.specs.layers import RowLayerSpec

_FIRST, _LAST = "_ia_first_change", "_ia_last_change"
# A change's place within its commit: an update's old row (and a delete) before its new row.
_STEP = "_ia_change_step"


def stream_row_layer(spark: SparkSession, inputs: LayerInputs) -> StreamResult:
    """Run the layer's streaming query once over the upstream commits its checkpoint has
    not seen. Refused, with nothing written, when the checkpoint no longer matches the
    declaration or the layer's table (:class:`StreamCheckpointError`), or when the select
    cannot run over the upstream (:class:`LayerError`)."""
    layer, target = inputs.layer, inputs.target
    assert isinstance(layer, RowLayerSpec) and layer.streaming
    location = checkpoint_location(target)
    checkpoint = read_checkpoint(spark, location, target)
    if layer.reads == "files":
        # A file at a time (unless source.options pace otherwise): a later file's row of a
        # key then replaces an earlier file's, as files arrived.
        files = folder_stream(spark, inputs, checkpoint, location, one_file_per_batch=True)
        if files is None:  # no file yet to infer the folder's schema from: nothing to read
            return StreamResult(location, version=target.current_version())
        source, upstream_version = files, None
        empty = no_rows(spark, source.rows.schema)
    else:
        source = table_stream(spark, inputs)
        upstream_version = inputs.upstream.open().version()
        empty = inputs.upstream.to_spark(spark, version=upstream_version).limit(0)
    declared = declared_query(layer, source.query)
    check_matches(layer, target, location, checkpoint, declared)
    # The select analysed (and its keys checked) before the query starts: an error names
    # the layer rather than surfacing from inside a batch.
    layer_rows(spark, inputs, empty)
    before = target.current_version()
    write = merge_row_batches(
        inputs,
        location,
        json.dumps(declared, sort_keys=True),
        changes=source.signed,
        exists=before is not None,
        files=layer.reads == "files",
    )
    query_id, reports = run_available_now(layer.name, source.rows, write, location)
    after = target.current_version()
    result = summarize(location, query_id, reports, after, committed=after != before)
    return replace(
        result,
        rows_out=rows_written(target, before, after),
        upstream_version=None
        if upstream_version is None
        else covered_version(reports, upstream_version),
    )


def merge_row_batches(
    inputs: LayerInputs,
    checkpoint: str,
    declared: str,
    changes: bool,
    exists: bool,
    files: bool = False,
) -> Callable[[DataFrame, int], None]:
    """The ``foreachBatch`` function: a batch of upstream rows (``changes``: of change
    data feed rows; ``files``: of a folder's files) through the select, merged by the
    layer's keys as the idempotent write of its batch id, recording ``declared`` (the
    query, as JSON). The first batch creates the table unless it ``exists``."""
    layer = inputs.layer
    keys = [quote(k) for k in layer.keys_of_layer]
    found: dict[str, object] = {"created": exists}
    fix = _files_fix(layer.name) if files else None

    def write(batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        if QUERY_ID not in found:
            found[QUERY_ID] = query_id_of(spark, checkpoint)
        query_id = str(found[QUERY_ID])
        # Read once, held by the executors: the select (bound through Spark SQL) and the
        # merge would each read the source again (a persisted batch is not matched there),
        # and the query would report its rows as many times.
        batch = batch.localCheckpoint()
        if batch.isEmpty() and found["created"]:
            return
        before, after = images(batch, inputs.upstream_keys) if changes else (None, batch)
        rows = layer_rows(spark, inputs, after)
        check_keys(layer, rows, fix)
        gone = None if before is None else select_rows(spark, inputs, before).select(*keys)
        record = {"layer": layer.name, QUERY: declared, QUERY_ID: query_id, BATCH_ID: batch_id}
        commit = {
            "app_id": stream_app_id(layer.name, query_id),
            "version": batch_id,
            "metadata": delta_commits.record(record),
        }
        # The first batch creates the table, rows or none: the checkpoint's batches and
        # the table's commits stay together (and a folder's inferred schema is kept).
        write_rows(spark, inputs, rows, gone, commit, schema_evolution=True)
        found["created"] = True

    return write


def _files_fix(layer: str) -> str:
    return (
        "a batch reads one file (unless source.options.maxFilesPerTrigger or "
        "maxBytesPerTrigger say more) and a later file's row of a key replaces an earlier "
        "file's, but within a batch rows have no order: rewrite the batch's file with one "
        "row per key (the next run reads the batch again, its file as it is then), or make "
        "the select give one row per key (or add columns to keys) and reset the layer "
        f"(incremental-assets reset-layer {layer}), as a changed select needs"
    )


def images(changes: DataFrame, keys: Sequence[str]) -> tuple[DataFrame, DataFrame]:
    """Of change data feed rows: ``before``, each changed key's row before the first change
    (an update's old row or a deleted row; none when the first change inserted it), and
    ``after``, the row the last change left (none when it deleted the key); without the
    feed's columns. With no upstream ``keys``, every old row and every new row."""
    old = F.col("_change_type").isin("update_preimage", "delete")
    if not keys:
        plain = [c for c in changes.columns if c not in FEED_COLUMNS]
        return changes.where(old).select(*plain), changes.where(~old).select(*plain)
    by_key = Window.partitionBy(*[F.col(quote(k)) for k in keys])
    step = F.when(old, F.lit(0)).otherwise(F.lit(1))
    ranked = (
        changes.withColumn(_STEP, step)
        .withColumn(_FIRST, F.row_number().over(by_key.orderBy("_commit_version", _STEP)))
        .withColumn(
            _LAST,
            F.row_number().over(
                by_key.orderBy(F.col("_commit_version").desc(), F.col(_STEP).desc())
            ),
        )
    )
    drop = [*FEED_COLUMNS, _STEP, _FIRST, _LAST]
    before = ranked.where((F.col(_FIRST) == 1) & old).drop(*drop)
    after = ranked.where((F.col(_LAST) == 1) & ~old).drop(*drop)
    return before, after


def covered_version(reports: Sequence[Any], unchanged: int) -> int:
    """The upstream version the run's query read up to, from the last batch's end offset
    (``unchanged``, the upstream's version before the query started, when no batch ran:
    then no row changed since the last batch)."""
    ran = [r for r in reports if "addBatch" in (r.durationMs or {}) and r.sources]
    if not ran:
        return unchanged
    offset = _as_dict(ran[-1].sources[-1].endOffset)
    # Delta's offset: the version and the index of the last file of it read, -1 for none
    # (a query that read every change of version 3 ends at (3, <its last file>), or at
    # (4, -1) when version 3 added no data file). availableNow ends at the offset the
    # source had when the query started: its last version whole.
    version, index = int(offset["reservoirVersion"]), int(offset.get("index", -1))
    return version if index >= 0 else version - 1


def _as_dict(offset: Any) -> dict[str, Any]:
    """A source offset as PySpark gives it: a dict, its JSON, or (classic PySpark 4) the
    text of a Python dict."""
    if not isinstance(offset, str):
        return dict(offset)
    try:
        return json.loads(offset)
    except json.JSONDecodeError:
        return ast.literal_eval(offset)


def rows_written(target: DeltaTarget, before: int | None, after: int | None) -> int:
    """Rows the layer's commits after version ``before`` inserted, updated and deleted
    (their own metrics: no read of the table)."""
    if after is None or after == before:
        return 0
    count = after - (before if before is not None else -1)
    total = 0
    for commit in target.open().history(count):
        metrics = commit.get("operationMetrics") or {}
        if commit.get("operation") == "MERGE":
            names = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
        else:
            names = ("numOutputRows",)
        total += sum(int(metrics.get(n, 0) or 0) for n in names)
    return total
