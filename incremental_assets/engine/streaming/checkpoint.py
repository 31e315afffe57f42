"""A streaming layer's checkpoint: where it lives, what it holds, and whether it still
belongs to the layer's table and declared query; and the reset that drops both.

The checkpoint is the folder ``<layer folder>__checkpoint`` beside the layer's Delta
table (specs/locations.py), read and written by Spark through Hadoop paths, so a warehouse
on an object store keeps it there too. Not inside the table's folder: engines that guard a
Delta folder against other formats would refuse to read or empty it there. Table and
checkpoint belong together: the reset empties both, and a run refuses to start when one
is gone without the other.

Each commit a streaming layer makes records the declared query it ran (source and
aggregation, :func:`declared_query`) and the query id of the checkpoint; a run compares
them with the declaration and the checkpoint before it starts, because Spark accepts some
changes silently (another window size, another folder) and would then merge results of two
different queries into one table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from incremental_assets.engine import staging
from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake.folders import held
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import StreamCheckpointError
from incremental_assets.engine.landing_folder import spark_path
from incremental_assets.specs.durations import format_duration
from incremental_assets.specs.layers import AggregateLayerSpec, LayerSpec, RowLayerSpec
from incremental_assets.specs.locations import checkpoint_folder
from incremental_assets.specs.models import SourceSpec

# The commit record's entries of a streaming layer (engine.delta_lake.commits).
QUERY = "stream_query"
QUERY_ID = "query_id"
BATCH_ID = "batch_id"
# Reader options that pace a run (how much a batch takes), not what the query computes:
# changing them needs no reset.
_PACING = frozenset({"maxfilespertrigger", "maxbytespertrigger"})
# How far back the table's history is searched for its last streaming commit: each batch
# commits once, and maintenance (OPTIMIZE, VACUUM) adds a few commits of its own.
_HISTORY = 50


def checkpoint_location(target: DeltaTarget) -> str:
    """The layer's checkpoint as Spark names it: ``<layer folder>__checkpoint``."""
    return checkpoint_folder(target.spark_path)


def declared_query(layer: LayerSpec, source: Mapping[str, str]) -> dict[str, str]:
    """What the checkpoint's state and offsets depend on, as text: the ``source`` (the
    entries ``source.*`` that say what the stream reads and how, from
    engine/declared_layers/stream_sources.py) and the aggregation, or a row layer's select
    and keys (the rows it merged came from them). A change to any of them needs a reset."""
    if isinstance(layer, RowLayerSpec):
        return {**source, "select": layer.select.strip(), "keys": ", ".join(layer.keys)}
    assert isinstance(layer, AggregateLayerSpec) and layer.window is not None
    return {
        **source,
        "group_by": ", ".join(layer.group_by),
        "window": f"{layer.window}, watermark {format_duration(layer.window.watermark)}",
        "aggregates": ", ".join(
            f"{a.name}={a.function}({a.column or '*'})" for a in layer.aggregates
        ),
    }


def folder_query(source: SourceSpec, schema: str) -> dict[str, str]:
    """A folder of files as a stream reads it: the folder and how its files are read (not
    the options that only pace batches), with ``schema`` (the declared one, or the one
    inferred and kept)."""
    return {
        "source.path": str(source.path),
        "source.format": source.format,
        "source.schema": schema,
        "source.options": json.dumps(
            {k: v for k, v in sorted(source.options.items()) if k.lower() not in _PACING}
        ),
        "source.timezone": source.timezone,
    }


@dataclass(frozen=True)
class CheckpointState:
    """``query_id``: the query the checkpoint belongs to (None: no checkpoint yet);
    ``last_committed``: its last committed batch (-1: none)."""

    query_id: str | None
    last_committed: int


def read_checkpoint(
    spark: SparkSession, location: str, target: DeltaTarget | None = None
) -> CheckpointState:
    """What the checkpoint at ``location`` holds (two small Spark reads; none missing).
    With the layer's ``target``, a checkpoint not written yet is seen by listing its folder
    first (with the table's storage options): Spark's failed read of a missing path would
    print a long error from its listeners though the run goes on."""
    if target is not None and "metadata" not in held(
        checkpoint_folder(target.path), target.storage_options
    ):
        return CheckpointState(None, -1)
    folder = spark_path(location)
    try:
        first = spark.read.text(f"{folder}/metadata").first()
    except AnalysisException as exc:
        if not _missing(exc):
            raise
        return CheckpointState(None, -1)
    query_id = json.loads(first[0]).get("id") if first is not None else None
    try:
        files = spark.read.text(f"{folder}/commits").inputFiles()
    except AnalysisException as exc:
        if not _missing(exc):
            raise
        files = []
    batches = [int(name) for name in (f.rsplit("/", 1)[-1] for f in files) if name.isdigit()]
    return CheckpointState(query_id, max(batches, default=-1))


def query_id_of(spark: SparkSession, location: str) -> str:
    """The id of the query whose checkpoint is at ``location`` (Spark writes it there
    before the query's first batch)."""
    first = spark.read.text(f"{spark_path(location)}/metadata").first()
    return str(json.loads(first[0])["id"])


def last_stream_commit(target: DeltaTarget) -> dict[str, Any] | None:
    """The newest commit record of the layer's streaming runs (None: the table has none, or
    no table)."""
    if not target.exists():
        return None
    for commit in target.open().history(_HISTORY):
        record = delta_commits.parse(commit)
        if record is not None and QUERY in record:
            return record
    return None


def check_matches(
    layer: LayerSpec,
    target: DeltaTarget,
    location: str,
    checkpoint: CheckpointState,
    declared: dict[str, str],
) -> None:
    """Refuse to run when the checkpoint, the layer's table and the declaration disagree:
    a changed declaration or source, a table a batch run wrote, a deleted checkpoint or
    table. Nothing has been written when this raises."""
    name = layer.name
    record = last_stream_commit(target)
    if record is None and target.exists():
        raise StreamCheckpointError(
            name,
            "run",
            location,
            f"the layer's table at {target.path} was not written by its streaming query (a "
            "batch run of the layer wrote it)",
        )
    if record is None:
        if checkpoint.last_committed >= 0:
            raise StreamCheckpointError(
                name,
                "run",
                location,
                f"the checkpoint holds {checkpoint.last_committed + 1} committed batches but the "
                f"layer has no table at {target.path} (deleted?)",
            )
        return
    before = json.loads(str(record[QUERY]))
    changed = [k for k in declared if before.get(k) != declared[k]]
    if changed:
        what = "; ".join(f"{k}: {before.get(k)!r} -> {declared[k]!r}" for k in changed)
        field = "from" if changed[0].startswith("source.") else changed[0]
        raise StreamCheckpointError(
            name,
            field,
            location,
            f"the declared query changed since the checkpoint was made ({what}); its state "
            "and offsets are the old query's",
        )
    written_by = record.get(QUERY_ID)
    if written_by and written_by != checkpoint.query_id:
        held = (
            "there is no checkpoint (deleted?)"
            if checkpoint.query_id is None
            else f"the checkpoint is query {checkpoint.query_id}'s"
        )
        raise StreamCheckpointError(
            name,
            "run",
            location,
            f"the layer's table was written by streaming query {written_by}, but {held}",
        )


def reset(spark: SparkSession, target: DeltaTarget) -> None:
    """Empty the layer's checkpoint, then its table's folder (the next run reads every file
    of the source folder anew). Through Spark, as a staging root is emptied. Interrupted
    between the two, the next run refuses to start (a table without its checkpoint) until
    the reset is run again."""
    staging.clear(spark, checkpoint_location(target))
    staging.clear(spark, target.spark_path)


def _missing(exc: AnalysisException) -> bool:
    return "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc)
