"""Targets with deletion vectors (``target.deletion_vectors``), and the one-pass commit: the
MERGE reads the staged rows and its clauses alone decide what changes, so a merge writes
the rows it changes rather than whole files; counts, the no-commit rule and the rows
attributed to partitions stay as on targets without them. Real Spark, real Delta tables."""

from __future__ import annotations

import os
from urllib.parse import unquote

import pyarrow.parquet as pq
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.maintenance import MaintenanceSettings, maintain
from incremental_assets.engine.delta_lake.store import row_count
from incremental_assets_tests.builders import (
    ParquetFolder,
    at,
    feed,
    feed_spec,
    load,
    make_spec,
)

DV = {"deletion_vectors": True}


def spark_rows(spark, target: DeltaTarget, *columns: str) -> list[tuple]:
    """The target's rows read by Spark's Delta Lake (delta-rs cannot read deletion
    vectors)."""
    found = spark.read.format("delta").load(target.path).select(*columns).collect()
    return sorted(tuple(r) for r in found)


def last_metrics(target: DeltaTarget) -> dict:
    return DeltaTable(target.path).history(1)[0]["operationMetrics"]


def test_a_merge_into_a_target_with_deletion_vectors_writes_only_the_rows_it_changes(
    spark, orders_source, target
):
    spec = make_spec(orders_source.path, target=DV)
    orders_source.upsert([(i, "placed", 1.0, at(1, i % 20)) for i in range(1, 201)])
    load(spark, spec, target, 1)
    orders_source.upsert([(i, "paid", 2.0, at(2, 1)) for i in (5, 50, 150)])
    orders_source.upsert([(201, "placed", 3.0, at(2, 2))])

    result = load(spark, spec, target, 2)

    assert (result.rows_inserted, result.rows_updated) == (1, 3)
    # Every staged row acted: their partition counts are those taken as they were staged.
    assert result.rows_by_partition == {"2026-01-02": 4}
    metrics = last_metrics(target)
    assert int(metrics["numTargetRowsCopied"]) == 0
    assert int(metrics["numOutputRows"]) == 4
    assert int(metrics["numTargetDeletionVectorsAdded"]) >= 1
    assert row_count(DeltaTable(target.path)) == 201
    found = spark_rows(spark, target, "order_id", "status")
    assert len(found) == 201
    assert {r for r in found if r[1] == "paid"} == {(5, "paid"), (50, "paid"), (150, "paid")}


def test_rereading_unchanged_rows_on_deletion_vectors_commits_nothing(spark, orders_source, target):
    spec = make_spec(orders_source.path, watermark={"lookback": "6h"}, target=DV)
    orders_source.upsert([(i, "placed", float(i), at(1, i % 20)) for i in range(1, 50)])
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()

    again = load(spark, spec, target, 1)

    assert not again.committed
    assert again.rows_unchanged == again.rows_staged > 0
    assert DeltaTable(target.path).version() == version


def test_only_rows_that_changed_something_are_attributed_to_their_partitions(
    spark, orders_source, tmp_path
):
    """A run that re-reads day 1's rows unchanged (its lookback) and loads day 2's new
    ones: the merge acted on fewer rows than were staged, so the rows by partition are
    found again against the table before the commit, on either kind of target."""
    for name, target_settings in (("plain", {}), ("vectors", DV)):
        target = DeltaTarget("orders", str(tmp_path / name))
        spec = make_spec(orders_source.path, watermark={"lookback": "2d"}, target=target_settings)
        orders_source.upsert([(i, "placed", 1.0, at(1, 12)) for i in range(1, 11)])
        load(spark, spec, target, 1)
        orders_source.upsert([(i, "placed", 1.0, at(2, 3)) for i in range(11, 14)])

        result = load(spark, spec, target, 2)

        assert result.rows_staged == 13 and result.rows_inserted == 3, name
        assert result.rows_by_partition == {"2026-01-02": 3}, name


def test_hard_deletes_on_deletion_vectors_are_left_out_of_the_row_count(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "feed")
    spec = feed_spec(folder.path, {"kind": "cdc", "deletes": "hard"}, target=DV)
    target = DeltaTarget("orders", str(tmp_path / "target"))
    folder.drop(feed(*[(i, "a", "I", i, at(1, 1)) for i in range(1, 21)]))
    load(spark, spec, target, 1)
    folder.drop(feed((3, "a", "D", 30, at(2, 1)), (4, "a", "D", 31, at(2, 2))))

    result = load(spark, spec, target, 2)

    assert result.rows_deleted == 2
    assert delta_io.rows_deleted_by_vectors(DeltaTable(target.path)) == 2
    assert row_count(DeltaTable(target.path)) == 18 == len(spark_rows(spark, target, "id"))


def test_maintenance_purges_deletion_vectors_and_keeps_every_row(spark, orders_source, target):
    spec = make_spec(orders_source.path, target=DV)
    orders_source.upsert([(i, "placed", 1.0, at(1, 1)) for i in range(1, 101)])
    load(spark, spec, target, 1)
    orders_source.upsert([(i, "paid", 2.0, at(2, 1)) for i in range(1, 101, 10)])
    load(spark, spec, target, 2)
    before = spark_rows(spark, target, "order_id", "status", "amount")
    assert delta_io.rows_deleted_by_vectors(DeltaTable(target.path)) == 10

    result = maintain(spark, target, MaintenanceSettings(retention_hours=None))

    assert result.files_purged >= 1
    assert delta_io.rows_deleted_by_vectors(DeltaTable(target.path)) == 0
    assert spark_rows(spark, target, "order_id", "status", "amount") == before
    assert load(spark, spec, target, 2).rows_extracted == 0  # the cursor stayed


def test_a_target_written_without_deletion_vectors_keeps_loading_once_they_are_on(
    spark, orders_source, target
):
    spec = make_spec(orders_source.path)
    orders_source.upsert([(i, "placed", 1.0, at(1, 1)) for i in range(1, 101)])
    load(spark, spec, target, 1)
    assert not delta_io.writes_deletion_vectors(DeltaTable(target.path))
    # The migration docs/runs.md gives.
    spark.sql(
        f"ALTER TABLE delta.`{target.path}` "
        "SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    orders_source.upsert([(7, "paid", 2.0, at(2, 1))])

    result = load(spark, spec, target, 2)

    assert (result.rows_inserted, result.rows_updated) == (0, 1)
    assert int(last_metrics(target)["numTargetRowsCopied"]) == 0
    assert (7, "paid") in spark_rows(spark, target, "order_id", "status")
    assert row_count(DeltaTable(target.path)) == 100


def test_reading_some_files_of_a_table_with_deletion_vectors_reads_those_alone(
    spark, orders_source, target
):
    spec = make_spec(orders_source.path, target=DV)
    orders_source.upsert([(i, "placed", 1.0, at(1, 1)) for i in range(1, 51)])
    load(spark, spec, target, 1)
    orders_source.upsert([(i, "placed", 1.0, at(2, 1)) for i in range(51, 101)])
    load(spark, spec, target, 2)
    orders_source.upsert([(60, "paid", 2.0, at(3, 1))])
    load(spark, spec, target, 3)
    table = DeltaTable(target.path)
    # The files that held order 60 before its update (the update's own file holds it alone).
    held = [
        f
        for f in delta_io.live_files(table).to_pylist()
        if f["min.order_id"] <= 60 <= f["max.order_id"] and f["min.order_id"] < 60
    ]
    written = pq.read_table(
        [os.path.join(target.path, unquote(f["path"])) for f in held], columns=["order_id"]
    )

    rows = delta_io.read_files(spark, table, held).select("order_id").collect()

    # Those files' rows, less order 60: its deletion vector hides it there.
    expected = sorted(i for i in written.column(0).to_pylist() if i != 60)
    assert 59 in expected and sorted(r[0] for r in rows) == expected
