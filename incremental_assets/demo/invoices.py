"""The demo's invoices from bronze to silver and gold, each step reading only what changed
(built on :mod:`incremental_assets.engine.layers`).

- silver: one row per invoice line, flattened, upserted by (InvoiceNumber, ItemCode). It
  reads from bronze only the data files added since the bronze version it last covered;
  that version is committed in silver's own commit as the application transaction
  ``incremental_assets/<silver>#<bronze>`` (a version watermark between two Delta
  tables). A newer bronze row (later ingestion, then later file version and row) wins, so
  a file rewritten in place replaces the lines it held.
- gold: sales per day, store and payment method. A run recomputes from silver only the
  days present in the silver files added since the silver version it covered, and
  replaces exactly those days (one ``replaceWhere`` overwrite, plus the covered version,
  in one commit).

Every write is Spark's Delta Lake (``engine.delta_lake.commits``); delta-rs only reads the logs.

Example:
    >>> silver_from_bronze(spark, bronze, silver)  # doctest: +SKIP
    >>> gold_from_silver(spark, silver, gold)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.maintenance import MAINTENANCE_KEY
from incremental_assets.engine.delta_lake.store import DeltaTarget, row_count
from incremental_assets.engine.layers import (
    added_since,
    covered_version,
    covering,
    older_versions,
    rewritten_files,
)
from incremental_assets.engine.transforms import quote
from incremental_assets.specs.landing import FILE_ROW, FILE_VERSION, INGESTED_AT, SOURCE_FILE

SILVER_KEYS = ("InvoiceNumber", "ItemCode")
INVOICE_DATE = "invoice_date"
GOLD_KEYS = (INVOICE_DATE, "StoreID", "PaymentMethod")
# The key of silver's commit record that lists the days the commit touched.
TOUCHED_KEY = "touched_days"
# Operations that rewrite or remove files without changing a row (or change no file).
_NO_DATA_CHANGE = {
    "OPTIMIZE",
    "VACUUM START",
    "VACUUM END",
    "SET TBLPROPERTIES",
    "UNSET TBLPROPERTIES",
}


@dataclass(frozen=True)
class StepResult:
    upstream_from: int
    upstream_to: int | None
    rows_read: int
    rows_written: int
    version: int | None
    days: tuple[date, ...] = ()
    rows_deleted: int = 0


# Bronze columns silver reads (flattened or dropped); any other is a column files gained
# later (schema evolution), carried into silver as it is.
INVOICE_COLUMNS = (
    "InvoiceNumber",
    "CreatedTime",
    "StoreID",
    "PosID",
    "CashierID",
    "CustomerType",
    "CustomerCardNo",
    "TotalAmount",
    "NumberOfItems",
    "PaymentMethod",
    "TaxableAmount",
    "CGST",
    "SGST",
    "CESS",
    "DeliveryType",
    "DeliveryAddress",
    "InvoiceLineItems",
    SOURCE_FILE,
    FILE_VERSION,
    FILE_ROW,
    INGESTED_AT,
)


def flatten_invoices(bronze: DataFrame) -> DataFrame:
    """One row per invoice line, the invoice's fields and address beside the line's, and
    after them any column bronze gained (see ``INVOICE_COLUMNS``)."""
    line = F.explode("InvoiceLineItems").alias("line")
    gained = [F.col(quote(c)) for c in bronze.columns if c not in INVOICE_COLUMNS]
    return (
        bronze.select(
            "InvoiceNumber",
            F.timestamp_millis("CreatedTime").alias("CreatedTime"),
            F.to_date(F.timestamp_millis("CreatedTime")).alias(INVOICE_DATE),
            "StoreID",
            "PosID",
            "CashierID",
            "CustomerType",
            "CustomerCardNo",
            "PaymentMethod",
            "DeliveryType",
            F.col("DeliveryAddress.City").alias("City"),
            F.col("DeliveryAddress.State").alias("State"),
            F.col("DeliveryAddress.PinCode").alias("PinCode"),
            SOURCE_FILE,
            FILE_VERSION,
            FILE_ROW,
            INGESTED_AT,
            *gained,
            line,
        )
        .select(
            "*",
            F.col("line.ItemCode").alias("ItemCode"),
            F.col("line.ItemDescription").alias("ItemDescription"),
            F.col("line.ItemPrice").alias("ItemPrice"),
            F.col("line.ItemQty").alias("ItemQty"),
            F.col("line.TotalValue").alias("TotalValue"),
        )
        .drop("line")
    )


def newest_per_line(lines: DataFrame) -> DataFrame:
    """One row per (InvoiceNumber, ItemCode): the latest ingested, then the latest file
    version and row (a file rewritten in place supersedes its earlier version)."""
    order = Window.partitionBy(*SILVER_KEYS).orderBy(
        F.col(INGESTED_AT).desc(), F.col(FILE_VERSION).desc(), F.col(FILE_ROW).desc()
    )
    return lines.withColumn("_n", F.row_number().over(order)).filter("_n = 1").drop("_n")


def silver_from_bronze(spark: SparkSession, bronze: DeltaTarget, silver: DeltaTarget) -> StepResult:
    since = covered_version(silver, bronze)
    added, bronze_version = added_since(spark, bronze, since)
    if bronze_version == since:
        return StepResult(since, bronze_version, 0, 0, None)
    # Read several times below (days, keys, the write): kept in the executors' memory.
    lines = newest_per_line(flatten_invoices(added)).cache()
    try:
        return _silver_step(spark, bronze, silver, lines, since, bronze_version)
    finally:
        lines.unpersist()


def _silver_step(
    spark: SparkSession,
    bronze: DeltaTarget,
    silver: DeltaTarget,
    lines: DataFrame,
    since: int,
    bronze_version: int,
) -> StepResult:
    exists = silver.exists()
    rewritten = rewritten_files(bronze, since) if exists else {}
    rows = lines.count()
    days = lines.select(INVOICE_DATE).distinct().collect()
    touched = {str(r[INVOICE_DATE]) for r in days if r[INVOICE_DATE] is not None}
    if rewritten:
        touched |= _stale_days(spark, silver, rewritten)
    if exists:
        # A line whose invoice moved to another day leaves its old day too.
        touched |= _days_held(spark, silver, lines)
    commit = covering(silver, bronze, bronze_version, {TOUCHED_KEY: json.dumps(sorted(touched))})
    if not exists:
        delta_commits.append(lines, silver.spark_path, mode="error", **commit)
        return StepResult(since, bronze_version, rows, rows, silver.open().version())
    newer = (
        f"s.{INGESTED_AT} > t.{INGESTED_AT} OR (s.{INGESTED_AT} = t.{INGESTED_AT} AND "
        f"(s.{FILE_VERSION} > t.{FILE_VERSION} OR (s.{FILE_VERSION} = t.{FILE_VERSION} "
        f"AND s.{FILE_ROW} > t.{FILE_ROW})))"
    )
    predicate = " AND ".join(f"t.{k} = s.{k}" for k in SILVER_KEYS)
    clauses = [f"WHEN MATCHED AND ({newer}) THEN UPDATE SET *", "WHEN NOT MATCHED THEN INSERT *"]
    if rewritten:
        # Lines of an older version of a rewritten file that its newest version no
        # longer has: in the same commit as the upserts and the covered version.
        clauses.append(
            f"WHEN NOT MATCHED BY SOURCE AND ({older_versions('t', rewritten)}) THEN DELETE"
        )
    # Delta's SQL, as the engine's merges: it runs through Spark Connect too. Schema
    # evolution: bronze's new columns (landing_schema) reach silver.
    view = f"ia_invoice_lines_{uuid.uuid4().hex}"
    lines.createOrReplaceTempView(view)
    statement = (
        f"MERGE WITH SCHEMA EVOLUTION INTO delta.{quote(silver.spark_path)} AS t "
        f"USING {view} AS s ON {predicate} " + " ".join(clauses)
    )
    try:
        with delta_commits.idempotent(spark, **commit):
            metrics = spark.sql(statement).collect()
    finally:
        spark.catalog.dropTempView(view)
    if not metrics:
        # Delta skipped the MERGE: another run already committed this covered version.
        return StepResult(since, bronze_version, rows, 0, None)
    counts = metrics[0].asDict()
    written = _count(counts, "num_updated_rows") + _count(counts, "num_inserted_rows")
    deleted = _count(counts, "num_deleted_rows")
    version = silver.open().version()
    return StepResult(since, bronze_version, rows, written, version, rows_deleted=deleted)


def _count(metrics: Mapping[str, Any], key: str) -> int:
    return int(metrics.get(key) or 0)


def _days_held(spark: SparkSession, silver: DeltaTarget, lines: DataFrame) -> set[str]:
    """The days silver holds now for the keys of ``lines`` (reading only the files whose
    key statistics may hold them)."""
    keys = lines.select(*SILVER_KEYS).distinct()
    current = silver.to_spark(spark, holding=delta_io.touched_keys(keys, SILVER_KEYS))
    found = current.join(keys, list(SILVER_KEYS), "left_semi").select(INVOICE_DATE).distinct()
    return {str(r[INVOICE_DATE]) for r in found.collect() if r[INVOICE_DATE] is not None}


def _stale_days(spark: SparkSession, silver: DeltaTarget, files: dict[str, str]) -> set[str]:
    """Days of silver rows from older versions of ``files`` (gold recomputes them, as the
    rows may be deleted)."""
    rows = delta_io.read_files(spark, silver.open())
    stale = F.lit(False)
    for path, version in files.items():
        stale = stale | ((F.col(SOURCE_FILE) == path) & (F.col(FILE_VERSION) != version))
    found = rows.filter(stale).select(INVOICE_DATE).distinct().collect()
    return {str(r[INVOICE_DATE]) for r in found if r[INVOICE_DATE] is not None}


def daily_sales(silver: DataFrame) -> DataFrame:
    """Sales per day, store and payment method."""
    return silver.groupBy(*GOLD_KEYS).agg(
        F.countDistinct("InvoiceNumber").alias("invoices"),
        F.sum("ItemQty").cast("long").alias("items"),
        F.sum("TotalValue").alias("sales"),
    )


def comparable_gold(rows) -> list[tuple]:
    """Gold rows (mappings or Spark rows) as sorted tuples, sales rounded to 6 decimals:
    what two gold tables, or gold and ``daily_sales`` of silver, are compared by."""
    return sorted(
        (
            str(r[INVOICE_DATE]),
            r["StoreID"],
            r["PaymentMethod"],
            r["invoices"],
            r["items"],
            round(r["sales"], 6),
        )
        for r in rows
    )


def gold_from_silver(spark: SparkSession, silver: DeltaTarget, gold: DeltaTarget) -> StepResult:
    since = covered_version(gold, silver)
    silver_version = silver.open().version()
    if silver_version == since:
        return StepResult(since, silver_version, 0, 0, None)
    days = _touched_days(silver, since)
    if days is None:
        added, _ = added_since(spark, silver, since)
        # A silver commit that does not list its days (not written here): every day in
        # the files it added, a superset.
        days = sorted(r[INVOICE_DATE] for r in added.select(INVOICE_DATE).distinct().collect())
    if not days:
        return StepResult(since, silver_version, 0, 0, None)
    current = delta_io.read_files(spark, silver.open(silver_version))
    # Counted, then written: kept in the executors' memory between the two.
    recomputed = daily_sales(current.filter(F.col(INVOICE_DATE).isin(days))).cache()
    try:
        rows = recomputed.count()
        commit = covering(gold, silver, silver_version)
        if not gold.exists():
            delta_commits.append(recomputed, gold.spark_path, mode="error", **commit)
        else:
            listed = ", ".join(f"'{d.isoformat()}'" for d in days)
            delta_commits.append(
                recomputed,
                gold.spark_path,
                mode="overwrite",
                options={"replaceWhere": f"{INVOICE_DATE} IN ({listed})"},
                **commit,
            )
    finally:
        recomputed.unpersist()
    return StepResult(since, silver_version, rows, rows, gold.open().version(), tuple(days))


def _touched_days(silver: DeltaTarget, since: int) -> list[date] | None:
    """The days silver's commits after ``since`` merged rows into, from their records;
    None when a data-changing commit does not say."""
    table = silver.open()
    days: set[str] = set()
    for commit in table.history(table.version() - since):
        if commit.get("version", -1) <= since:
            continue
        record = delta_commits.parse(commit)
        listed = None if record is None else record.get(TOUCHED_KEY)
        if listed is None:
            if _maintenance(commit, record) or commit.get("operation") in _NO_DATA_CHANGE:
                continue  # compaction rewrites files, not values
            return None
        days.update(json.loads(listed))
    return [date.fromisoformat(d) for d in sorted(days)]


def _maintenance(commit: Mapping[str, Any], record: Mapping[str, Any] | None) -> bool:
    """Whether a commit is the loader's maintenance (``engine.delta_lake.maintenance``):
    tagged in its user metadata, or, written by an earlier release, as a top-level key."""
    if record is not None and "maintenance" in record:
        return True
    text = commit.get("userMetadata")
    if isinstance(text, str) and text.startswith("{"):
        try:
            return MAINTENANCE_KEY in json.loads(text)
        except ValueError:
            return False
    return False


def table_rows(target: DeltaTarget) -> int:
    """Rows in the table, from its log's file statistics (no data read)."""
    return row_count(target.open()) if target.exists() else 0
