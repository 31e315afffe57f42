"""Should targets use deletion vectors? One upsert increment merged by Spark's Delta Lake
into the same target with and without them: time, files and bytes written, and the time
of a full read afterwards (a reader pays for deletion vectors until they are compacted).

    .venv/bin/python benchmarks/deletion_vectors.py --sizes 1000000,5000000

Prints one table; each size builds its targets under --data-dir and deletes them after.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine.spark_session import local_session

DV = "delta.enableDeletionVectors"


def build(spark: SparkSession, path: str, rows: int, deletion_vectors: bool) -> None:
    (
        spark.range(rows)
        .select(
            F.col("id").alias("order_id"),
            (F.col("id") % 1000).alias("customer_id"),
            F.lit("placed").alias("status"),
            (F.col("id") % 9973 / 7).alias("amount"),
            F.timestamp_seconds(F.lit(1767225600) + F.col("id") % 86400).alias("updated_at"),
        )
        .repartitionByRange(max(1, rows // 1_000_000), "order_id")
        .sortWithinPartitions("order_id")
        .write.format("delta")
        .option(DV, str(deletion_vectors).lower())
        .save(path)
    )


def increment(spark: SparkSession, rows: int, changes: int):
    """Half updates of orders among the last 200k, half new orders."""
    recent = max(rows - 200_000, 0)
    step = max((rows - recent) // (changes // 2), 1)
    updates = spark.range(recent, rows, step).limit(changes // 2)
    new = spark.range(rows, rows + changes // 2)
    return updates.union(new).select(
        F.col("id").alias("order_id"),
        (F.col("id") % 1000).alias("customer_id"),
        F.lit("shipped").alias("status"),
        (F.col("id") % 9973 / 7).alias("amount"),
        F.timestamp_seconds(F.lit(1767312000) + F.col("id") % 86400).alias("updated_at"),
    )


def merge(spark: SparkSession, path: str, source) -> dict:
    started = time.perf_counter()
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.order_id = s.order_id")
        .whenMatchedUpdateAll(condition="s.updated_at > t.updated_at")
        .whenNotMatchedInsertAll()
        .execute()
    )
    seconds = time.perf_counter() - started
    metrics = DeltaTable.forPath(spark, path).history(1).collect()[0]["operationMetrics"]
    started = time.perf_counter()
    spark.read.format("delta").load(path).agg(F.sum("amount")).collect()
    read = time.perf_counter() - started
    return {
        "merge_s": seconds,
        "files_added": int(metrics.get("numTargetFilesAdded", 0)),
        "rows_copied": int(metrics.get("numTargetRowsCopied", 0)),
        "mb_added": int(metrics.get("numTargetBytesAdded", 0)) / 1e6,
        "dv_added": int(metrics.get("numTargetDeletionVectorsAdded", 0)),
        "read_s": read,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,5000000")
    parser.add_argument("--increment", type=int, default=50_000)
    parser.add_argument("--data-dir", default="benchmarks/.data/dv")
    args = parser.parse_args()
    spark = local_session("incremental-assets-bench-dv")
    spark.sparkContext.setLogLevel("ERROR")
    print(
        "| rows | deletion vectors | merge s | files added | rows copied | MB written "
        "| DVs added | full read after s |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        for dv in (False, True):
            path = str(Path(args.data_dir, f"t{size}_{'dv' if dv else 'nodv'}").absolute())
            shutil.rmtree(path, ignore_errors=True)
            build(spark, path, size, dv)
            source = increment(spark, size, args.increment).cache()
            source.count()
            m = merge(spark, path, source)
            source.unpersist()
            print(
                f"| {size:,} | {'on' if dv else 'off'} | {m['merge_s']:.1f} | {m['files_added']} "
                f"| {m['rows_copied']:,} | {m['mb_added']:.1f} | {m['dv_added']} "
                f"| {m['read_s']:.1f} |",
                flush=True,
            )
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
