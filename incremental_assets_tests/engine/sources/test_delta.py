"""Delta sources are read through Spark's Delta Lake at the version a run pins: column
mapping (any Databricks table after a rename) and deletion vectors are honoured."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from incremental_assets.engine import DeltaTarget, run_load
from incremental_assets.engine.guards import probe_source
from incremental_assets.engine.predicates import Range
from incremental_assets.engine.sources.delta import DeltaSource
from incremental_assets_tests.builders import (
    at,
    day_request,
    jobs_in,
    make_spec,
    order_rows,
    target_rows,
)


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


def _three_files_by_hour(source: str) -> list[dict]:
    """Three appends of rising ``updated_at``, the last one's highest value inside a
    millisecond (Delta's statistics keep it to the millisecond); their add actions."""
    top = at(1, 5) + timedelta(microseconds=999_999)
    for rows in (
        [(1, "new", 1.0, at(1, 1)), (2, "new", 2.0, at(1, 2))],
        [(3, "new", 3.0, at(1, 3))],
        [(4, "new", 4.0, at(1, 4)), (5, "new", 5.0, top)],
    ):
        write_deltalake(source, order_rows(rows), mode="append")
    return pa.table(DeltaTable(source).get_add_actions(flatten=True)).to_pylist()


def _keep_only_the_highest(source: str, files: list[dict], column: str) -> None:
    """Every file but the one with the highest maximum of ``column`` removed from disk,
    still in the log: a scan that opened them would fail."""
    last = max(files, key=lambda f: f[f"max.{column}"])
    for add in files:
        if add is not last:
            os.remove(os.path.join(source, add["path"]))


def _probe_high_water(
    spark,
    source: str,
    cap: datetime | None,
    bounds=None,
    lower: datetime | None = None,
    scanned: bool = False,
) -> object:
    spec = make_spec(source)
    opened = DeltaSource.open(spark, "orders", spec.source, {})
    if bounds is not None:  # statistics that do not describe the rows Spark reads
        opened.highest_bounds = lambda column: bounds
    if scanned:  # as where delta-rs cannot state it (a catalog table): Spark's scan
        opened.stated_highest = lambda column: None
    part = (Range("updated_at", lower, False, cap, False),)
    probed = probe_source(opened, "updated_at", "UTC", (at(1), at(2)), (part, "timestamp"))
    return probed.high_water


def test_the_probe_reads_only_the_files_whose_statistics_may_hold_the_highest_mark(spark, tmp_path):
    source = str(tmp_path / "source")
    _keep_only_the_highest(source, _three_files_by_hour(source), "updated_at")

    top = at(1, 5) + timedelta(microseconds=999_999)  # exact, below the statistics
    # Stated by delta-rs from the one file, and found by Spark's narrowed scan alike.
    assert _probe_high_water(spark, source, cap=at(2)) == top
    assert _probe_high_water(spark, source, cap=at(2), scanned=True) == top


def test_a_cap_below_the_statistics_highest_value_keeps_the_whole_part_in_the_probe(
    spark, tmp_path
):
    source = str(tmp_path / "source")
    _three_files_by_hour(source)

    # The cap lies under the last file's highest value: its highest row below the cap is
    # the mark, which a scan from the statistics' bound would miss.
    assert _probe_high_water(spark, source, cap=at(1, 4, 30)) == at(1, 4)
    assert _probe_high_water(spark, source, cap=None) == at(1, 5) + timedelta(microseconds=999_999)


def test_statistics_that_count_deleted_rows_bound_no_highest_value(spark, tmp_path):
    source = str(tmp_path / "source")
    _three_files_by_hour(source)
    spec = make_spec(source)
    assert DeltaSource.open(spark, "orders", spec.source, {}).highest_bounds("updated_at")
    spark.sql(
        f"ALTER TABLE delta.`{source}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)"
    )
    spark.sql(f"DELETE FROM delta.`{source}` WHERE order_id = 5")

    reopened = DeltaSource.open(spark, "orders", spec.source, {})

    assert reopened.highest_bounds("updated_at") is None
    assert _probe_high_water(spark, source, cap=None) == at(1, 4)


def test_statistics_above_every_row_fall_back_to_the_whole_part_and_say_so(spark, tmp_path):
    source = str(tmp_path / "source")
    _three_files_by_hour(source)
    loose = (at(1, 6), at(1, 6) + timedelta(milliseconds=1))  # no row lies at or above 06:00

    with pytest.warns(UserWarning, match="maximum statistics of 'updated_at' hold no row"):
        high = _probe_high_water(spark, source, cap=None, bounds=loose)

    assert high == at(1, 5) + timedelta(microseconds=999_999)


def test_a_part_above_every_row_finds_no_mark_and_falls_back_to_nothing(spark, tmp_path):
    # An empty increment: the cursor already at the highest row. No mark, and no scan of
    # the whole part (pyproject.toml turns the fallback's warning into an error).
    source = str(tmp_path / "source")
    _three_files_by_hour(source)

    top = at(1, 5) + timedelta(microseconds=999_999)
    assert _probe_high_water(spark, source, cap=at(2), lower=top) is None
    assert _probe_high_water(spark, source, cap=at(2), lower=at(1, 5)) == top


def test_an_id_watermark_is_probed_from_the_files_its_statistics_say_hold_the_highest(
    spark, tmp_path
):
    # Integer statistics are exact: the probe finds the same mark with every file but the
    # one whose maximum is the highest gone from disk (it reads none: the test below).
    source = str(tmp_path / "source")
    _keep_only_the_highest(source, _three_files_by_hour(source), "order_id")
    opened = DeltaSource.open(spark, "orders", make_spec(source).source, {})
    assert opened.highest_bounds("order_id") == (5, 5)

    part = (Range("order_id", 2, False, None, False),)
    probed = probe_source(opened, "order_id", "UTC", None, (part, "id"))

    assert probed.high_water == 5


def test_an_id_watermarks_mark_is_read_from_the_log_with_no_scan(spark, tmp_path):
    # Integer statistics of live rows state the highest value exactly: with every data
    # file gone from disk (a scan would fail), the probe still finds the mark, or that
    # no row lies above the cursor. A cap at or below that value needs the highest row
    # under it, which only a scan finds.
    source = str(tmp_path / "source")
    files = _three_files_by_hour(source)
    opened = DeltaSource.open(spark, "orders", make_spec(source).source, {})
    assert opened.stated_highest("order_id") == 5
    capped = (Range("order_id", 2, False, 5, False),)
    assert probe_source(opened, "order_id", "UTC", None, (capped, "id")).high_water == 4
    for add in files:
        os.remove(os.path.join(source, add["path"]))

    def mark(lower: int | None, upper: int | None = None, inclusive: bool = False):
        part = (Range("order_id", lower, False, upper, inclusive),)
        return probe_source(opened, "order_id", "UTC", None, (part, "id")).high_water

    assert (mark(2), mark(None), mark(4), mark(2, 6), mark(2, 5, inclusive=True)) == (5,) * 5
    assert (mark(5), mark(7)) == (None, None)  # the cursor at or above every row
    with pytest.raises(Exception, match=r"(?i)file.*(not exist|not found)"):
        mark(2, 5)  # below the cap: scanned


def test_a_time_watermarks_mark_and_range_are_found_with_no_spark_job(spark, tmp_path):
    # A timestamp's statistics are kept to the millisecond: delta-rs reads the rows at or
    # above their bound from the one file that may hold the highest (the others gone from
    # disk), and the statistics put every row in range. Rows out of range still take a
    # scan, which counts them.
    source = str(tmp_path / "source")
    _keep_only_the_highest(source, _three_files_by_hour(source), "updated_at")
    opened = DeltaSource.open(spark, "orders", make_spec(source).source, {})
    top = at(1, 5) + timedelta(microseconds=999_999)
    part = (Range("updated_at", at(1, 2), False, None, False),)

    probed, jobs = jobs_in(
        spark,
        "probe",
        lambda: probe_source(opened, "updated_at", "UTC", (at(1), at(2)), (part, "timestamp")),
    )

    assert (probed.high_water, probed.nulls, jobs) == (top, 0, 0)
    assert probed.outside is not None and probed.outside.total == 0
    with pytest.raises(Exception, match=r"(?i)file.*(not exist|not found)"):
        probe_source(opened, "updated_at", "UTC", (at(1, 3), at(2)), (part, "timestamp"))


def test_a_catalog_delta_sources_mark_is_not_taken_from_its_log(spark, tmp_path):
    # A catalog may filter the rows its readers see (row filters): its log's statistics
    # count rows Spark may not read, so the mark comes from a scan.
    source = str(tmp_path / "source")
    _keep_only_the_highest(source, _three_files_by_hour(source), "order_id")
    name = f"src_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{source}'")
    try:
        spec = make_spec("", source={"format": "delta", "path": None, "table": name})
        opened = DeltaSource.open(spark, "orders", spec.source, {})
        assert opened.highest_bounds("order_id") == (5, 5)
        part = (Range("order_id", 2, False, None, False),)

        probed, jobs = jobs_in(
            spark, "catalog", lambda: probe_source(opened, "order_id", "UTC", None, (part, "id"))
        )

        assert opened.stated_highest("order_id") is None
        assert probed.high_water == 5 and jobs > 0
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")


def test_sentinel_timestamps_at_the_ends_of_the_calendar_are_counted_out_of_range(spark, tmp_path):
    # A minimum of 0001-01-01 or a maximum at 9999-12-31's last millisecond: widening
    # the statistics by their millisecond passes the ends of Python's datetimes.
    source = str(tmp_path / "source")
    first = datetime(1, 1, 1, tzinfo=timezone.utc)
    last = datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=timezone.utc)
    write_deltalake(source, order_rows([(1, "x", 1.0, first), (2, "x", 2.0, at(1, 1))]))
    write_deltalake(source, order_rows([(3, "x", 3.0, last)]), mode="append")
    opened = DeltaSource.open(spark, "orders", make_spec(source).source, {})
    part = (Range("updated_at", None, False, at(2), False),)

    probed = probe_source(opened, "updated_at", "UTC", (at(1), at(2)), (part, "timestamp"))

    assert probed.outside is not None
    assert (probed.outside.before_start, probed.outside.in_future) == (1, 1)
    assert probed.high_water == at(1, 1)


def test_a_column_mapped_source_counts_its_rows_out_of_range_by_a_scan(spark, tmp_path):
    # Its statistics are kept by physical names: the probe does not judge rows out of
    # range by them, and its scan counts them.
    source = str(tmp_path / "source")
    rows = order_rows(
        [(1, "x", 1.0, at(1, 1)), (2, "x", 2.0, datetime(1999, 1, 1, tzinfo=timezone.utc))]
    )
    write_deltalake(source, rows, configuration={"delta.columnMapping.mode": "name"})
    opened = DeltaSource.open(spark, "orders", make_spec(source).source, {})
    outside = [(Range("updated_at", None, False, at(1), False),)]

    probed = probe_source(opened, "updated_at", "UTC", (at(1), at(2)), None)

    assert not opened.holds_none(outside, "UTC")
    assert probed.outside is not None and probed.outside.before_start == 1


def test_a_file_of_null_watermarks_bounds_nothing_and_the_probe_finds_the_mark(spark, tmp_path):
    # A file whose watermarks are all null has no maximum: its statistics count its
    # nulls, so it holds no candidate for the highest value and the others still bound it.
    source = str(tmp_path / "source")
    _three_files_by_hour(source)
    nulls = order_rows([(6, "new", 6.0, at(1, 6))]).set_column(
        3, "updated_at", pa.array([None], pa.timestamp("us", "UTC"))
    )
    write_deltalake(source, nulls, mode="append")
    adds = pa.table(DeltaTable(source).get_add_actions(flatten=True)).to_pylist()
    assert any(a["max.updated_at"] is None and a["null_count.updated_at"] == 1 for a in adds)

    opened = DeltaSource.open(spark, "orders", make_spec(source).source, {})
    top = at(1, 5) + timedelta(microseconds=999_999)
    low, high = opened.highest_bounds("updated_at")
    assert low <= top <= high
    assert _probe_high_water(spark, source, cap=at(2)) == top


def test_a_source_without_statistics_is_probed_over_its_whole_part(spark, tmp_path):
    # A table that keeps no statistics for its columns bounds nothing: the probe scans the
    # whole part, and finds the same mark, without a warning (pyproject.toml makes one an
    # error).
    source = str(tmp_path / "source")
    spark.sql(
        f"CREATE TABLE delta.`{source}` (order_id BIGINT, status STRING, amount DOUBLE,"
        " updated_at TIMESTAMP) USING delta"
        " TBLPROPERTIES ('delta.dataSkippingNumIndexedCols' = '0')"
    )
    spark.createDataFrame(
        [(1, "new", 1.0, at(1, 1)), (2, "new", 2.0, at(1, 3))],
        "order_id BIGINT, status STRING, amount DOUBLE, updated_at TIMESTAMP",
    ).write.format("delta").mode("append").save(source)

    opened = DeltaSource.open(spark, "orders", make_spec(source).source, {})

    assert opened.highest_bounds("updated_at") is None
    assert _probe_high_water(spark, source, cap=at(2)) == at(1, 3)


def test_the_keys_of_the_files_a_window_reads_are_taken_from_the_log(spark, tmp_path):
    # Each file's lowest and highest key and its rows, for the files the window's parts
    # keep by their statistics; a key that is not a number, or a file whose key has no
    # statistics, says nothing.
    source = str(tmp_path / "source")
    _three_files_by_hour(source)
    opened = DeltaSource.open(spark, "orders", make_spec(source).source, {})

    every = opened.key_files("order_id", None)
    later = opened.key_files("order_id", [(Range("updated_at", at(1, 3), False, None, False),)])

    assert every is not None and sorted(every.files) == [
        (1.0, 2.0, 2),
        (3.0, 3.0, 1),
        (4.0, 5.0, 2),
    ]
    assert every.rows == 5 and every.data_type == opened.schema["order_id"].dataType
    assert later is not None and sorted(later.files) == [(3.0, 3.0, 1), (4.0, 5.0, 2)]
    assert opened.key_files("status", None) is None
    # A window that keeps part of a file's rows: its statistics do not count the rows read.
    cut = [(Range("updated_at", None, False, at(1, 4.5), True),)]
    assert opened.key_files("order_id", cut) is None
    nulls = str(tmp_path / "nulls")
    write_deltalake(nulls, order_rows([(1, "new", 1.0, at(1, 1))]))
    no_keys = pa.table({"order_id": pa.array([None], pa.int64()), "status": ["x"]})
    write_deltalake(nulls, no_keys, mode="append", schema_mode="merge")
    assert (
        DeltaSource.open(spark, "o", make_spec(nulls).source, {}).key_files("order_id", None)
        is None
    )


def test_a_column_mapped_source_states_no_keys(spark, tmp_path):
    # Its statistics are kept by physical names, which the log's flattened actions name.
    source = str(tmp_path / "source")
    write_deltalake(
        source,
        order_rows([(1, "x", 1.0, at(1, 1))]),
        configuration={"delta.columnMapping.mode": "name"},
    )

    assert (
        DeltaSource.open(spark, "o", make_spec(source).source, {}).key_files("order_id", None)
        is None
    )


def test_a_source_with_deletion_vectors_states_its_files_rows_deleted_ones_included(
    spark, tmp_path
):
    # Its files' row counts include the rows the vectors delete (the caller's own count
    # of the window tells whether they still describe it); their bounds still bound the
    # live rows.
    source = str(tmp_path / "source")
    rows = spark.createDataFrame([(n, "x") for n in range(10)], "order_id long, status string")
    rows.coalesce(1).write.format("delta").option("delta.enableDeletionVectors", "true").save(
        source
    )
    spark.sql(f"DELETE FROM delta.`{source}` WHERE order_id < 3")
    opened = DeltaSource.open(spark, "o", make_spec(source).source, {})

    assert opened.reads_deletion_vectors
    stated = opened.key_files("order_id", None)
    assert stated is not None and stated.files == ((0.0, 9.0, 10),)
