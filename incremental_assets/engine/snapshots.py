"""Snapshot diff: a source that only gives its full current state becomes a change set.

The snapshot is compared with the target by the row hash (of the tracked columns): a key
not in the target (or deleted there) is an insert, a key whose hash differs is a change,
and a live target key missing from the snapshot has vanished. Only those rows are staged,
as ``_ia_op`` 'U' or 'D' rows stamped with the snapshot time, so they merge like a CDC
feed ordered by that time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from incremental_assets.engine.changes import OP
from incremental_assets.engine.transforms import ROW_HASH, quote

CHANGE = "_ia_change"
"""What a staged row does, for the run's counts: insert, change, vanish (snapshots) or
open, close, update, remove (history versions). Staged only, never in the target."""

_HASH, _DELETED = "_ia_target_hash", "_ia_target_deleted"


def snapshot_changes(
    snapshot: DataFrame,
    current: DataFrame | None,
    keys: Sequence[str],
    taken_at_column: str,
    taken_at: datetime,
    deleted_column: str | None = None,
) -> DataFrame:
    """The change set of ``snapshot`` against the target's ``current`` rows.

    ``current`` holds the target's live rows (or every row, with ``deleted_column`` naming
    the flag of soft-deleted ones); None when the target does not exist yet.
    """
    if current is None:
        return snapshot.withColumn(OP, F.lit("U")).withColumn(CHANGE, F.lit("insert"))
    key_cols = list(keys)
    deleted = F.col(quote(deleted_column)) if deleted_column else F.lit(False)
    known = current.select(
        *key_cols, F.col(ROW_HASH).alias(_HASH), F.coalesce(deleted, F.lit(False)).alias(_DELETED)
    )
    compared = snapshot.join(known, on=key_cols, how="left")
    new_key = F.col(_HASH).isNull() | F.col(_DELETED)
    upserts = (
        compared.filter(new_key | (F.col(_HASH) != F.col(ROW_HASH)))
        .withColumn(OP, F.lit("U"))
        .withColumn(CHANGE, F.when(new_key, F.lit("insert")).otherwise(F.lit("change")))
        .drop(_HASH, _DELETED)
    )
    live = current.filter(~F.coalesce(deleted, F.lit(False)))
    gone = live.join(snapshot.select(*key_cols), on=key_cols, how="left_anti")
    # A vanished row keeps its last values and is stamped with this snapshot's time.
    vanished = gone.select(
        *[_last_value(c, snapshot, gone, taken_at_column, taken_at) for c in snapshot.columns],
        F.lit("D").alias(OP),
        F.lit("vanish").alias(CHANGE),
    )
    return upserts.unionByName(vanished)


def repeated_keys(
    snapshot: DataFrame, keys: Sequence[str], named: int = 5
) -> tuple[int, list[str]]:
    """How many keys ``snapshot`` holds more than once, and up to ``named`` of them (lowest
    first) as ``key=value (n rows)``. Rows with a null key are left to the null-key check."""
    key_cols = [F.col(quote(k)) for k in keys]
    present = reduce(lambda a, b: a & b, [c.isNotNull() for c in key_cols])
    repeated = (
        snapshot.filter(present)
        .groupBy(*key_cols)
        .agg(F.count(F.lit(1)).alias("_ia_rows"))
        .filter(F.col("_ia_rows") > 1)
    )
    count = repeated.count()
    if not count:
        return 0, []
    # Keys as Spark's text (timestamps in the session's zone, UTC), not Python's values.
    shown = repeated.select(
        *[F.col(quote(k)).cast("string").alias(f"_ia_k{i}") for i, k in enumerate(keys)],
        "_ia_rows",
        *key_cols,
    ).orderBy(*key_cols)
    sample = []
    for row in shown.limit(named).collect():
        key = ", ".join(f"{k}={row[f'_ia_k{i}']}" for i, k in enumerate(keys))
        sample.append(f"{key} ({row['_ia_rows']} rows)")
    return count, sample


def _last_value(
    column: str, snapshot: DataFrame, gone: DataFrame, taken_at_column: str, taken_at: datetime
):
    if column == taken_at_column:
        return F.lit(taken_at).cast("timestamp").alias(column)
    if column not in gone.columns:  # a column new in this snapshot
        return F.lit(None).cast(snapshot.schema[column].dataType).alias(column)
    return F.col(quote(column)).alias(column)
