"""The ``foreachBatch`` writer of a streaming aggregate: each micro-batch's updated groups
merged into the layer's Delta table by key, exactly once.

Exactly once, because a batch may run twice: a run killed after a batch's MERGE committed
but before Spark recorded the batch in the checkpoint replays that batch on the next run.
Each MERGE is Delta's idempotent write ``(incremental_assets/<layer>#stream/<query id>,
<batch id>)``: Delta skips a write whose version is not above the one the table recorded
for that application id, so the replay commits nothing. The ids ride in the session
settings ``spark.databricks.delta.write.txnAppId``/``txnVersion``, which Delta applies to
its DML commands (MERGE, UPDATE, DELETE, since delta-io/delta#1555); the DataFrame writer's
``txnAppId``/``txnVersion`` options cover DataFrame writes only, not a MERGE.

A layer table that does not exist yet is created by the first batch, rows or none (so the
checkpoint's batches and the table's commits stay together), with the same idempotent
write (a DataFrame append, whose writer options ``txnAppId`` / ``txnVersion`` Delta
honours): a run that fails before any batch leaves nothing behind.

The query id is read from the checkpoint (Spark writes it there before the first batch):
it stays the same across runs of one checkpoint and changes with a reset, whose new batch
ids start at 0 again.

A query over a change data feed gives each group the rows it still holds (``HELD``): a group
left with none is deleted from the table, the others updated or inserted, without that
column.

Through Spark Connect the function runs in the server's Python worker, which needs this
package installed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pyspark.sql import DataFrame

from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake.merge_plan import (
    delete,
    insert,
    run_merge,
    same_keys,
    update,
)
from incremental_assets.engine.faults import crash_point
from incremental_assets.engine.streaming.checkpoint import BATCH_ID, QUERY, QUERY_ID, query_id_of

# A group's count of rows (signed streams): 0 once updates and deletes took back every row.
HELD = "_ia_rows_held"


def stream_app_id(layer: str, query_id: str) -> str:
    return f"incremental_assets/{layer}#stream/{query_id}"


def merge_batches(
    layer: str,
    path: str,
    keys: Sequence[str],
    checkpoint: str,
    declared: str,
    exists: bool,
    counted: bool = False,
    new_table: Mapping[str, str] | None = None,
) -> Callable[[DataFrame, int], None]:
    """The ``foreachBatch`` function that merges each batch's groups into the Delta table
    at ``path`` by ``keys`` (creating it with the first batch's rows unless it ``exists``),
    recording ``declared`` (the query, as JSON) in each commit. ``counted``: the groups
    carry ``HELD``, and one holding no row is deleted. ``new_table``: the table options of the
    table the first batch creates."""
    found: dict[str, object] = {"created": exists}
    condition = same_keys(keys)
    clauses = [update(), insert()]
    if counted:
        held = f"s.{HELD} > 0"
        clauses = [delete(f"NOT ({held})"), update(held), insert(held)]

    def write(batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        if QUERY_ID not in found:
            found[QUERY_ID] = query_id_of(spark, checkpoint)
        query_id = str(found[QUERY_ID])
        app_id = stream_app_id(layer, query_id)
        # Kept for the emptiness test and the merge: the batch's plan holds the stateful
        # aggregation, which must not run twice.
        batch = batch.persist()
        try:
            if batch.isEmpty() and found["created"]:
                return  # a batch that only moved the watermark: nothing to merge
            record = {"layer": layer, QUERY: declared, QUERY_ID: query_id, BATCH_ID: batch_id}
            metadata = delta_commits.record(record)
            crash_point("before_commit")
            columns = [c for c in batch.columns if c != HELD]
            if not found["created"]:
                # A batch's groups are distinct: the first one is the table's first rows.
                first = batch.where(f"{HELD} > 0") if counted else batch
                delta_commits.append(
                    first.select(*columns),
                    path,
                    metadata,
                    app_id=app_id,
                    version=batch_id,
                    options=new_table,
                )
                found["created"] = True
            else:
                with delta_commits.idempotent(spark, app_id, batch_id, metadata):
                    run_merge(spark, path, batch, condition, clauses, columns)
            crash_point("after_commit")
        finally:
            batch.unpersist()

    return write
