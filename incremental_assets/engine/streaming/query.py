"""One run of a streaming query: ``trigger(availableNow=True)``, so it processes what the
source holds when it starts (in as many micro-batches as the source's per-trigger limits
make) and stops, as a batch run would; then its progress reports.

A failure of the query (in Spark or in the batch function) is raised as one error naming
the layer: the :class:`LayerError` a batch function raised (a declaration the batch's rows
show wrong) as it was, a checkpoint Spark finds no longer fits the query (another state
schema or operator) as :class:`StreamCheckpointError`, anything else as
:class:`LayerError`. The
checkpoint then still holds the last batch Spark committed, so the next run resumes there.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame

from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.errors import (
    LayerError,
    StreamCheckpointError,
    layer_error_from_text,
)
from incremental_assets.engine.streaming.progress import KEPT_REPORTS

# Spark's words for a checkpoint whose state or operators are another query's.
_MISMATCH = (
    "SCHEMA_NOT_COMPATIBLE",
    "StateSchemaNotCompatible",
    "NOT_MATCH_IN_STATE_METADATA",
    "INCOMPATIBLE_STATE",
    "STATE_STORE_INVALID",
    "STREAMING_STATEFUL_OPERATOR",
)

# Delta's words for a commit that changed rows in a table streamed without its change feed.
_REWRITTEN = ("DELTA_SOURCE_TABLE_IGNORE_CHANGES", "DELTA_SOURCE_IGNORE_DELETE")


def run_available_now(
    layer: str,
    frame: DataFrame,
    write: Callable[[DataFrame, int], None],
    checkpoint: str,
) -> tuple[str, list[Any]]:
    """Run ``frame`` (a streaming aggregate) once over what its source holds, each
    micro-batch's updated groups handed to ``write``; the query's id and its progress
    reports, oldest first."""
    spark = frame.sparkSession
    # Read when the query starts: every batch of this run keeps its report.
    with delta_commits.session_settings(
        spark, {"spark.sql.streaming.numRecentProgressUpdates": KEPT_REPORTS}
    ):
        query = (
            frame.writeStream.outputMode("update")
            .foreachBatch(write)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
    try:
        query.awaitTermination()
    except StreamingQueryException as exc:
        raise failure(layer, checkpoint, exc) from None
    return str(query.id), list(query.recentProgress)


def failure(layer: str, checkpoint: str, exc: Exception) -> LayerError:
    """The error to raise for a failed streaming query."""
    text = str(exc).strip()
    raised = _own_error(text)
    if raised is not None:
        return raised  # a batch found the declaration wrong (its keys): its fix stands
    first = _cause(text) if text else type(exc).__name__
    if any(word in text for word in _MISMATCH):
        return StreamCheckpointError(
            layer,
            "run",
            checkpoint,
            f"Spark finds that the checkpoint no longer fits the layer's query: {first}",
        )
    if any(word in text for word in _REWRITTEN):
        return LayerError(
            layer,
            "from",
            "the upstream Delta table updated or deleted rows, and a stream of its appended "
            f"rows cannot follow that: {first}",
            "turn on the upstream's change data feed (ALTER TABLE delta.`<path>` SET "
            "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')) and reset the layer "
            f"(incremental-assets reset-layer {layer}), or set run: batch",
        )
    return LayerError(
        layer,
        "run",
        f"the streaming query failed: {first}",
        "fix the cause above and materialize the layer again: it resumes from the last "
        "batch its checkpoint committed",
    )


# How a LayerError a batch function raised shows in the failed query's traceback.
_OWN = f"{LayerError.__module__}.{LayerError.__name__}: "


def _own_error(text: str) -> LayerError | None:
    """The :class:`LayerError` a batch function raised, from the failed query's text (the
    last one, whole; None when the batch raised none)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith(_OWN):
            return layer_error_from_text(line[len(_OWN) :])
    return None


def _cause(text: str) -> str:
    """The line of a failed query's message that says what went wrong: the exception a
    batch function raised (the last line of its Python traceback) or Spark's own error,
    rather than the query's generic first line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if _RAISED.match(line)]
    return (raised[-1] if raised else lines[0])[:500]


# "pkg.SomeError: ..." or "[ERROR_CLASS] ..." lines of a traceback, not its frames.
_RAISED = re.compile(r"^([\w.]*(Error|Exception)|\[[A-Z_]+\](?! Query \[id))\b.*")
