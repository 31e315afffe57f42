"""The same increment, or the same full load, done the ways a user would do it without this
project: the notebook MERGE, dlt, a hand-written full reload in Spark, and the floor (the
cheapest Spark job that reads the increment and writes it once).

Each follows the case's ``kind`` (``bench_cases.Case.kind``): upsert, cdc_hard, cdc_soft,
scd2 or append. They write through Spark's Delta Lake (dlt: through delta-rs, its own
engine for Delta tables), without metadata, checks or a cursor kept in the commit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

KEY = "order_id"
FEED_ORDER = "lsn"
TIME = "updated_at"
OP = "op"


def order_column(kind: str) -> str:
    """The column a baseline keeps its cursor on and orders changes by."""
    return FEED_ORDER if kind.startswith("cdc") or kind == "scd2" else TIME


def _after(kind: str, cursor: Any) -> F.Column:
    column = order_column(kind)
    if column == TIME:
        return F.col(TIME) > F.timestamp_micros(F.lit(int(cursor)))
    return F.col(column) > F.lit(int(cursor))


def _newest(rows: DataFrame, order: str) -> DataFrame:
    newest = Window.partitionBy(KEY).orderBy(F.col(order).desc())
    return rows.withColumn("_n", F.row_number().over(newest)).filter("_n = 1").drop("_n")


def _soft(rows: DataFrame) -> DataFrame:
    deleted = F.col(OP) == "D"
    return rows.withColumn("is_deleted", deleted).withColumn(
        "deleted_at", F.when(deleted, F.col(TIME))
    )


def _versions(events: DataFrame) -> DataFrame:
    """Every change a version: valid from its time to the next change's, current when no
    change follows and it is not a delete (a delete only closes the version before it)."""
    by_key = Window.partitionBy(KEY).orderBy(FEED_ORDER)
    return (
        events.dropDuplicates([FEED_ORDER])
        .withColumn("valid_from", F.col(TIME))
        .withColumn("valid_to", F.lead(TIME).over(by_key))
        .withColumn("is_current", F.lead(FEED_ORDER).over(by_key).isNull() & (F.col(OP) != "D"))
    )


# --- the notebook MERGE ---------------------------------------------------------------


def notebook_merge(spark: SparkSession, kind: str, source: str, target: str, cursor) -> None:
    """What a hand-written notebook does with the rows changed since ``cursor``: read them
    (one filter), keep the newest per key, ``DeltaTable.forPath(...).merge`` them."""
    from delta.tables import DeltaTable as SparkDeltaTable

    changed = spark.read.format("delta").load(source).filter(_after(kind, cursor))
    table = SparkDeltaTable.forPath(spark, target)
    held = set(table.toDF().columns)
    if kind == "scd2":
        _scd2_merge(table, changed, held)
        return
    if kind == "append":
        rows = changed
        values = {c: f"s.{c}" for c in rows.columns if c in held}
        merge = table.alias("t").merge(rows.alias("s"), f"t.{KEY} = s.{KEY}")
        merge.whenNotMatchedInsert(values=values).execute()
        return
    rows = _newest(changed, order_column(kind))
    if kind == "cdc_soft":
        rows = _soft(rows)
    every = {c: f"s.{c}" for c in rows.columns if c in held}
    newer = f"s.{order_column(kind)} > t.{order_column(kind)}"
    merge = table.alias("t").merge(rows.alias("s"), f"t.{KEY} = s.{KEY}")
    if kind == "cdc_hard":
        merge = merge.whenMatchedDelete(condition=f"s.{OP} = 'D' AND {newer}")
        merge = merge.whenMatchedUpdate(condition=f"s.{OP} <> 'D' AND {newer}", set=every)
        merge = merge.whenNotMatchedInsert(condition=f"s.{OP} <> 'D'", values=every)
    else:
        merge = merge.whenMatchedUpdate(condition=newer, set=every)
        merge = merge.whenNotMatchedInsert(values=every)
    merge.execute()


def _scd2_merge(table, events: DataFrame, held: set[str]) -> None:
    """The usual SCD2 notebook: the new versions inserted, and each touched key's current
    version closed at its first new change, in one MERGE (the closing rows carry the key
    as ``merge_key``, the new versions a null one, so they never match)."""
    versions = _versions(events)
    first = Window.partitionBy(KEY).orderBy(FEED_ORDER)
    closing = (
        events.withColumn("_n", F.row_number().over(first))
        .filter("_n = 1")
        .select(F.col(KEY).alias("merge_key"), F.col(TIME).alias("close_at"))
    )
    columns = [c for c in versions.columns if c in held]
    opening = versions.filter(F.col(OP) != "D").select(
        F.lit(None).cast("long").alias("merge_key"),
        F.lit(None).cast("timestamp").alias("close_at"),
        *columns,
    )
    staged = closing.unionByName(opening, allowMissingColumns=True)
    (
        table.alias("t")
        .merge(staged.alias("s"), f"t.{KEY} = s.merge_key AND t.is_current")
        .whenMatchedUpdate(set={"valid_to": "s.close_at", "is_current": "false"})
        .whenNotMatchedInsert(
            condition="s.merge_key IS NULL", values={c: f"s.{c}" for c in columns}
        )
        .execute()
    )


# --- the full reload, hand-written ----------------------------------------------------


def hand_reload(spark: SparkSession, kind: str, source: str, out: str) -> None:
    """A full reload the way a user writes it: read the whole source, keep the newest row
    per key (a history: every change as a version), overwrite the table. Append too: its
    table holds a key once (a key seen before is ignored), so a reload that rebuilds it
    keeps one row per key; ``hand_copy`` is the copy that trusts the source to."""
    rows = spark.read.format("delta").load(source)
    if kind == "scd2":
        rows = _versions(rows).filter(F.col(OP) != "D").drop(OP)
    else:
        rows = _newest(rows, order_column(kind))
        if kind == "cdc_hard":
            rows = rows.filter(F.col(OP) != "D").drop(OP)
        elif kind == "cdc_soft":
            rows = _soft(rows).drop(OP)
    rows.write.format("delta").mode("overwrite").save(out)


def hand_copy(spark: SparkSession, source: str, out: str) -> None:
    """An append-only source copied as it is: the hand-written reload of a user who trusts
    the source to hold each key once (no shuffle, no sort)."""
    spark.read.format("delta").load(source).write.format("delta").mode("overwrite").save(out)


# --- the floor ------------------------------------------------------------------------


def floor(spark: SparkSession, kind: str, source: str, out: str, cursor) -> None:
    """The least any load of the increment does: read the source rows changed since
    ``cursor`` (pruned by the source's file statistics) and write them once, to a new
    Delta table; no target read, no key matching."""
    changed = spark.read.format("delta").load(source).filter(_after(kind, cursor))
    changed.write.format("delta").save(out)


# --- dlt (the ``bench`` extra) --------------------------------------------------------


def newest_per_key(table: pa.Table, order: str) -> pa.Table:
    """The last row per key by ``order`` (Arrow), as a dlt user must for an upsert: dlt's
    Delta merge matches each target row with at most one source row."""
    if table.num_rows == 0:
        return table
    table = table.sort_by([(KEY, "ascending"), (order, "descending")])
    ids = table.column(KEY).combine_chunks()
    first = pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1))
    return table.filter(pa.concat_arrays([pa.array([True]), first]))


@dataclass
class DltTarget:
    """A dlt pipeline that loads the case's source into a Delta table on a local bucket, as
    a dlt user writes it: a resource with dlt's own cursor (``dlt.sources.incremental``),
    ``primary_key``, ``table_format="delta"`` and the write disposition the case needs
    (upsert as dlt's ``merge``, hard deletes by its ``hard_delete`` column hint, soft
    deletes as flag columns, append-only as ``append``), everything else dlt's defaults."""

    pipeline: Any
    kind: str
    source: str
    path: str  # the Delta table dlt writes: <bucket>/<dataset>/<table>

    @classmethod
    def create(cls, kind: str, source: str, root: Path) -> DltTarget:
        # A benchmark sends no usage telemetry; dlt's schema-hint warnings (the key is
        # nullable in the Arrow schema) would only clutter the output.
        os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
        os.environ.setdefault("RUNTIME__LOG_LEVEL", "ERROR")
        import dlt

        pipeline = dlt.pipeline(
            pipeline_name=f"bench_{kind}",
            destination=dlt.destinations.filesystem(bucket_url=str(root / "bucket")),
            dataset_name="bench",
            pipelines_dir=str(root / "pipelines"),
        )
        return cls(pipeline, kind, source, str(root / "bucket" / "bench" / "orders"))

    def run(self) -> None:
        """One ``pipeline.run``: the source rows changed since the last run, read as Arrow,
        shaped for the case, extracted, normalized and written by dlt."""
        import dlt

        source, kind = self.source, self.kind
        order = order_column(kind)
        hints: dict[str, Any] = {"primary_key": KEY, "write_disposition": "merge"}
        if kind == "append":
            hints["write_disposition"] = "append"
        if kind == "cdc_hard":
            hints["columns"] = {"deleted": {"hard_delete": True, "data_type": "bool"}}

        @dlt.resource(name="orders", table_format="delta", **hints)
        def orders(
            # dlt declares the cursor as the argument's default (its documented form).
            cursor: Any = dlt.sources.incremental(order),  # noqa: B008
        ) -> Iterator[pa.Table]:
            last = cursor.last_value
            changed = None if last is None else pc.field(order) > last
            rows = DeltaTable(source).to_pyarrow_dataset().to_table(filter=changed)
            if kind.startswith("cdc"):
                rows = newest_per_key(rows, order)
                deleted = pc.equal(rows.column(OP), "D")
                if kind == "cdc_hard":
                    rows = rows.append_column("deleted", deleted)
                else:
                    at = pc.if_else(deleted, rows.column(TIME), pa.scalar(None, rows[TIME].type))
                    rows = rows.append_column("is_deleted", deleted).append_column("deleted_at", at)
                rows = rows.drop_columns([OP])
            yield rows

        self.pipeline.run(orders())
