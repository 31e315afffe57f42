"""Whole-DataFrame aggregates observed on a write to nowhere: the values ``agg`` gives, in
one Spark job instead of two in a classic session; through Spark Connect, and wherever the
observation comes back without its values, by ``agg``."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from incremental_assets.engine.spark import aggregates
from incremental_assets.engine.spark.aggregates import aggregated
from incremental_assets_tests.builders import jobs_in


def _aggregates():
    return [
        F.count(F.lit(1)).alias("rows"),
        F.sum((F.col("v") < 10).cast("int")).alias("small"),
        F.max(F.when(F.col("v") > 90, F.col("id"))).alias("latest_big"),
        F.min("id").alias("first"),
    ]


@pytest.mark.classic_only("counts Spark jobs through the local SparkContext")
def test_aggregates_equal_agg_in_one_job(spark):
    rows = spark.range(0, 20_000, numPartitions=4).withColumn("v", F.col("id") % 97)

    found, jobs = jobs_in(spark, "observed", lambda: aggregated(rows, *_aggregates()))
    expected, agg_jobs = jobs_in(
        spark, "collected", lambda: rows.agg(*_aggregates()).collect()[0].asDict()
    )

    assert found == expected
    assert jobs == 1
    assert agg_jobs >= jobs


def test_aggregates_of_no_rows_are_a_zero_count_and_nulls(spark):
    rows = spark.range(0, 100, numPartitions=2).withColumn("v", F.col("id") % 97).filter("id < 0")

    found = aggregated(rows, *_aggregates())

    assert found == rows.agg(*_aggregates()).collect()[0].asDict()
    assert found["rows"] == 0 and found["latest_big"] is None


def test_rows_read_through_deletion_vectors_are_aggregated_by_agg(spark, tmp_path):
    path = str(tmp_path / "dv")
    spark.range(0, 100, numPartitions=1).withColumn("v", F.col("id") % 97).write.format(
        "delta"
    ).option("delta.enableDeletionVectors", "true").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 10")
    rows = spark.read.format("delta").option("versionAsOf", 1).load(path)

    found = aggregated(rows, *_aggregates(), one_job=False)

    assert found == rows.agg(*_aggregates()).collect()[0].asDict()
    assert found["rows"] == 90 and found["first"] == 10


def test_an_observation_that_comes_back_without_its_values_is_answered_by_agg(spark, monkeypatch):
    # What Spark Connect 4.1 hands a command whose listener was slower than 100 ms, and
    # what Spark gives for a plan whose metrics node it optimized away: no values.
    monkeypatch.setattr(aggregates.Observation, "get", property(lambda self: {}))
    rows = spark.range(0, 1_000, numPartitions=2).withColumn("v", F.col("id") % 97)

    found = aggregated(rows, *_aggregates())

    assert found == rows.agg(*_aggregates()).collect()[0].asDict()
    assert found["rows"] == 1_000 and found["first"] == 0
