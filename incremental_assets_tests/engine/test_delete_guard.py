"""Guards against a vanished source: an empty snapshot, or a run that would delete more
than ``strategy.max_delete_share`` of the target's live rows, fails before anything is
written (target and side tables), with the numbers and the setting that allows it; the
guard's numbers are metadata with a check."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from incremental_assets.dagster_layer.checks import DELETES_WITHIN_LIMIT, check_specs
from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.checks import deletes_within_limit
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.errors import DeleteGuardError
from incremental_assets.specs import TableSpec
from incremental_assets_tests.builders import DeltaSourceTable, ParquetFolder, at, load, make_spec

PRODUCTS = pa.schema([("id", pa.int64()), ("name", pa.string())])
FEED = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("op", pa.string()),
        ("lsn", pa.int64()),
        ("changed_at", pa.timestamp("us", tz="UTC")),
    ]
)


def products(ids: range | list[int]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": f"p{i}"} for i in ids], PRODUCTS)


def feed(*events: tuple) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(FEED.names, e, strict=True)) for e in events], FEED)


def snapshot_spec(path: str, **strategy):
    return make_spec(path, keys=["id"], watermark=None, strategy={"kind": "snapshot", **strategy})


def cdc_spec(path, **strategy):
    return make_spec(
        str(path),
        source={"format": "parquet"},
        keys=["id"],
        watermark={"column": "lsn", "kind": "id", "lookback": 0},
        partitioning={"column": "changed_at"},
        strategy={"kind": "cdc", **strategy},
    )


def state(target: DeltaTarget) -> tuple[int, list[int]]:
    table = DeltaTable(target.path)
    ids = sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist())
    return table.version(), ids


@pytest.fixture
def snapshot_source(tmp_path) -> DeltaSourceTable:
    return DeltaSourceTable(tmp_path / "source")


@pytest.mark.parametrize("deletes", ["hard", "soft"])
def test_an_empty_snapshot_is_refused_and_the_target_keeps_every_row(
    spark, snapshot_source, tmp_path, deletes
):
    target = DeltaTarget("products", str(tmp_path / "target"))
    snapshot_source.replace(products(range(1, 11)))
    load(spark, snapshot_spec(snapshot_source.path, deletes=deletes), target, 1)
    before = state(target)
    snapshot_source.replace(products([]))  # the export failed: one file, no rows

    with pytest.raises(DeleteGuardError) as info:
        load(spark, snapshot_spec(snapshot_source.path, deletes=deletes), target, 2)

    message = str(info.value)
    assert "table 'orders'" in message  # make_spec's table name
    assert "snapshot is empty (0 rows)" in message
    assert "10 live rows" in message
    assert "strategy.allow_empty: true" in message
    assert "Nothing was written" in message
    assert state(target) == before


def test_an_empty_snapshot_loads_when_allowed(spark, snapshot_source, tmp_path):
    target = DeltaTarget("products", str(tmp_path / "target"))
    snapshot_source.replace(products(range(1, 5)))
    load(spark, snapshot_spec(snapshot_source.path), target, 1)
    snapshot_source.replace(products([]))

    result = load(
        spark,
        snapshot_spec(snapshot_source.path, allow_empty=True, max_delete_share=1.0),
        target,
        2,
    )

    assert result.rows_deleted == 4
    assert state(target)[1] == []


def test_a_snapshot_dropping_most_rows_is_refused_with_the_numbers_and_the_setting(
    spark, snapshot_source, tmp_path
):
    target = DeltaTarget("products", str(tmp_path / "target"))
    snapshot_source.replace(products(range(1, 11)))
    load(spark, snapshot_spec(snapshot_source.path), target, 1)
    before = state(target)
    snapshot_source.replace(products(range(1, 5)))  # 6 of 10 vanish

    with pytest.raises(DeleteGuardError) as info:
        load(spark, snapshot_spec(snapshot_source.path), target, 2)

    message = str(info.value)
    assert "would delete 6 of the target's 10 live rows (60.0%)" in message
    assert "strategy.max_delete_share (50%)" in message
    assert info.value.report.deleting == 6
    assert state(target) == before

    allowed = load(spark, snapshot_spec(snapshot_source.path, max_delete_share=0.6), target, 2)
    assert allowed.rows_deleted == 6
    assert allowed.guard is not None and allowed.guard.share == 0.6


def test_a_cdc_batch_deleting_most_rows_is_refused_before_tombstones_are_written(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "feed")
    folder.drop(feed(*[(i, f"n{i}", "I", i, at(1, 1)) for i in range(1, 11)]))
    target = DeltaTarget("customers", str(tmp_path / "target"))
    spec = cdc_spec(folder.path)
    load(spark, spec, target, 1)
    before = state(target)
    folder.drop(feed(*[(i, None, "D", 10 + i, at(2, 1)) for i in range(1, 8)]))

    with pytest.raises(DeleteGuardError) as info:
        load(spark, spec, target, 2)

    assert "would delete 7 of the target's 10 live rows (70.0%)" in str(info.value)
    assert state(target) == before
    assert not DeltaTarget("x", target.path + "__tombstones").exists()


def test_deletes_of_keys_the_target_never_held_do_not_trip_the_guard(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "feed")
    folder.drop(feed(*[(i, f"n{i}", "I", i, at(1, 1)) for i in range(1, 11)]))
    target = DeltaTarget("customers", str(tmp_path / "target"))
    spec = cdc_spec(folder.path)
    load(spark, spec, target, 1)
    # Eight keys created and deleted within the batch, and one real delete.
    born = [(i, f"n{i}", "I", 2 * i, at(2, 1)) for i in range(100, 108)]
    gone = [(i, None, "D", 2 * i + 1, at(2, 1)) for i in range(100, 108)]
    folder.drop(feed(*born, *gone, (1, None, "D", 999, at(2, 2))))

    result = load(spark, spec, target, 2)

    assert result.rows_deleted == 1
    assert result.guard is not None
    assert (result.guard.deleting, result.guard.live_rows) == (1, 10)
    assert deletes_within_limit(spec, result).passed
    assert state(target)[1] == list(range(2, 11))


def soft_table(spark, tmp_path: Path) -> tuple[ParquetFolder, DeltaTarget, TableSpec]:
    """A soft-delete CDC table of 10 live rows (ids 1-10), loaded on day 1 from a feed
    folder, and its spec."""
    folder = ParquetFolder(tmp_path / "feed")
    folder.drop(feed(*[(i, f"n{i}", "I", i, at(1, 1)) for i in range(1, 11)]))
    target = DeltaTarget("orders", str(tmp_path / "target"))
    spec = cdc_spec(folder.path, deletes="soft")
    load(spark, spec, target, 1)
    return folder, target, spec


def test_the_guard_is_reported_in_commit_metadata_and_checked(spark, tmp_path):
    folder, target, spec = soft_table(spark, tmp_path)
    folder.drop(feed((1, None, "D", 20, at(2, 1)), (2, None, "D", 21, at(2, 1))))

    result = load(spark, spec, target, 2)

    outcome = deletes_within_limit(spec, result)
    assert outcome.passed
    assert outcome.description.startswith("2 of 10 live rows deleted (20.0%), limit 50%")
    commit = target.loads(limit=1)[0]
    assert (commit["rows_deleting"], commit["delete_share"]) == (2, 0.2)
    assert DELETES_WITHIN_LIMIT in {c.name for c in check_specs(spec)}


def soft_live_rows(spark, target: DeltaTarget) -> int:
    """The target's rows not soft-deleted, counted by Spark."""
    flag = F.coalesce(F.col("is_deleted"), F.lit(False))
    return target.to_spark(spark).filter(~flag).count()


def log_only(target: DeltaTarget, where: Path) -> DeltaTable:
    """The target's Delta log without its data files: what reads it needs nothing else."""
    shutil.copytree(Path(target.path) / "_delta_log", where / "_delta_log")
    return DeltaTable(str(where))


def test_a_soft_delete_runs_live_rows_come_from_the_log_statistics(spark, tmp_path):
    # Deleted, inserted again, deleted again: the live rows are the deleted_at nulls.
    folder, target, spec = soft_table(spark, tmp_path)
    folder.drop(feed((1, None, "D", 20, at(2, 1)), (2, None, "D", 21, at(2, 1))))
    load(spark, spec, target, 2)
    folder.drop(feed((1, "back", "I", 30, at(3, 1)), (3, None, "D", 31, at(3, 2))))
    load(spark, spec, target, 3)
    folder.drop(feed((4, None, "D", 40, at(4, 1))))

    result = load(spark, spec, target, 4)

    assert soft_live_rows(spark, target) == 7
    assert result.guard is not None
    assert (result.guard.deleting, result.guard.live_rows) == (1, 8)  # before the run
    assert target.loads(limit=1)[0]["live_rows_from"] == "statistics"
    folder.drop(feed((5, "e2", "U", 50, at(5, 1))))
    quiet = load(spark, spec, target, 5)  # deletes nothing: its live rows from the log still
    assert quiet.guard is not None and quiet.guard.live_rows == 7
    # The count needs the log alone: a copy of it without a data file gives it.
    log = log_only(target, tmp_path / "log")
    assert delta_io.unflagged_rows(log, "deleted_at", "changed_at") == 7


def test_a_soft_delete_without_a_time_is_counted_by_spark(spark, tmp_path):
    # The delete's changed_at is null, so its deleted_at is too: the statistics cannot tell
    # it from a live row, and Spark counts.
    folder, target, spec = soft_table(spark, tmp_path)
    folder.drop(feed((1, None, "D", 20, None), (5, "e", "U", 21, at(2, 1))))
    load(spark, spec, target, 2)
    assert soft_live_rows(spark, target) == 9
    assert delta_io.unflagged_rows(DeltaTable(target.path), "deleted_at", "changed_at") is None
    folder.drop(feed((2, None, "D", 30, at(3, 1))))

    result = load(spark, spec, target, 3)

    assert result.guard is not None
    assert (result.guard.deleting, result.guard.live_rows) == (1, 9)
    assert target.loads(limit=1)[0]["live_rows_from"] == "spark"
    assert soft_live_rows(spark, target) == 8
    # A run that deletes nothing is not judged: no scan, and no live_rows reported.
    folder.drop(feed((3, "c2", "U", 40, at(4, 1))))
    quiet = load(spark, spec, target, 4)
    assert quiet.rows_updated == 1
    assert "live_rows" not in target.loads(limit=1)[0]


WIDE = 36  # columns between a feed's name and its changed_at: a table of more than 32


def wide_feed(*events: tuple) -> pa.Table:
    """Change events ``(id, name, op, lsn, changed_at)`` with ``WIDE`` more columns before
    ``changed_at``, so that it and ``deleted_at`` come after Delta's 32 indexed columns."""
    fields = [("id", pa.int64()), ("name", pa.string()), ("op", pa.string())]
    fields += [("lsn", pa.int64())] + [(f"c{i:02d}", pa.int32()) for i in range(WIDE)]
    fields += [("changed_at", pa.timestamp("us", tz="UTC"))]
    rows = [{"id": i, "name": n, "op": o, "lsn": s, "changed_at": t} for i, n, o, s, t in events]
    for row in rows:
        row.update({f"c{i:02d}": i for i in range(WIDE)})
    return pa.Table.from_pylist(rows, pa.schema(fields))


def wide_soft_table(tmp_path, rows: int) -> tuple[ParquetFolder, DeltaTarget, TableSpec]:
    """A soft-delete table of ``wide_feed`` rows, its first day's ``rows`` inserts dropped
    in its feed (not loaded)."""
    folder = ParquetFolder(tmp_path / "feed")
    folder.drop(wide_feed(*[(i, f"n{i}", "I", i, at(1, 1)) for i in range(1, rows + 1)]))
    target = DeltaTarget("orders", str(tmp_path / "target"))
    return folder, target, cdc_spec(folder.path, deletes="soft")


def test_a_wide_soft_delete_table_keeps_statistics_of_deleted_at_and_counts_from_them(
    spark, tmp_path
):
    # Delta keeps statistics of a table's first 32 columns; deleted_at comes last, so a wide
    # table names the columns its runs read statistics of (delta.dataSkippingStatsColumns).
    folder, target, spec = wide_soft_table(tmp_path, 10)
    load(spark, spec, target, 1)
    folder.drop(wide_feed((1, None, "D", 20, at(2, 1)), (2, None, "D", 21, at(2, 1))))

    result = load(spark, spec, target, 2)

    table = DeltaTable(target.path)
    named = table.metadata().configuration["delta.dataSkippingStatsColumns"].split(",")
    assert len(table.schema().fields) > 40 and len(named) == 32
    assert {"`id`", "`lsn`", "`changed_at`", "`deleted_at`"} <= set(named)
    assert result.guard is not None
    assert (result.guard.deleting, result.guard.live_rows) == (2, 10)
    assert target.loads(limit=1)[0]["live_rows_from"] == "statistics"
    assert delta_io.unflagged_rows(table, "deleted_at", "changed_at") == 8
    assert soft_live_rows(spark, target) == 8
    # The files a merge touches are still found by the first key's statistics.
    assert table.get_add_actions(flatten=True).column("min.id").null_count == 0


def test_a_wide_table_created_under_a_session_default_of_more_indexed_columns_keeps_it(
    spark, tmp_path
):
    # The session's default count of indexed columns covers deleted_at: no property, and
    # the guard still counts live rows from the statistics (every column has them).
    folder, target, spec = wide_soft_table(tmp_path, 4)
    default = "spark.databricks.delta.properties.defaults.dataSkippingNumIndexedCols"
    spark.conf.set(default, "60")
    try:
        load(spark, spec, target, 1)
    finally:
        spark.conf.unset(default)
    folder.drop(wide_feed((1, None, "D", 20, at(2, 1))))

    result = load(spark, spec, target, 2)

    configuration = DeltaTable(target.path).metadata().configuration
    assert "delta.dataSkippingStatsColumns" not in configuration
    assert configuration["delta.dataSkippingNumIndexedCols"] == "60"
    assert result.guard is not None and result.guard.live_rows == 4
    assert target.loads(limit=1)[0]["live_rows_from"] == "statistics"


def test_a_narrow_table_keeps_delta_s_default_statistics(spark, tmp_path):
    _, target, _ = soft_table(spark, tmp_path)

    assert "delta.dataSkippingStatsColumns" not in DeltaTable(target.path).metadata().configuration
