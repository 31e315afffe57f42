"""A run that creates a table shuffles its rows into ranges of the first key without
Spark's range partitioner (engine/spark/key_ranges.py): the first write's files each
cover their own range of keys, the per-key window reuses that shuffle, and the table's
rows are the newest per key as before."""

from __future__ import annotations

import itertools
import random
from datetime import date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from incremental_assets.engine import DeltaTarget, SchemaMismatchError
from incremental_assets.engine.delta_lake.commits import session_settings
from incremental_assets.engine.spark import key_ranges
from incremental_assets.engine.strategies.base import by_key, drop_range, window_keys
from incremental_assets.engine.transforms import newest_per_key
from incremental_assets_tests.builders import at, load, make_spec, order_rows, target_rows

# Eight shuffle partitions, none coalesced: the increment is staged in eight files. The
# commit reads each in a task of its own (small files are otherwise packed several to a
# task, largest first, and the table's files would mix their ranges).
SPREAD = {
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
    "spark.sql.files.openCostInBytes": str(256 << 20),
}


def file_ranges(path: str, key: str) -> list[tuple]:
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    return sorted((a[f"min.{key}"], a[f"max.{key}"]) for a in actions)


def assert_disjoint(ranges: list[tuple]) -> None:
    for (_, high), (low, _) in itertools.pairwise(ranges):
        assert high < low, ranges


def test_spark_hash_partitioning_sends_each_bucket_value_to_its_partition(spark):
    values = key_ranges.bucket_values(8)
    rows = spark.createDataFrame([(v,) for v in values], "b int")

    placed = rows.repartition(8, F.col("b")).select("b", F.spark_partition_id().alias("p"))

    assert sorted((r.b, r.p) for r in placed.collect()) == sorted(
        (v, i) for i, v in enumerate(values)
    )
    hashed = spark.range(0, 500).select(
        F.col("id").cast("int").alias("v"), F.expr("pmod(hash(cast(id as int)), 13)").alias("p")
    )
    assert all(key_ranges.partition_of(r.v, 13) == r.p for r in hashed.collect())


def test_first_write_files_cover_disjoint_key_ranges_and_hold_the_newest_rows(
    spark, tmp_path, orders_source
):
    rng = random.Random(7)
    changes = [
        (rng.randrange(1, 5_000), "placed", float(i), at(1, rng.random() * 23))
        for i in range(4_000)
    ]
    orders_source.upsert(changes)
    target = DeltaTarget("orders", str(tmp_path / "orders"))

    with session_settings(spark, SPREAD):
        load(spark, make_spec(orders_source.path), target, 1)

    ranges = file_ranges(target.path, "order_id")
    assert len(ranges) == 8
    assert_disjoint(ranges)
    assert key_ranges.KEY_RANGE not in pa.schema(DeltaTable(target.path).schema()).names
    newest: dict[int, tuple] = {}
    for row in sorted(changes, key=lambda r: r[3]):
        newest[row[0]] = row
    assert [r[:2] for r in target_rows(target)] == sorted((k, "placed") for k in newest)
    assert {r[0]: r[2] for r in target_rows(target)} == {k: r[2] for k, r in newest.items()}


@pytest.mark.parametrize(
    ("type_name", "value"),
    [
        ("date", lambda i: date(2026, 1, 1) + timedelta(days=i)),
        ("timestamp", lambda i: datetime(2026, 1, 1) + timedelta(seconds=37 * i)),
        ("decimal(12,2)", lambda i: Decimal(i) / 4),
        ("string", lambda i: f"k{i:06d}"),
    ],
)
def test_keys_of_other_types_are_ranged_too(spark, type_name, value):
    order = list(range(3_000))
    random.Random(3).shuffle(order)
    rows = spark.createDataFrame([(value(i), i) for i in order], f"k {type_name}, n int")

    with session_settings(spark, SPREAD):
        shuffled = by_key(rows, ["k"], creates_table=True)
        parts = shuffled.groupBy(F.spark_partition_id().alias("p")).agg(
            F.min("k").alias("low"), F.max("k").alias("high"), F.count("*").alias("rows")
        )
        found = sorted((r.low, r.high) for r in parts.collect())

    assert key_ranges.KEY_RANGE not in shuffled.columns
    assert len(found) >= 6
    assert_disjoint(found)
    assert shuffled.count() == 3_000


def test_the_partition_count_is_adaptive_executions_initial_one_and_auto_is_declined(spark):
    rows = spark.range(0, 100).withColumnRenamed("id", "k")

    # Databricks' "auto" (open-source Spark refuses it as a setting).
    assert key_ranges.partition_count("auto") is None
    assert key_ranges.partition_count("0") is None
    initial = {"spark.sql.adaptive.coalescePartitions.initialPartitionNum": "12"}
    with session_settings(spark, initial):
        assert key_ranges.shuffle_partitions(spark) == 12
        found, counted = key_ranges.ranged(rows, "k", F.max("k").alias("top"))
        # The aggregates asked for are counted in the pass that finds the bounds.
        assert found is not None and counted == {"top": 99}
    configured = int(spark.conf.get("spark.sql.shuffle.partitions"))
    for off in ("spark.sql.adaptive.enabled", "spark.sql.adaptive.coalescePartitions.enabled"):
        with session_settings(spark, {**initial, off: "false"}):
            assert key_ranges.shuffle_partitions(spark) == configured != 12


def test_no_rows_and_null_keys(spark):
    empty = spark.range(0, 10).withColumnRenamed("id", "k").filter("k < 0")
    assert key_ranges.ranged(empty, "k") == (None, {})
    assert key_ranges.ranged(empty, "k", F.count(F.lit(1)).alias("rows")) == (None, {"rows": 0})

    rows = spark.createDataFrame([(None,), (1,), (2,), (None,)], "k long")
    with session_settings(spark, SPREAD):
        shuffled = by_key(rows, ["k"], creates_table=True)
        assert sorted(shuffled.collect(), key=lambda r: (r.k is None, r.k or 0)) == [
            (1,),
            (2,),
            (None,),
            (None,),
        ]


@pytest.mark.classic_only("reads the physical plan through the local session")
def test_the_per_key_window_reuses_the_range_shuffle_and_its_sort(spark):
    rows = spark.range(0, 2_000).select(
        (F.col("id") % 700).alias("k"),
        F.col("id").alias("updated_at"),
        F.lit(1).alias("_ia_row_hash"),
    )

    with session_settings(spark, SPREAD):
        ranged = by_key(rows, ["k"], creates_table=True, keep_range=True)
        newest = drop_range(
            ranged.transform(newest_per_key(window_keys(ranged, ["k"]), "updated_at"))
        )
        # As the increment is staged: in key order, which the window's sort already gave.
        newest = newest.sortWithinPartitions("k")
        plan = newest._jdf.queryExecution().executedPlan().toString()
        result = newest.collect()

    assert plan.count("Exchange") == 1, plan
    assert plan.count("Sort [") == 1, plan
    assert len(result) == 700
    assert key_ranges.KEY_RANGE not in newest.columns


def test_a_created_table_checked_by_quality_rules_is_ranged_from_its_checked_copy(
    spark, tmp_path, orders_source
):
    order = list(range(1, 3_001))
    random.Random(5).shuffle(order)
    orders_source.upsert([(i, "placed", float(i % 7) - 1, at(1, i % 23)) for i in order])
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    rule = {"name": "amount_positive", "check": "amount > 0", "action": "quarantine"}

    with session_settings(spark, SPREAD):
        result = load(spark, make_spec(orders_source.path, quality={"rules": [rule]}), target, 1)

    kept = [i for i in range(1, 3_001) if i % 7 > 1]
    assert result.quality.rows_quarantined == 3_000 - len(kept)
    assert [r[0] for r in target_rows(target)] == kept
    assert_disjoint(file_ranges(target.path, "order_id"))
    assert len(file_ranges(target.path, "order_id")) == 8
    assert key_ranges.KEY_RANGE not in pa.schema(DeltaTable(target.path).schema()).names


def test_a_source_column_named_like_the_key_range_is_refused(spark, tmp_path):
    source = str(tmp_path / "source")
    spark.createDataFrame(
        [(1, "placed", 1.0, at(1, 2), 5)],
        "order_id long, status string, amount double, updated_at timestamp, _ia_key_range int",
    ).write.format("delta").save(source)
    target = DeltaTarget("orders", str(tmp_path / "orders"))

    with pytest.raises(SchemaMismatchError, match=r"_ia_key_range.*reserved for the loader"):
        load(spark, make_spec(source), target, 1)

    assert not DeltaTable.is_deltatable(target.path)


def test_bounds_spread_each_files_rows_evenly_between_its_lowest_and_highest_key():
    quarters = [0.25, 0.5, 0.75]

    assert key_ranges.spread_bounds([(0, 100, 100)], quarters) == [25, 50, 75]
    # Two files far apart: half the rows each, the bounds inside each one's keys.
    assert key_ranges.spread_bounds([(0, 10, 10), (1000, 1010, 10)], quarters) == [5, 10, 1005]
    # A file of one key holds all its rows at that key; overlapping files add up.
    assert key_ranges.spread_bounds([(0, 100, 100), (50, 50, 100)], quarters) == [50, 50, 50]
    assert key_ranges.spread_bounds([(0, 100, 50), (0, 100, 50)], [0.5]) == [50]
    assert key_ranges.spread_bounds([(7, 7, 3)], quarters) == [7, 7, 7]
    assert key_ranges.spread_bounds([], quarters) == []
    # Files without rows, or with an end that is not a finite number, are left out.
    nan, inf = float("nan"), float("inf")
    assert key_ranges.spread_bounds([(0, 100, 100), (5, 6, 0), (nan, 9, 50)], [0.5]) == [50]
    assert key_ranges.spread_bounds([(0, inf, 10)], [0.5]) == []


def test_no_bound_falls_between_files_however_far_apart():
    # Two overlapping files whose rows per key (0.1 and 0.2) do not add up exactly in
    # floating point, then one far above (a sentinel key): the rows per key left after
    # both close must not count rows in the empty gap, where there are none.
    files = [(0.0, 10.0, 1), (1.0, 11.0, 2), (1e20, 1e20 + 1e6, 3)]

    bounds = key_ranges.spread_bounds(files, [0.6, 0.9])

    assert all(b >= 1e20 for b in bounds), bounds


def _partition_sizes(rows) -> list[int]:
    counted = rows.groupBy(F.spark_partition_id().alias("p")).count().collect()
    return sorted(r["count"] for r in counted)


def test_a_created_tables_ranges_come_from_the_statistics_when_they_describe_its_rows(spark):
    rows = spark.range(0, 1_000).withColumnRenamed("id", "k")
    long_type = rows.schema["k"].dataType
    # Statistics that put every key below 500: taken, they send keys 500-999 to the last
    # range; a sketch of the keys themselves fills the eight ranges evenly.
    low_half = key_ranges.FileKeys(((0.0, 499.0, 1_000),), long_type)
    # The same, counting twice the rows the window holds: not taken, the keys sketched.
    too_many = key_ranges.FileKeys(((0.0, 499.0, 2_000),), long_type)
    count = F.count(F.lit(1)).alias("rows")

    with session_settings(spark, SPREAD):
        taken, found = key_ranges.ranges_of(rows, "k", count, stated=lambda: low_half)
        sketched, also = key_ranges.ranges_of(rows, "k", count, stated=lambda: too_many)
        assert taken is not None and sketched is not None
        taken_sizes = _partition_sizes(taken(rows))
        sketched_sizes = _partition_sizes(sketched(rows))

    assert found == also == {"rows": 1_000}
    assert taken_sizes[-1] >= 500 and sum(taken_sizes) == 1_000
    assert max(sketched_sizes) <= 200 and len(sketched_sizes) == 8


@pytest.mark.parametrize(
    "deleted, sketched",
    [("order_id = 7", False), ("order_id % 4 = 0", True)],
    ids=["one row deleted", "a quarter deleted"],
)
def test_a_first_load_from_a_source_with_deletion_vectors_is_sketched_when_it_keeps_less(
    spark, tmp_path, monkeypatch, deleted, sketched
):
    # The log's row counts still hold the rows deletion vectors delete. With one row
    # deleted the window keeps above 90% of them: the files' statistics give the bounds.
    # With a quarter deleted it keeps less, and the keys are sketched in a pass of their
    # own. Either way only the live rows load.
    source = str(tmp_path / "source")
    for quarter in range(4):
        keys = range(quarter * 1_000 + 1, quarter * 1_000 + 1_001)
        write_deltalake(
            source, order_rows([(k, "placed", 1.0, at(1, quarter)) for k in keys]), mode="append"
        )
    spark.sql(
        f"ALTER TABLE delta.`{source}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)"
    )
    spark.sql(f"DELETE FROM delta.`{source}` WHERE {deleted}")
    assert "deletionVectors" in (DeltaTable(source).protocol().reader_features or [])
    live = {r["order_id"] for r in spark.read.format("delta").load(source).collect()}
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    sketches = []
    sketch = key_ranges.F.percentile_approx

    def counted_sketch(*args, **kwargs):
        sketches.append(args)
        return sketch(*args, **kwargs)

    monkeypatch.setattr(key_ranges.F, "percentile_approx", counted_sketch)
    with session_settings(spark, SPREAD):
        load(spark, make_spec(source), target, 1)

    assert bool(sketches) == sketched
    assert [r[0] for r in target_rows(target)] == sorted(live)
    assert_disjoint(file_ranges(target.path, "order_id"))


def test_a_first_load_from_a_delta_source_ranges_its_files_by_the_logs_statistics(
    spark, tmp_path, monkeypatch
):
    # Four appends of keys in their own quarter: the table's eight files each cover a
    # range of their own, about an eighth of the rows each (the bounds spread each file's
    # rows over its keys: a row either side of the exact eighth).
    source = str(tmp_path / "source")
    for quarter in range(4):
        keys = range(quarter * 1_000 + 1, quarter * 1_000 + 1_001)
        write_deltalake(
            source, order_rows([(k, "placed", 1.0, at(1, quarter)) for k in keys]), mode="append"
        )
    target = DeltaTarget("orders", str(tmp_path / "orders"))

    def no_sketch(*args, **kwargs):
        raise AssertionError("the keys were sketched")

    monkeypatch.setattr(key_ranges.F, "percentile_approx", no_sketch)
    with session_settings(spark, SPREAD):
        load(spark, make_spec(source), target, 1)

    actions = pa.table(DeltaTable(target.path).get_add_actions(flatten=True)).to_pylist()
    assert_disjoint(file_ranges(target.path, "order_id"))
    assert len(actions) == 8 and all(495 <= a["num_records"] <= 505 for a in actions)
    assert len(target_rows(target)) == 4_000
