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
  replaces exactly those days (one overwrite with a predicate, plus the covered version,
  in one commit).

Example:
    >>> silver_from_bronze(spark, bronze, silver)  # doctest: +SKIP
    >>> gold_from_silver(spark, silver, gold)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from datetime import date

import pyarrow.dataset as pads
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from incremental_assets.engine import delta_io
from incremental_assets.engine.delta_store import DeltaTarget
from incremental_assets.engine.layers import (
    added_since,
    covered_version,
    covering_properties,
    older_versions,
    rewritten_files,
)
from incremental_assets.engine.transforms import quote
from incremental_assets.specs.landing import FILE_ROW, FILE_VERSION, INGESTED_AT, SOURCE_FILE

SILVER_KEYS = ("InvoiceNumber", "ItemCode")
INVOICE_DATE = "invoice_date"
TOUCHED = "incremental_assets.touched_days"


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
    lines = newest_per_line(flatten_invoices(added))
    newer = (
        f"s.{INGESTED_AT} > t.{INGESTED_AT} OR (s.{INGESTED_AT} = t.{INGESTED_AT} AND "
        f"(s.{FILE_VERSION} > t.{FILE_VERSION} OR (s.{FILE_VERSION} = t.{FILE_VERSION} "
        f"AND s.{FILE_ROW} > t.{FILE_ROW})))"
    )
    predicate = " AND ".join(f"t.{k} = s.{k}" for k in SILVER_KEYS)
    rewritten = rewritten_files(bronze, since) if silver.exists() else {}
    stale = _stale_days(spark, silver, rewritten) if rewritten else set()
    with _staged(lines) as (dataset, rows):
        days = pads.dataset(dataset.files, format="parquet").to_table(columns=[INVOICE_DATE])
        touched = {str(d) for d in days.column(0).to_pylist() if d is not None} | stale
        if silver.exists():
            # A line whose invoice moved to another day leaves its old day too.
            touched |= _days_held(spark, silver, spark.read.parquet(*dataset.files))
        touched = sorted(touched)
        properties = covering_properties(
            silver, bronze, bronze_version, {TOUCHED: json.dumps(touched)}
        )
        if not silver.exists():
            write_deltalake(
                silver.path, dataset.scanner().to_reader(), commit_properties=properties
            )
            return StepResult(since, bronze_version, rows, rows, silver.open().version())
        table = silver.open()
        merger = (
            table.merge(
                dataset.scanner().to_reader(),
                predicate,
                source_alias="s",
                target_alias="t",
                merge_schema=True,  # bronze's new columns (landing_schema) reach silver
                commit_properties=properties,
            )
            .when_matched_update_all(predicate=newer)
            .when_not_matched_insert_all()
        )
        if rewritten:
            # Lines of an older version of a rewritten file that its newest version no
            # longer has: in the same commit as the upserts and the covered version.
            merger = merger.when_not_matched_by_source_delete(older_versions("t", rewritten))
        metrics = merger.execute()
        written = int(metrics.get("num_target_rows_inserted", 0)) + int(
            metrics.get("num_target_rows_updated", 0)
        )
        deleted = int(metrics.get("num_target_rows_deleted", 0))
        version = silver.open().version()
        return StepResult(since, bronze_version, rows, written, version, rows_deleted=deleted)


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
    return silver.groupBy(INVOICE_DATE, "StoreID", "PaymentMethod").agg(
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
    recomputed = daily_sales(current.filter(F.col(INVOICE_DATE).isin(days)))
    properties = covering_properties(gold, silver, silver_version)
    with _staged(recomputed) as (dataset, rows):
        if not gold.exists():
            write_deltalake(gold.path, dataset.scanner().to_reader(), commit_properties=properties)
        else:
            listed = ", ".join(f"'{d.isoformat()}'" for d in days)
            write_deltalake(
                gold.path,
                dataset.scanner().to_reader(),
                mode="overwrite",
                predicate=f"{INVOICE_DATE} IN ({listed})",
                commit_properties=properties,
            )
    return StepResult(since, silver_version, rows, rows, gold.open().version(), tuple(days))


def _touched_days(silver: DeltaTarget, since: int) -> list[date] | None:
    """The days silver's commits after ``since`` merged rows into, from their metadata;
    None when a data-changing commit does not say."""
    table = silver.open()
    days: set[str] = set()
    for commit in table.history(table.version() - since):
        if commit.get("version", -1) <= since:
            continue
        listed = commit.get(TOUCHED)
        if listed is None:
            if any(k.startswith("incremental_assets.maintenance") for k in commit):
                continue  # compaction rewrites files, not values
            return None
        days.update(json.loads(listed))
    return [date.fromisoformat(d) for d in sorted(days)]


class _staged:
    """A DataFrame written once to Parquet (the Spark -> delta-rs hand-off)."""

    def __init__(self, df: DataFrame):
        self.df = df

    def __enter__(self) -> tuple[pads.Dataset, int]:
        self.root = tempfile.mkdtemp(prefix="ia-invoices-")
        path = f"{self.root}/rows"
        self.df.write.mode("overwrite").parquet(path)
        dataset = pads.dataset(path, format="parquet")
        return dataset, dataset.count_rows()

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def table_rows(target: DeltaTarget) -> int:
    return DeltaTable(target.path).to_pyarrow_table().num_rows if target.exists() else 0
