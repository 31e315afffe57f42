"""Delta sources are read through Spark's Delta Lake at the version a run pins: column
mapping (any Databricks table after a rename) and deletion vectors are honoured."""

from __future__ import annotations

from deltalake import DeltaTable, write_deltalake

from incremental_assets.engine import DeltaTarget, run_load
from incremental_assets_tests.builders import at, day_request, make_spec, order_rows, target_rows


def test_a_column_mapped_source_loads_its_logical_columns(spark, tmp_path):
    source = str(tmp_path / "source")
    rows = order_rows([(1, "new", 1.0, at(1, 1)), (2, "new", 2.0, at(1, 2))])
    write_deltalake(source, rows, configuration={"delta.columnMapping.mode": "name"})
    target = DeltaTarget("orders", str(tmp_path / "orders"))

    result = run_load(spark, make_spec(source), target, day_request(1))

    assert result.rows_extracted == 2
    assert target_rows(target) == [(1, "new", 1.0, at(1, 1)), (2, "new", 2.0, at(1, 2))]


def test_a_renamed_column_of_a_mapped_source_is_read_under_its_new_name(spark, tmp_path):
    source = str(tmp_path / "source")
    rows = order_rows([(1, "new", 1.0, at(1, 1))])
    write_deltalake(source, rows, configuration={"delta.columnMapping.mode": "name"})
    spark.sql(f"ALTER TABLE delta.`{source}` RENAME COLUMN status TO state")
    target = DeltaTarget("orders", str(tmp_path / "orders"))

    run_load(spark, make_spec(source), target, day_request(1))

    assert target_rows(target, ("order_id", "state", "updated_at")) == [(1, "new", at(1, 1))]


def test_rows_deleted_through_deletion_vectors_are_not_loaded(spark, tmp_path):
    source = str(tmp_path / "source")
    rows = order_rows([(n, "new", float(n), at(1, n)) for n in (1, 2, 3)])
    (
        spark.createDataFrame(
            rows.to_pylist(),
            schema="order_id long, status string, amount double, updated_at timestamp",
        )
        .coalesce(1)
        .write.format("delta")
        .option("delta.enableDeletionVectors", "true")
        .save(source)
    )
    spark.sql(f"DELETE FROM delta.`{source}` WHERE order_id = 2")
    # The delete wrote a deletion vector, not a new data file: a Parquet read sees row 2.
    assert "deletionVectors" in DeltaTable(source).protocol().reader_features
    assert len(DeltaTable(source).get_add_actions(flatten=True)) == 1
    target = DeltaTarget("orders", str(tmp_path / "orders"))

    run_load(spark, make_spec(source), target, day_request(1))

    assert [r[0] for r in target_rows(target)] == [1, 3]


def test_a_run_reads_the_source_version_it_pinned_when_it_opened(spark, tmp_path):
    source = str(tmp_path / "source")
    write_deltalake(source, order_rows([(1, "new", 1.0, at(1, 1))]))
    target = DeltaTarget("orders", str(tmp_path / "orders"))

    def later_commit(phase: str) -> None:
        if phase == "probed":
            write_deltalake(source, order_rows([(2, "new", 2.0, at(1, 2))]), mode="append")

    result = run_load(spark, make_spec(source), target, day_request(1), hook=later_commit)

    assert result.rows_extracted == 1
    assert [r[0] for r in target_rows(target)] == [1]
    assert run_load(spark, make_spec(source), target, day_request(1)).rows_extracted == 1
    assert [r[0] for r in target_rows(target)] == [1, 2]


def test_a_dropped_column_of_a_mapped_source_is_not_read(spark, tmp_path):
    source = str(tmp_path / "source")
    rows = order_rows([(1, "new", 1.0, at(1, 1))])
    write_deltalake(source, rows, configuration={"delta.columnMapping.mode": "name"})
    spark.sql(f"ALTER TABLE delta.`{source}` DROP COLUMN status")
    target = DeltaTarget("orders", str(tmp_path / "orders"))

    run_load(spark, make_spec(source), target, day_request(1))

    assert "status" not in DeltaTable(target.path).schema().to_arrow().names
    assert target_rows(target, ("order_id", "amount", "updated_at")) == [(1, 1.0, at(1, 1))]


def test_a_snapshot_sees_a_row_deleted_through_a_deletion_vector_as_vanished(spark, tmp_path):
    source = str(tmp_path / "source")
    (
        spark.createDataFrame([(1, "pen"), (2, "ink"), (3, "pad")], "id long, name string")
        .coalesce(1)
        .write.format("delta")
        .option("delta.enableDeletionVectors", "true")
        .save(source)
    )
    spec = make_spec(
        source,
        keys=["id"],
        watermark=None,
        strategy={"kind": "snapshot", "deletes": "hard"},
    )
    target = DeltaTarget("products", str(tmp_path / "products"))
    run_load(spark, spec, target, day_request(1))
    spark.sql(f"DELETE FROM delta.`{source}` WHERE id = 2")

    second = run_load(spark, spec, target, day_request(2))

    assert second.changes == {"insert": 0, "change": 0, "vanish": 1}
    assert target_rows(target, ("id", "name")) == [(1, "pen"), (3, "pad")]
