"""Incremental loads through the engine: real Spark, real Delta tables in temp folders."""

from __future__ import annotations

import gzip
import itertools
import json
import random
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from incremental_assets.engine import DeltaTarget, LoadRequest, run_load, staging
from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake import merge_plan, store
from incremental_assets.engine.delta_lake.maintenance import target_file_bytes
from incremental_assets.engine.delta_lake.store import app_id
from incremental_assets.engine.errors import NullValuesError
from incremental_assets.engine.load import interpreted
from incremental_assets.engine.load import stage as stage_module
from incremental_assets.engine.operations import rewind
from incremental_assets.engine.reload import differences
from incremental_assets.engine.sources.files import FileSource
from incremental_assets.engine.spark import cores, key_ranges, runtime_conf
from incremental_assets.engine.strategies import rows as rows_module
from incremental_assets_tests.builders import (
    DeltaSourceTable,
    ParquetFolder,
    at,
    load,
    make_spec,
    order_rows,
    staging_seen,
    target_rows,
)
from incremental_assets_tests.servers import INTERPRETED


def test_second_run_extracts_only_rows_after_watermark_minus_lookback(spark, orders_source, target):
    spec = make_spec(orders_source.path, watermark={"lookback": "1h"})
    orders_source.upsert([(i, "placed", 1.0, at(1, 10)) for i in range(1, 101)])
    first = load(spark, spec, target, 1)
    assert (first.rows_extracted, first.rows_inserted) == (100, 100)

    # 5 rows inside the lookback hour, 3 new rows, 2 updates: only those are read.
    orders_source.upsert([(200 + i, "placed", 1.0, at(1, 9, 30)) for i in range(5)])
    orders_source.upsert([(300 + i, "placed", 2.0, at(1, 12)) for i in range(3)])
    orders_source.upsert([(1, "paid", 1.0, at(1, 11)), (2, "paid", 1.0, at(1, 11))])
    second = load(spark, spec, target, 1)

    # Window (10:00 - 1h, 12:00]: the 100 rows at 10:00 (re-read), 5 + 3 + 2 changed rows.
    assert second.rows_extracted == 100 + 5 + 3
    assert (second.rows_inserted, second.rows_updated) == (8, 2)
    assert second.cursor_after == at(1, 12)
    assert len(target_rows(target)) == 108


def test_rerunning_a_partition_changes_nothing(spark, orders_source, target):
    spec = make_spec(orders_source.path, watermark={"lookback": "6h"})
    orders_source.upsert([(i, "placed", float(i), at(1, i % 20)) for i in range(1, 50)])
    load(spark, spec, target, 1)
    version, rows = DeltaTable(target.path).version(), target_rows(target)

    again = load(spark, spec, target, 1)

    assert not again.committed
    assert (again.rows_inserted, again.rows_updated) == (0, 0)
    assert again.rows_unchanged == again.rows_staged > 0
    assert DeltaTable(target.path).version() == version
    assert target_rows(target) == rows


def test_empty_increment_makes_no_delta_version_and_keeps_watermark(spark, orders_source, target):
    spec = make_spec(orders_source.path)  # no lookback
    orders_source.upsert([(1, "placed", 1.0, at(1, 5))])
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()

    empty = load(spark, spec, target, 1)

    assert (empty.rows_extracted, empty.rows_inserted, empty.rows_updated) == (0, 0, 0)
    assert not empty.committed
    assert empty.cursor_after == empty.cursor_before == at(1, 5)
    assert DeltaTable(target.path).version() == version


def test_watermark_is_committed_in_the_same_delta_commit_as_the_data(spark, orders_source, target):
    spec = make_spec(orders_source.path)
    orders_source.upsert([(1, "placed", 1.0, at(1, 5)), (2, "placed", 1.0, at(1, 7))])
    result = load(spark, spec, target, 1)

    table = DeltaTable(target.path)
    commit = table.history(1)[0]
    assert commit["version"] == result.delta_version == table.version()
    assert int(commit["operationMetrics"]["numFiles"]) >= 1  # the data...
    record = delta_commits.parse(commit)
    assert record["cursor_after"] == "2026-01-01T07:00:00Z"  # ...its watermark...
    # ...as Delta's idempotent write of the table's first commit sequence.
    assert record["sequence"] == 0
    assert table.transaction_version(app_id("orders")) == 0
    assert target.state("timestamp").cursor == at(1, 7)


def test_rows_arriving_during_a_run_are_loaded_by_the_next_run(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "events")
    spec = make_spec(str(folder.path), source={"format": "parquet"})
    folder.drop(order_rows([(i, "placed", 1.0, at(1, 8)) for i in range(1, 11)]))
    target = DeltaTarget("orders", str(tmp_path / "target"))

    def write_during_run(phase: str) -> None:
        # After the high-water mark is captured: rows land in the source mid-run, some
        # stamped later than the mark and some at exactly the mark.
        if phase == "probed":
            folder.drop(order_rows([(i, "placed", 1.0, at(1, 9)) for i in range(11, 16)]))

    first = load(spark, spec, target, 1, hook=write_during_run)
    assert first.cursor_after == at(1, 8)
    assert first.rows_inserted == 10

    second = load(spark, spec, target, 1)
    assert second.rows_inserted == 5
    assert second.cursor_after == at(1, 9)
    assert [r[0] for r in target_rows(target)] == list(range(1, 16))


def test_an_increment_of_a_few_megabytes_is_one_file_not_one_a_core(spark, tmp_path):
    # 100,000 new rows shuffle about 4 MB: adaptive execution's default coalescing aims at
    # a partition a core (parallelism first, 1 MB at least): a file a core here.
    if cores.usable_cores() < 2:
        pytest.skip("one core: Spark's default coalescing would write one file too")
    folder = ParquetFolder(tmp_path / "events")
    spec = make_spec(str(folder.path), source={"format": "parquet"}, strategy="append")
    target = DeltaTarget("orders", str(tmp_path / "target"))
    folder.drop(order_rows([(i, "placed", 1.0, at(1, 8)) for i in range(1, 20_001)]))
    load(spark, spec, target, 1)
    folder.drop(order_rows([(i, "placed", 1.0, at(2, 9)) for i in range(20_001, 120_001)]))

    second = load(spark, spec, target, 2)

    assert second.rows_inserted == 100_000
    table = DeltaTable(target.path)
    metrics = table.history(1)[0]["operationMetrics"]
    assert int(metrics["numTargetFilesAdded"]) == 1, metrics
    assert len(table.file_uris()) == 2  # the first load's, and the increment's


def test_several_versions_of_a_key_in_one_batch_land_as_the_newest(
    spark, orders_source, target, tmp_path
):
    folder = ParquetFolder(tmp_path / "changes")
    folder.drop(
        order_rows(
            [
                (1, "placed", 1.0, at(1, 1)),
                (1, "shipped", 1.0, at(1, 3)),
                (1, "paid", 1.0, at(1, 2)),
                (2, "placed", 5.0, at(1, 4)),
                (2, "placed", 5.0, at(1, 4)),  # exact duplicate
            ]
        )
    )
    spec = make_spec(str(folder.path), source={"format": "parquet"})

    result = load(spark, spec, target, 1)

    assert (result.rows_extracted, result.rows_staged, result.duplicates_in_batch) == (5, 2, 3)
    assert target_rows(target) == [(1, "shipped", 1.0, at(1, 3)), (2, "placed", 5.0, at(1, 4))]


def test_replaying_an_old_partition_never_replaces_a_newer_row(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "changes")
    spec = make_spec(str(folder.path), source={"format": "parquet"})
    target = DeltaTarget("orders", str(tmp_path / "target"))
    # The change log holds both versions of order 1: placed on day 1, shipped on day 3.
    folder.drop(order_rows([(1, "placed", 1.0, at(1, 9)), (2, "placed", 2.0, at(1, 9))]))
    folder.drop(order_rows([(1, "shipped", 1.0, at(3, 9))]))
    load(spark, spec, target, 1, 3)
    newest = target_rows(target)

    replay = load(spark, spec, target, 1)  # day 1 is behind the cursor: a re-read

    assert replay.mode == "backfill"
    assert replay.rows_extracted == 2 and replay.rows_updated == 0
    assert target_rows(target) == newest
    assert (1, "shipped", 1.0, at(3, 9)) in newest


def test_windows_loaded_in_any_order_converge_to_the_same_table(spark, tmp_path):
    rng = random.Random(3)
    folder = ParquetFolder(tmp_path / "changes")
    versions = []
    for _ in range(400):
        key = rng.randint(1, 60)
        stamp = at(rng.randint(1, 6), rng.randint(0, 23), rng.choice([0, 0, 30]))
        versions.append((key, rng.choice(["a", "b", "c"]), float(rng.randint(1, 9)), stamp))
    folder.drop(order_rows(versions))
    spec = make_spec(str(folder.path), source={"format": "parquet"})

    in_order = DeltaTarget("orders", str(tmp_path / "in_order"))
    for d in range(1, 7):
        load(spark, spec, in_order, d)
    shuffled = DeltaTarget("orders", str(tmp_path / "shuffled"))
    for d in [4, 2, 6, 1, 5, 3, 6, 2]:
        load(spark, spec, shuffled, d, backfill=True)

    assert target_rows(shuffled) == target_rows(in_order)
    assert differences(spark, spec, in_order) == (0, 0)


def test_late_row_inside_lookback_is_loaded_exactly_once(spark, orders_source, target):
    spec = make_spec(orders_source.path, watermark={"lookback": "2h"})
    orders_source.upsert([(1, "placed", 1.0, at(1, 23, 30))])
    load(spark, spec, target, 1)
    # Arrives after day 1 was loaded, stamped 23:00 on day 1: inside the 2h lookback.
    orders_source.upsert([(2, "placed", 1.0, at(1, 23))])
    orders_source.upsert([(3, "placed", 1.0, at(2, 6))])

    day2 = load(spark, spec, target, 2)
    orders_source.upsert([(4, "placed", 1.0, at(3, 8))])
    day3 = load(spark, spec, target, 3)

    assert day2.rows_inserted == 2  # the late row and the new one
    assert day3.rows_inserted == 1 and day3.rows_updated == 0  # not again
    assert [r[0] for r in target_rows(target)] == [1, 2, 3, 4]


def test_row_older_than_lookback_is_loaded_once_by_backfill_of_its_partition(
    spark, orders_source, target
):
    spec = make_spec(orders_source.path, watermark={"lookback": "1h"})
    orders_source.upsert([(1, "placed", 1.0, at(1, 10)), (2, "placed", 1.0, at(2, 10))])
    load(spark, spec, target, 1)
    load(spark, spec, target, 2)
    # Stamped on day 1 but written after day 2 was loaded, beyond any lookback, by a MERGE
    # that rewrote the source's file: without a change data feed no run can tell the
    # changed row from the copies (appended rows would be read by the next run).
    orders_source.upsert([(1, "paid", 1.0, at(1, 12))])
    rewrite = DeltaTable(orders_source.path).version()
    orders_source.upsert([(4, "placed", 1.0, at(3, 6))])
    day3 = load(spark, spec, target, 3)
    assert (day3.rows_inserted, day3.rows_updated) == (1, 0)  # only order 4
    assert day3.late_unchecked == str(rewrite)  # and it names the version it could not read

    backfill = load(spark, spec, target, 1, backfill=True)
    again = load(spark, spec, target, 1, backfill=True)

    assert backfill.rows_updated == 1 and backfill.cursor_after == at(3, 6)
    assert again.rows_updated == 0 and not again.committed
    assert [r[:2] for r in target_rows(target)] == [(1, "paid"), (2, "placed"), (4, "placed")]


def test_backfill_of_a_range_equals_loading_partitions_one_by_one(spark, tmp_path):
    rng = random.Random(11)
    folder = ParquetFolder(tmp_path / "changes")
    rows = [
        (rng.randint(1, 80), rng.choice("xyz"), 1.0, at(rng.randint(1, 5), rng.randint(0, 23)))
        for _ in range(300)
    ]
    folder.drop(order_rows(rows))
    spec = make_spec(str(folder.path), source={"format": "parquet"})
    one_by_one = DeltaTarget("orders", str(tmp_path / "one_by_one"))
    for d in range(1, 6):
        load(spark, spec, one_by_one, d)
    ranged = DeltaTarget("orders", str(tmp_path / "ranged"))

    result = load(spark, spec, ranged, 1, 5)

    assert result.committed
    assert target_rows(ranged) == target_rows(one_by_one)
    assert one_by_one.state("timestamp").cursor == ranged.state("timestamp").cursor


def test_many_rows_sharing_the_watermark_value_are_all_loaded(spark, orders_source, target):
    spec = make_spec(orders_source.path, watermark={"lookback": "1s"})
    burst = at(1, 12)
    orders_source.upsert([(i, "placed", 1.0, burst) for i in range(1, 1001)])
    load(spark, spec, target, 1)
    # More rows of the same batch import commit after the run, with the same timestamp.
    orders_source.upsert([(i, "placed", 1.0, burst) for i in range(1001, 1501)])

    second = load(spark, spec, target, 1)

    assert second.rows_inserted == 500
    assert len(target_rows(target)) == 1500


def test_settle_lag_holds_rows_newer_than_clock_minus_lag(spark, tmp_path):
    now = datetime.now(tz=at(1).tzinfo).replace(microsecond=0)
    folder = ParquetFolder(tmp_path / "orders")
    folder.drop(
        order_rows(
            [
                (1, "placed", 1.0, now - timedelta(hours=2)),
                (2, "placed", 1.0, now - timedelta(minutes=5)),
            ]
        )
    )
    spec = make_spec(
        str(folder.path),
        source={"format": "parquet"},
        watermark={"settle_lag": "30m"},
        partitioning={"start": (now - timedelta(days=2)).date().isoformat()},
    )
    target = DeltaTarget("orders", str(tmp_path / "target"))
    today = now.replace(hour=0, minute=0, second=0)
    request = LoadRequest(today - timedelta(days=1), today + timedelta(days=2))

    result = run_load(spark, spec, target, request)

    assert [r[0] for r in target_rows(target)] == [1]
    assert result.cursor_after == now - timedelta(hours=2)


def test_naive_source_timestamps_are_read_in_the_source_zone(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "events")
    naive = pa.schema([("order_id", pa.int64()), ("updated_at", pa.timestamp("us"))])
    # 00:30 in Berlin on Jan 2 is 23:30 UTC on Jan 1: it belongs to partition Jan 1.
    folder.drop(
        pa.Table.from_pylist(
            [
                {"order_id": 1, "updated_at": datetime(2026, 1, 2, 0, 30)},
                {"order_id": 2, "updated_at": datetime(2026, 1, 2, 1, 30)},
            ],
            schema=naive,
        )
    )
    spec = make_spec(str(folder.path), source={"format": "parquet", "timezone": "Europe/Berlin"})
    target = DeltaTarget("orders", str(tmp_path / "target"))

    day1 = load(spark, spec, target, 1)

    assert day1.rows_inserted == 1
    assert day1.cursor_after == at(1, 23, 30)
    rows = target_rows(target, columns=("order_id", "updated_at"))
    assert rows == [(1, at(1, 23, 30))]


def test_append_strategy_inserts_new_keys_and_ignores_existing_ones(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "events")
    spec = make_spec(str(folder.path), source={"format": "parquet"}, strategy="append")
    target = DeltaTarget("orders", str(tmp_path / "target"))
    folder.drop(order_rows([(1, "first", 1.0, at(1, 1)), (2, "first", 1.0, at(1, 2))]))
    load(spark, spec, target, 1)
    folder.drop(order_rows([(2, "second", 1.0, at(1, 3)), (3, "first", 1.0, at(1, 4))]))

    result = load(spark, spec, target, 1)

    assert (result.rows_inserted, result.rows_updated) == (1, 0)
    assert [r[:2] for r in target_rows(target)] == [(1, "first"), (2, "first"), (3, "first")]


@pytest.mark.parametrize("strategy", ["append", "upsert"])
def test_only_a_merge_that_updates_stages_its_acting_rows_first(spark, tmp_path, strategy):
    # An insert-only MERGE (append) appends new files and rewrites none, so it reads the
    # staged rows in one pass; an upsert into a table without deletion vectors first
    # stages the rows that act beside the increment (Delta would rewrite every file a
    # re-read, unchanged row falls in). Both leave the same table and counts.
    # (A table this small would take one pass whatever it merges, target.one_pass_below:
    # off here, as on a table above that size.)
    folder = ParquetFolder(tmp_path / "events")
    spec = make_spec(
        str(folder.path),
        source={"format": "parquet"},
        strategy=strategy,
        target={"one_pass_below": 0},
    )
    target = DeltaTarget("orders", str(tmp_path / "target"))
    folder.drop(order_rows([(1, "first", 1.0, at(1, 1)), (2, "first", 1.0, at(1, 2))]))
    load(spark, spec, target, 1)
    folder.drop(order_rows([(2, "first", 1.0, at(1, 2)), (3, "first", 1.0, at(1, 4))]))
    look, staged_apart = staging_seen(target, "committed", "**/*_acting")

    result = load(spark, spec, target, 1, hook=look)

    assert staged_apart == ([["increment_acting"]] if strategy == "upsert" else [[]])
    assert (result.rows_inserted, result.rows_updated, result.rows_unchanged) == (1, 0, 1)
    assert result.rows_by_partition == {"2026-01-01": 1}
    assert [r[:2] for r in target_rows(target)] == [(1, "first"), (2, "first"), (3, "first")]


@pytest.mark.parametrize("case", ["no lookback", "lookback", "rewound"])
def test_a_run_above_the_cursor_merges_in_one_pass_and_one_that_rereads_in_two(
    spark, orders_source, tmp_path, case
):
    # Without a lookback every row a plain run reads is above the cursor, and so newer than
    # every row of the table: each acts wherever it matches, and the MERGE reads the
    # staged rows in one pass. A run that re-reads rows it loaded before (unchanged: they
    # must not make Delta rewrite their files) stages the acting rows apart and merges
    # those: with a lookback, or after a rewind, which leaves rows above the cursor for
    # more than the next run (here the second run after it). (target.one_pass_below off:
    # a table this small would take one pass whatever it merges.)
    lookback = "2h" if case == "lookback" else "0s"
    spec = make_spec(
        orders_source.path, watermark={"lookback": lookback}, target={"one_pass_below": 0}
    )
    target = DeltaTarget("orders", str(tmp_path / "target"))
    orders_source.upsert([(1, "placed", 1.0, at(1, 1)), (2, "placed", 1.0, at(1, 2))])
    load(spark, spec, target, 1)
    if case == "rewound":
        orders_source.upsert([(4, "placed", 1.0, at(2, 1))])
        load(spark, spec, target, 2)
        rewind(spec, target, "2026-01-01T00:30:00Z", spark=spark, by="test", reason="test")
        load(spark, spec, target, 1)  # re-reads rows 1 and 2: two passes, nothing written
    orders_source.upsert([(2, "paid", 1.0, at(1, 3)), (3, "placed", 1.0, at(1, 4))])
    look, staged_apart = staging_seen(target, "committed", "**/*_acting")

    result = load(spark, spec, target, 2 if case == "rewound" else 1, hook=look)

    rereads = {"no lookback": 0, "lookback": 1, "rewound": 1}[case]
    assert staged_apart == ([["increment_acting"]] if rereads else [[]])
    assert (result.rows_inserted, result.rows_updated, result.rows_unchanged) == (1, 1, rereads)
    assert result.rows_by_partition == {"2026-01-01": 2}
    expected = [(1, "placed"), (2, "paid"), (3, "placed")]
    expected += [(4, "placed")] if case == "rewound" else []
    assert [r[:2] for r in target_rows(target)] == expected
    assert differences(spark, spec, target) == (0, 0)


@pytest.mark.parametrize("case", ["one day", "two days", "two days, a late row"])
def test_a_small_table_rereading_rows_merges_in_one_pass_and_counts_by_partition(
    spark, orders_source, tmp_path, case
):
    # On a table whose files the increment's keys fall in total at most
    # target.one_pass_below (16 MiB by default), a run that re-reads unchanged rows (a
    # lookback) merges the staged rows in one pass: Delta rewrites those small files whole
    # instead of a pass finding the rows that act. Its rows by partition come from the
    # merge's own counts: the staged rows share one day, or the rows above the cursor do
    # and only they acted (the lookback reached into yesterday and changed nothing there);
    # a late row inside the lookback acted too: its rows are found again and counted.
    spec = make_spec(orders_source.path, watermark={"lookback": "2h"})
    target = DeltaTarget("orders", str(tmp_path / "target"))
    orders_source.upsert([(1, "placed", 1.0, at(1, 1)), (2, "placed", 1.0, at(1, 23))])
    load(spark, spec, target, 1)
    if case == "one day":
        # Day 1 again: re-reads row 2 (23:00, inside the lookback) unchanged; row 4 comes
        # in late inside the lookback, row 3 after the cursor.
        orders_source.upsert([(3, "placed", 1.0, at(1, 23, 30)), (4, "placed", 1.0, at(1, 22))])
        day, written = 1, {"2026-01-01": 2}
    elif case == "two days":
        # Day 2's run re-reads row 2 (day 1, 23:00, inside the lookback) unchanged.
        orders_source.upsert([(3, "placed", 1.0, at(2, 1))])
        day, written = 2, {"2026-01-02": 1}
    else:
        # ... and row 4 of day 1 comes in late, inside the lookback.
        orders_source.upsert([(3, "placed", 1.0, at(2, 1)), (4, "placed", 1.0, at(1, 22))])
        day, written = 2, {"2026-01-01": 1, "2026-01-02": 1}
    look, staged_apart = staging_seen(target, "committed", "**/*_acting")

    result = load(spark, spec, target, day, hook=look)

    assert staged_apart == [[]]
    inserted = sum(written.values())
    assert (result.rows_inserted, result.rows_updated, result.rows_unchanged) == (inserted, 0, 1)
    assert result.rows_by_partition == written
    expected = [(n, "placed") for n in range(1, 3 + inserted)]
    assert [r[:2] for r in target_rows(target)] == expected
    assert differences(spark, spec, target) == (0, 0)


@pytest.mark.parametrize("partition_by", [[], ["status"]])
def test_target_readable_by_spark_with_and_without_delta_partitions(
    spark, orders_source, tmp_path, partition_by
):
    spec = make_spec(orders_source.path, target={"partition_by": partition_by})
    orders_source.upsert([(1, "a/b c", 1.0, at(1, 1)), (2, "x", 2.0, at(1, 2))])
    target = DeltaTarget("orders", str(tmp_path / "target"))
    load(spark, spec, target, 1)
    orders_source.upsert([(1, "x", 3.0, at(1, 3))])
    load(spark, spec, target, 1)

    rows = sorted(tuple(r) for r in target.to_spark(spark).select("order_id", "status").collect())
    assert rows == [(1, "x"), (2, "x")]
    assert differences(spark, spec, target) == (0, 0)


def test_timestamp_watermark_without_a_lookback_setting_runs_twice(spark, orders_source, target):
    from incremental_assets.specs import TableSpec

    spec = TableSpec.model_validate(
        {
            "name": "orders",
            "source": {"format": "delta", "path": orders_source.path},
            "keys": ["order_id"],
            "watermark": {"column": "updated_at", "kind": "timestamp"},
            "strategy": "upsert",
            "partitioning": {"granularity": "daily", "start": "2026-01-01"},
        }
    )
    orders_source.upsert([(1, "placed", 1.0, at(1, 1))])
    load(spark, spec, target, 1)
    orders_source.upsert([(2, "placed", 1.0, at(1, 2))])

    second = load(spark, spec, target, 1)

    assert spec.watermark.lookback == timedelta(0)
    assert second.rows_inserted == 1


@pytest.mark.classic_only("Spark's code generation metrics are read from the driver's JVM")
def test_a_repeated_small_run_reuses_the_classes_spark_generated_for_the_last_one(
    spark, orders_source, target, monkeypatch
):
    # Spark compiles a class for each operator and expression it runs and keeps them in
    # a cache (spark.sql.codegen.cache.maxEntries, engine/spark_session.py). At Spark's
    # default of 100 classes, a run evicted what the next one would reuse: every small run
    # compiled about 70 classes again, a second of a warm run's few. A run like the last
    # one (the window's bounds aside, which Spark writes into the code) now finds most of
    # them.
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics
    spec = make_spec(orders_source.path, watermark={"lookback": "1h"})
    compiled = []
    # The suite's session runs interpreted (servers.INTERPRETED): code generation is on
    # here, as in production for a run over more than interpreted.BELOW bytes of files.
    monkeypatch.setattr(interpreted, "BELOW", 0)
    settings = runtime_conf.get_many(spark, INTERPRETED)
    runtime_conf.unset_many(spark, INTERPRETED)
    try:
        for day in range(1, 5):
            orders_source.upsert([(day * 10 + i, "placed", 1.0, at(day, 12)) for i in range(5)])
            orders_source.upsert([(day * 10 - 10, "paid", 2.0, at(day, 13))])
            before = metrics.METRIC_COMPILATION_TIME().getCount()
            result = load(spark, spec, target, day)
            compiled.append(metrics.METRIC_COMPILATION_TIME().getCount() - before)
            assert result.committed
    finally:
        runtime_conf.restore(spark, settings)

    # The first run creates the table, the second is the first merge: they compile their
    # plans (about 60 and 70 classes here). The later merges compile only what changed
    # between runs (20 each here; 49 to 63 with Spark's default cache).
    assert spark.conf.get("spark.sql.codegen.cache.maxEntries") == "2000"
    assert max(compiled[2:]) <= 30, compiled


def _jobs_described(spark, first: int) -> list[tuple[int, str]]:
    """The Spark jobs from id ``first`` on, with their descriptions, from the driver's
    status store (the suite's session has no UI to ask), once the listener bus has
    delivered every event so far (the store is filled from it)."""
    context = spark.sparkContext._jsc.sc()
    context.listenerBus().waitUntilEmpty()
    found = context.statusStore().jobsList(None)
    jobs = [found.apply(i) for i in range(found.size())]
    described = [(j.jobId(), _text(j.description())) for j in jobs]
    return sorted((i, d) for i, d in described if i >= first)


def _text(option) -> str:
    return option.get() if option.isDefined() else ""


@pytest.mark.classic_only("Spark's job list is read from the driver's JVM")
def test_a_merge_finds_the_target_snapshot_loaded_while_the_run_extracted(
    spark, orders_source, target
):
    # The MERGE's first step is loading the target's snapshot (Delta's "Compute snapshot
    # for version" jobs). A run into an existing table loads it in a thread while it
    # extracts (engine/delta_lake/preload.py), so its commit computes none. (The
    # extract computes the source's snapshot too: the jobs name a version, not a table.)
    spec = make_spec(orders_source.path)
    orders_source.upsert([(n, "placed", 1.0, at(1, n)) for n in range(1, 6)])
    load(spark, spec, target, 1)
    orders_source.upsert([(1, "paid", 2.0, at(2, 1)), (9, "placed", 1.0, at(2, 2))])
    # As in a new process: no snapshot of the table in Delta's cache.
    spark.sparkContext._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    first = max([i for i, _ in _jobs_described(spark, 0)], default=-1) + 1
    at_phase: dict[str, int] = {}

    def mark(phase: str) -> None:
        at_phase[phase] = max(i for i, _ in _jobs_described(spark, 0))

    second = load(spark, spec, target, 2, hook=mark)

    assert (second.rows_inserted, second.rows_updated) == (1, 1)
    assert sorted(target_rows(target))[0][:2] == (1, "paid")
    jobs = _jobs_described(spark, first)
    loading = [i for i, d in jobs if "Compute snapshot" in d]
    in_commit = [i for i in loading if at_phase["staged"] < i <= at_phase["committed"]]
    assert loading and loading[-1] <= at_phase["staged"], jobs
    assert in_commit == [], jobs
    assert not [t for t in threading.enumerate() if t.name == "ia-snapshot-preload"]


@pytest.mark.parametrize("spanned_below", [store.SPANNED_BELOW, 0])
def test_a_small_table_merges_by_the_key_range_its_increment_counted(
    spark, orders_source, tmp_path, monkeypatch, spanned_below
):
    # The files the increment's key range spans total a few kilobytes (at most
    # store.SPANNED_BELOW): the merge prunes them by that range, as the increment's write
    # counted it, with no Spark job to list the keys first. Above it (the bound at 0 here)
    # the keys are listed (delta_io.touched_keys) and the merge prunes by them. The table
    # and the counts are the same either way.
    monkeypatch.setattr(store, "SPANNED_BELOW", spanned_below)
    listed, pruned_by = [], []
    touched_keys, may_hold_sql = delta_io.touched_keys, merge_plan.may_hold_sql

    def listing(*args, **kwargs):
        listed.append(list(args[1]))
        return touched_keys(*args, **kwargs)

    def pruning(keys, *args, **kwargs):
        pruned_by.append((list(keys.values), keys.spans))
        return may_hold_sql(keys, *args, **kwargs)

    monkeypatch.setattr(delta_io, "touched_keys", listing)
    monkeypatch.setattr(merge_plan, "may_hold_sql", pruning)
    spec = make_spec(orders_source.path)
    target = DeltaTarget("orders", str(tmp_path / "target"))
    orders_source.upsert([(n, "placed", 1.0, at(1, n)) for n in range(1, 9)])
    load(spark, spec, target, 1)
    orders_source.upsert([(2, "paid", 1.0, at(2, 1)), (5, "paid", 1.0, at(2, 2))])
    orders_source.upsert([(9, "placed", 1.0, at(2, 3))])

    result = load(spark, spec, target, 2)

    if spanned_below:
        assert (listed, pruned_by) == ([], [([2, 9], True)])
    else:
        assert (listed, pruned_by) == ([["order_id"]], [([2, 5, 9], False)])
    assert (result.rows_inserted, result.rows_updated) == (1, 2)
    expected = [(n, "paid" if n in (2, 5) else "placed") for n in range(1, 10)]
    assert [r[:2] for r in target_rows(target)] == expected
    assert differences(spark, spec, target) == (0, 0)


def test_a_merge_rewrites_its_few_rows_in_key_order_into_files_of_bounded_size(
    spark, tmp_path, monkeypatch
):
    # Files of at most 400 rows: the first load writes 1-400, 401-800 and 801-1000. Delta
    # writes a merge's rewrite in hash order over its tasks (adaptive execution's
    # coalescing is turned off here, as a cluster's many cores would spread a rewrite of
    # this size): two files, each spanning every key of the file they replace, which every
    # later increment into that range would rewrite again. A rewrite of more than a file's
    # rows (and at most two files' worth) is written by one task in key order instead
    # (key_order), a new file every 400 rows: the next increment rewrites only the file
    # its keys fall in.
    folder, spec, target = _loaded_in_files(spark, tmp_path, monkeypatch, 400, 1000)
    assert _key_ranges(target) == [(1, 400, 400), (401, 800, 400), (801, 1000, 200)]
    written_by = ["spark.sql.shuffle.partitions", "spark.sql.files.maxRecordsPerFile"]
    settings = runtime_conf.get_many(spark, written_by)

    # 51 updates and 300 new keys: the file 801-1000 and the new rows, 500 in all.
    folder.drop(order_rows([(n, "paid", 1.0, at(2, 1)) for n in range(900, 951)]))
    folder.drop(order_rows([(n, "placed", 1.0, at(2, 2)) for n in range(1001, 1301)]))
    with delta_commits.session_settings(spark, HASH_ORDERED):
        second = load(spark, spec, target, 2)
    assert (second.rows_updated, second.rows_inserted) == (51, 300)
    assert _key_ranges(target) == [
        (1, 400, 400),
        (401, 800, 400),
        (801, 1200, 400),
        (1201, 1300, 100),
    ]

    # Updates to 1250-1260 rewrite the 100 rows of the one file holding them (as Delta
    # writes them: they fit in a file).
    folder.drop(order_rows([(n, "paid", 1.0, at(3, 1)) for n in range(1250, 1261)]))
    with delta_commits.session_settings(spark, HASH_ORDERED):
        third = load(spark, spec, target, 3)
    metrics = DeltaTable(target.path).history(1)[0]["operationMetrics"]
    assert (third.rows_updated, int(metrics["numTargetFilesRemoved"])) == (11, 1)
    assert int(metrics["numTargetRowsCopied"]) == 100 - 11
    assert differences(spark, spec, target) == (0, 0)
    assert runtime_conf.get_many(spark, written_by) == settings  # as they were


def test_a_rewrite_is_counted_by_the_files_its_keys_fall_in_not_every_file_their_range_covers(
    spark, tmp_path, monkeypatch
):
    # Files 1-1500, 1501-3000 and 3001-4500; an increment of 100 updates to 500-599 and
    # 1,400 new keys above 4500: too many keys to list, so the merge is pruned by their
    # range, 500-5900, whose three files and staged rows hold 6,000 rows, too many for one
    # task. The merge rewrites only the file holding the updates, though: counted by the
    # files that hold one of the keys (delta_io.within_files), 1,500 rows and the 1,500
    # staged, it is written in key order (coalescing is off, as in the test above).
    folder, spec, target = _loaded_in_files(spark, tmp_path, monkeypatch, 1500, 4500)
    assert _key_ranges(target) == [(1, 1500, 1500), (1501, 3000, 1500), (3001, 4500, 1500)]
    folder.drop(order_rows([(n, "paid", 1.0, at(2, 1)) for n in range(500, 600)]))
    folder.drop(order_rows([(n, "placed", 1.0, at(2, 2)) for n in range(4501, 5901)]))

    with delta_commits.session_settings(spark, HASH_ORDERED):
        second = load(spark, spec, target, 2)

    assert (second.rows_updated, second.rows_inserted) == (100, 1400)
    assert _key_ranges(target) == [
        (1, 1500, 1500),
        (1501, 3000, 1500),
        (3001, 4500, 1500),
        (4501, 5900, 1400),
    ]
    assert differences(spark, spec, target) == (0, 0)


def test_a_table_of_wide_rows_is_written_in_files_of_a_files_bytes_not_a_million_rows(
    spark, tmp_path, monkeypatch
):
    # A file holds at most ROWS_PER_FILE rows and about BYTES_PER_FILE bytes: 20 KiB here,
    # for rows of about 1 KB (a text column of random hex), so about 20 rows a file. The
    # first load reads the rows' size from its Delta source's log and writes files of at
    # most that many rows, each a narrow range of keys, where it wrote one file of every
    # row before. A later merge's rewrite of more than a file's rows is written in key
    # order in files of as many rows (at the target's own bytes per row), and compaction
    # aims for files of at most BYTES_PER_FILE.
    monkeypatch.setattr(store, "BYTES_PER_FILE", 20 * 1024)
    rows = _wide_orders()
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    source.append(rows(range(1, 201), 1, 1))
    spec = make_spec(source.path)
    target = DeltaTarget("orders", str(tmp_path / "target"))
    per_row = delta_io.bytes_per_row(delta_io.live_files(DeltaTable(source.path)))
    assert per_row is not None and per_row > 900
    per_file = store.rows_per_file(per_row)
    assert per_file < 30

    load(spark, spec, target, 1)
    first = _key_ranges(target)
    assert sum(n for _, _, n in first) == 200
    assert max(n for _, _, n in first) <= per_file
    assert len(first) >= 200 // per_file
    assert all(a[1] < b[0] for a, b in itertools.pairwise(first))

    # Updates to the newest file's keys and new keys above them, more than a file's rows
    # and at most two files' worth (adaptive coalescing off, as in the tests above).
    in_target = store.rows_per_file(delta_io.bytes_per_row(delta_io.live_files(target.open())))
    held = first[-1][2]
    new = max(1, in_target - held + 1)  # the range then holds a file's rows and more
    after, rewritten = _updated_and_grown(spark, source, spec, target, rows, first, new, 201)
    assert len(rewritten) == 2
    assert max(n for _, _, n in rewritten) <= in_target
    assert all(a[1] < b[0] for a, b in itertools.pairwise(after))
    assert differences(spark, spec, target) == (0, 0)

    size = target_file_bytes(target.open())
    assert size is not None and store.BYTES_PER_FILE - 2 * per_row < size <= store.BYTES_PER_FILE


def test_a_file_of_wide_rows_written_before_the_bound_on_bytes_is_rewritten_in_smaller_files(
    spark, tmp_path, monkeypatch
):
    # A table first written with files bounded by rows alone (by an earlier release, or
    # from a source whose rows' size its first load did not know): its newest file holds
    # more than two files' worth at the bound on bytes. An increment into it is rewritten
    # in key order all the same, cut at that bound (one task writes at most two files of
    # ROWS_PER_FILE rows), not spread by Delta over files each spanning the whole range.
    monkeypatch.setattr(store, "BYTES_PER_FILE", 2**62)
    rows = _wide_orders()
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    source.append(rows(range(1, 201), 1, 1))
    spec = make_spec(source.path)
    target = DeltaTarget("orders", str(tmp_path / "target"))
    load(spark, spec, target, 1)
    first = _key_ranges(target)
    monkeypatch.setattr(store, "BYTES_PER_FILE", 20 * 1024)
    per_file = store.rows_per_file(delta_io.bytes_per_row(delta_io.live_files(target.open())))
    held = first[-1][2]
    assert held > 2 * per_file

    after, rewritten = _updated_and_grown(spark, source, spec, target, rows, first, 3, 201)
    assert [n for _, _, n in rewritten] == [per_file] * ((held + 3) // per_file) + (
        [(held + 3) % per_file] if (held + 3) % per_file else []
    )
    assert all(a[1] < b[0] for a, b in itertools.pairwise(after))
    assert differences(spark, spec, target) == (0, 0)


def test_a_tables_file_size_bounds_its_first_write_its_rewrite_and_its_compaction(spark, tmp_path):
    # target.file_size: 1MiB (the least it takes) for rows of about 1 KB: about a thousand
    # rows a file, where the default (128 MiB) puts all 3,000 in the session's two key
    # ranges' files. The first write, a merge's rewrite in key order of more than a file's
    # rows, and compaction's aim all follow it.
    rows = _wide_orders()
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    source.append(rows(range(1, 3001), 1, 1))
    spec = make_spec(source.path, target={"file_size": "1MiB"})
    assert spec.target.file_size == 2**20
    target = DeltaTarget("orders", str(tmp_path / "target"))

    load(spark, spec, target, 1)
    first = _key_ranges(target)
    per_row = delta_io.bytes_per_row(delta_io.live_files(target.open()))
    per_file = store.rows_per_file(per_row, 2**20)
    assert 500 < per_file < 1100
    assert sum(n for _, _, n in first) == 3000
    assert len(first) >= -(-3000 // per_file)  # 3: the default writes 2, a key range each
    assert max(n for _, _, n in first) <= store.rows_per_file(per_row * 0.99, 2**20)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(first))
    sizes = pa.table(target.open().get_add_actions(flatten=True))["size_bytes"].to_pylist()
    assert max(sizes) <= 1.05 * 2**20

    # Two updates in the newest file and enough new keys above it that its range holds
    # more than a file's rows: rewritten in key order, in files of at most a file's rows.
    held = first[-1][2]
    new = per_file - held + 10
    after, rewritten = _updated_and_grown(spark, source, spec, target, rows, first, new, 3001)
    assert [n for _, _, n in rewritten] == [per_file, held + new - per_file]
    assert all(a[1] < b[0] for a, b in itertools.pairwise(after))
    assert differences(spark, spec, target) == (0, 0)

    size = target_file_bytes(target.open(), spec.target.file_size)
    assert size is not None and 2**20 - 2 * per_row < size <= 2**20


@pytest.mark.parametrize("fmt", ["parquet", "json", "json-once", "csv-once"])
def test_a_folder_of_wide_rows_is_first_written_in_files_of_a_files_bytes(
    spark, tmp_path, monkeypatch, fmt
):
    # A folder source's first load bounds its files by bytes too, as a Delta source's does
    # (20 KiB here, for rows of about 1 KB: about 20 rows a file). A Parquet folder's rows'
    # size comes from its largest files' footers, and its increment is written once; a JSON
    # or CSV folder's text says little of its rows' size in Parquet, so it comes from the
    # increment's staged files where its first load stages it (json: it has a quality
    # rule), else from a sample of its rows written as Parquet (json-once, csv-once: the
    # increment is written once). Bounded by rows alone, the 200 rows were one file a key
    # range.
    monkeypatch.setattr(store, "BYTES_PER_FILE", 20 * 1024)
    folder = tmp_path / "orders"
    folder.mkdir()
    spec = _wide_folder(folder, fmt, _wide_orders()(range(1, 201), 1, 1))
    target = DeltaTarget("orders", str(tmp_path / "target"))

    first = load(spark, spec, target, 1)

    assert first.rows_inserted == 200
    files = _key_ranges(target)
    per_file = store.rows_per_file(900)  # a row's 1,000 hex digits do not compress
    assert per_file == 22
    assert sum(n for _, _, n in files) == 200
    assert max(n for _, _, n in files) <= per_file
    assert len(files) >= 200 // per_file
    # Not far fewer rows either (rows of at most 1,400 bytes: 14 a file, in each of the
    # session's two key ranges): the estimate is the rows' size, not a multiple of it.
    assert len(files) <= 2 * -(-100 // store.rows_per_file(1400))
    assert all(a[1] < b[0] for a, b in itertools.pairwise(files))
    assert differences(spark, spec, target) == (0, 0)


@pytest.mark.parametrize("fmt", ["parquet", "json", "json-once", "csv-once"])
def test_a_first_load_of_a_folder_smaller_than_a_file_asks_no_job_for_its_rows_size(
    spark, tmp_path, monkeypatch, fmt
):
    # A folder whose files hold at most a file's bytes in all cannot fill a file: its first
    # load neither counts a Parquet folder's rows from their footers nor lists its staged
    # increment's files (a Spark job each, 0.2-0.7 s), and writes its rows in one file.
    folder = tmp_path / "orders"
    folder.mkdir()
    rows = _wide_orders()(range(1, 201), 1, 1)
    spec = _wide_folder(folder, fmt, rows)

    def asked(*args, **kwargs):
        raise AssertionError("a folder smaller than a file was asked its rows' size")

    monkeypatch.setattr(FileSource, "bytes_per_row", asked)
    monkeypatch.setattr(FileSource, "sample", asked)
    monkeypatch.setattr(staging, "bytes_per_row", asked)
    target = DeltaTarget("orders", str(tmp_path / "target"))

    assert load(spark, spec, target, 1).rows_inserted == 200
    assert [n for _, _, n in _key_ranges(target)] == [200]


def test_a_compressed_text_folder_is_sized_by_its_rows_not_its_listed_bytes(
    spark, tmp_path, monkeypatch
):
    # Gzipped JSON lines whose 200 rows take about 1,300 bytes each in Parquet but about
    # 470 each as listed (a status of 3,000 random 'a's and 'b's, which gzip packs better
    # than Parquet's Snappy): 93 KB listed, under the 96 KiB bound, yet about 260 KB of
    # rows. Taken at its listed bytes, the folder would be asked nothing and written one
    # file a key range (100 rows or more in one); sampled, at most about 75 rows a file.
    bound = 96 * 1024
    monkeypatch.setattr(store, "BYTES_PER_FILE", bound)
    folder = tmp_path / "orders"
    folder.mkdir()
    pick = random.Random(11)
    lines = [
        json.dumps(
            {
                "order_id": n,
                "status": "".join(pick.choice("ab") for _ in range(3000)),
                "amount": 1.0,
                "updated_at": at(1, 1).isoformat(),
            }
        )
        for n in range(1, 201)
    ]
    with gzip.open(folder / "part-00001.json.gz", "wt") as packed:
        packed.write("\n".join(lines) + "\n")
    assert (folder / "part-00001.json.gz").stat().st_size < bound
    schema = "order_id BIGINT, status STRING, amount DOUBLE, updated_at TIMESTAMP"
    spec = make_spec(str(folder), source={"format": "json", "schema": schema})
    target = DeltaTarget("orders", str(tmp_path / "target"))

    assert load(spark, spec, target, 1).rows_inserted == 200

    files = _key_ranges(target)
    assert sum(n for _, _, n in files) == 200
    assert max(n for _, _, n in files) <= 80
    sizes = pa.table(target.open().get_add_actions(flatten=True))["size_bytes"].to_pylist()
    assert max(sizes) <= 1.1 * bound


def test_a_text_folders_sample_is_the_first_rows_of_its_largest_file(spark, tmp_path):
    # A few narrow rows in one file, 2,500 wide ones in another: the sample is 2,000 of the
    # wide ones. A Parquet folder is not sampled (its footers give its rows' size).
    folder = tmp_path / "orders"
    folder.mkdir()
    schema = "order_id BIGINT, status STRING, amount DOUBLE, updated_at TIMESTAMP"

    def write(name: str, keys, status: str) -> None:
        rows = [
            {"order_id": n, "status": status, "amount": 1.0, "updated_at": at(1, 1).isoformat()}
            for n in keys
        ]
        (folder / name).write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    write("part-00001.json", range(1, 6), "s")
    write("part-00002.json", range(10, 2510), "w" * 300)
    spec = make_spec(str(folder), source={"format": "json", "schema": schema})
    source = FileSource(spark, "orders", spec.source)

    sample = source.sample(2000)
    assert sample is not None
    statuses = [r.status for r in sample.collect()]
    assert len(statuses) == 2000 and set(statuses) == {"w" * 300}
    assert not source.compressed_text()

    (tmp_path / "parquet").mkdir()
    pq.write_table(order_rows([(1, "placed", 1.0, at(1, 1))]), tmp_path / "parquet" / "a.parquet")
    parquet = make_spec(str(tmp_path / "parquet"), source={"format": "parquet"})
    assert FileSource(spark, "orders", parquet.source).sample(2000) is None


def _wide_folder(folder: Path, fmt: str, rows: pa.Table):
    """The spec of a folder source of ``rows`` in one Parquet, JSON-lines or CSV file
    (``json``: with a quality rule, so its first load stages its increment; ``json-once``
    and ``csv-once``: without one, so it is written once, as the table)."""
    if fmt == "parquet":
        pq.write_table(rows, folder / "part-00001.parquet")
        return make_spec(str(folder), source={"format": "parquet"})
    schema = "order_id BIGINT, status STRING, amount DOUBLE, updated_at TIMESTAMP"
    records = [{**r, "updated_at": r["updated_at"].isoformat()} for r in rows.to_pylist()]
    if fmt == "csv-once":
        lines = [",".join(records[0])] + [",".join(str(v) for v in r.values()) for r in records]
        (folder / "part-00001.csv").write_text("\n".join(lines) + "\n")
        return make_spec(str(folder), source={"format": "csv", "schema": schema})
    lines = [json.dumps(r) for r in records]
    (folder / "part-00001.json").write_text("\n".join(lines) + "\n")
    rules = [{"name": "amount_known", "check": "amount IS NOT NULL"}] if fmt == "json" else []
    return make_spec(
        str(folder), source={"format": "json", "schema": schema}, quality={"rules": rules}
    )


def _updated_and_grown(spark, source, spec, target, rows, first, new: int, above: int):
    """Day 2 of a wide-rows test: updates to the two lowest keys of the newest file of
    ``first`` (the target's key ranges) and ``new`` keys from ``above``, loaded with Delta's
    write spread over the tasks (``HASH_ORDERED``); the files after it, and those at or
    above the newest file's lowest key (the files before it are left as they were)."""
    low = first[-1][0]
    source.append(rows(range(low, low + 2), 2, 1))
    source.append(rows(range(above, above + new), 2, 2))
    with delta_commits.session_settings(spark, HASH_ORDERED):
        second = load(spark, spec, target, 2)
    assert (second.rows_updated, second.rows_inserted) == (2, new)
    after = _key_ranges(target)
    assert [r for r in after if r[1] < low] == first[:-1]
    return after, [r for r in after if r[1] >= low]


def _wide_orders():
    """A maker of order rows of about 1 KB each (a status of 500 random bytes in hex, which
    does not compress), the same rows in every run of a test."""
    wide = random.Random(7)

    def rows(keys, day: int, hour: int):
        return order_rows([(n, wide.randbytes(500).hex(), 1.0, at(day, hour)) for n in keys])

    return rows


# Delta's write of a merge's rewrite spread over the tasks, as a cluster's many cores
# would spread a rewrite of a test's size (adaptive execution's coalescing off).
HASH_ORDERED = {"spark.sql.adaptive.coalescePartitions.enabled": "false"}


def _loaded_in_files(spark, tmp_path, monkeypatch, rows_per_file: int, rows: int):
    """A Parquet source of orders 1..``rows`` and its target, loaded in files of at most
    ``rows_per_file`` rows: the folder, the spec and the target."""
    monkeypatch.setattr(store, "ROWS_PER_FILE", rows_per_file)
    folder = ParquetFolder(tmp_path / "orders")
    spec = make_spec(str(folder.path), source={"format": "parquet"})
    target = DeltaTarget("orders", str(tmp_path / "target"))
    folder.drop(order_rows([(n, "placed", 1.0, at(1, 1)) for n in range(1, rows + 1)]))
    load(spark, spec, target, 1)
    return folder, spec, target


def _key_ranges(target: DeltaTarget) -> list[tuple[int, int, int]]:
    """Each live file's lowest and highest key and its rows, in key order."""
    files = pa.table(DeltaTable(target.path).get_add_actions(flatten=True)).to_pylist()
    return sorted((f["min.order_id"], f["max.order_id"], f["num_records"]) for f in files)


@pytest.mark.parametrize("strategy", ["upsert", "append"])
def test_a_run_that_creates_the_table_writes_its_rows_once_as_the_table(
    spark, tmp_path, strategy, monkeypatch
):
    # A first load (or a reload of all history) of an upsert or append table is not
    # staged then rewritten by the commit: its rows are counted and checked first, in the
    # pass that finds the key ranges, then written once, as the table, with the cursor.
    # Later runs stage their increment as before.
    folder = ParquetFolder(tmp_path / "events")
    spec = make_spec(str(folder.path), source={"format": "parquet"}, strategy=strategy)
    target = DeltaTarget("orders", str(tmp_path / "target"))
    look, staged = staging_seen(target, "staged", "**/increment")

    # Two days of rows, with a null key among them: refused before anything is written.
    folder.drop(order_rows([(1, "placed", 1.0, at(1, 1)), (None, "placed", 1.0, at(2, 2))]))
    with pytest.raises(NullValuesError) as refused:
        load(spark, spec, target, 1, 2, hook=look)
    assert refused.value.counts == {"order_id": 1}
    assert not DeltaTable.is_deltatable(target.path) and not Path(target.path).exists()

    # The source is fixed: the rows are written once, as the table, in one commit.
    for file in folder.path.glob("*.parquet"):
        file.unlink()
    rows = [
        (1, "placed", 1.0, at(1, 1)),
        (1, "paid", 1.0, at(1, 3)),
        (2, "placed", 5.0, at(2, 2)),
        (3, "placed", 2.0, at(2, 4)),
    ]
    folder.drop(order_rows(rows))
    tables_read = counting_reads_by_key(monkeypatch)
    first = load(spark, spec, target, 1, 2, hook=look)

    assert staged == [[]]  # nothing staged
    assert (first.rows_extracted, first.rows_staged, first.rows_inserted) == (4, 3, 3)
    assert first.duplicates_in_batch == 1
    # Its rows by partition as its write counted them: the new table is not read again.
    assert first.rows_by_partition == {"2026-01-01": 1, "2026-01-02": 2}
    assert tables_read == []
    # Within one batch both keep the newest row of a key.
    assert [r[:2] for r in target_rows(target)] == [(1, "paid"), (2, "placed"), (3, "placed")]
    table = DeltaTable(target.path)
    assert table.version() == 0 == first.delta_version
    record = delta_commits.parse(table.history(1)[0])
    assert record["cursor_after"] == "2026-01-02T04:00:00Z" and record["rows_extracted"] == 4
    assert target.state("timestamp").cursor == at(2, 4)
    assert differences(spark, spec, target) == (0, 0)

    # The next run stages its increment, and counts one day from its write.
    folder.drop(order_rows([(4, "placed", 1.0, at(3, 1))]))
    second = load(spark, spec, target, 3, hook=look)
    assert len(staged[-1]) == 1
    assert second.rows_inserted == 1 and second.rows_by_partition == {"2026-01-03": 1}


def counting_reads_by_key(monkeypatch) -> list[int]:
    """Each time a run counts rows by partition key with a Spark job of its own (reading
    the new table or the staged rows), the number of keys it found."""
    reads: list[int] = []
    counted = stage_module._counted_by_key

    def counting(spec, rows):
        found = counted(spec, rows)
        reads.append(len(found))
        return found

    monkeypatch.setattr(stage_module, "_counted_by_key", counting)
    return reads


def test_a_created_tables_rows_by_partition_come_from_its_write_while_its_count_is_exact(
    spark, tmp_path, monkeypatch
):
    # A table's first write counts its rows by partition key as it writes them (a
    # histogram with a bin per key and task) where its rows were counted first (written
    # once, as the table) and span few enough keys: the keys times the tasks that write
    # them stay below the bins the histogram may hold, so it merges none. Past that, or
    # where the rows are staged first (a quality rule), Spark counts them from the new
    # table or the staged rows: still exact, one job more.
    folder = ParquetFolder(tmp_path / "events")
    # Each day's orders spread over the key range, so each task that writes sees each day.
    days = [1, 2, 3, 2, 3, 3]
    folder.drop(order_rows([(n, "placed", 1.0, at(d, n)) for n, d in enumerate(days, 1)]))
    expected = {"2026-01-01": 1, "2026-01-02": 2, "2026-01-03": 3}
    spec = make_spec(str(folder.path), source={"format": "parquet"})
    tasks = key_ranges.shuffle_partitions(spark)
    reads = counting_reads_by_key(monkeypatch)

    monkeypatch.setattr(rows_module, "COUNTED_KEYS", 3 * tasks + 1)
    first = load(spark, spec, DeltaTarget("one", str(tmp_path / "one")), 1, 3)
    assert first.rows_by_partition == expected and reads == []

    monkeypatch.setattr(rows_module, "COUNTED_KEYS", 3 * tasks)
    second = load(spark, spec, DeltaTarget("two", str(tmp_path / "two")), 1, 3)
    assert second.rows_by_partition == expected and reads == [3]

    rule = {"name": "no_negatives", "check": "amount >= 0", "action": "warn"}
    checked = make_spec(str(folder.path), source={"format": "parquet"}, quality={"rules": [rule]})
    third = load(spark, checked, DeltaTarget("three", str(tmp_path / "three")), 1, 3)
    assert third.rows_by_partition == expected and reads == [3, 3]


def test_a_histograms_bins_are_read_as_rows_by_key_only_while_exact(spark):
    spec = make_spec("unused")
    key = rows_module.partition_key(spec, spark.createDataFrame([(at(1),)], ["updated_at"]).schema)
    day = 86_400
    start = int(at(1).timestamp())
    counts = rows_module.PARTITION_COUNTS

    def read(bins, rows, none=0):
        counted = {counts: bins, "rows": rows, rows_module.NO_PARTITION: none}
        return rows_module.counted_by_key(key, counted)

    # One day counted by two tasks: its bins are added up. Rows without a key are not.
    two_tasks = [(start, 2.0), (start + day, 1.0), (start, 3.0)]
    assert read(two_tasks, 7, none=1) == {"2026-01-01": 5, "2026-01-02": 1}
    assert read(two_tasks, 7) is None  # heights that do not add up to the keyed rows
    # No row had a key: Spark's histogram is null, which the write's counts hold as 0.
    assert read(None, 2, none=2) == {} and read(0, 2, none=2) == {}
    assert read(0, 2, none=1) is None
    full = [(start + n * day, 1.0) for n in range(rows_module.COUNTED_KEYS)]
    assert read(full, len(full)) is None  # as many bins as it may hold: some merged
    assert read([(253_402_300_800, 1.0)], 1) is None  # the year 10000
    assert rows_module.counted_by_key(key, {"rows": 1}) is None  # not counted


@pytest.mark.parametrize("granularity", ["daily", "hourly"])
def test_a_partition_start_counted_in_seconds_is_written_as_spark_writes_its_key(
    spark, granularity
):
    spec = make_spec("unused", partitioning={"granularity": granularity})
    instants = [
        datetime(1969, 12, 31, 23, 30, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC),
        datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(2026, 1, 2, 13, 59, tzinfo=UTC),
        datetime(2400, 2, 29, 5, tzinfo=UTC),
    ]
    rows = spark.createDataFrame([(t,) for t in instants], [spec.partition_column])
    key = rows_module.partition_key(spec, rows.schema)
    found = rows.select(key.seconds().alias("s"), key.text(key.start).alias("text")).collect()
    assert [key.text_of(r["s"]) for r in found] == [r["text"] for r in found]


@pytest.mark.parametrize("granularity", ["daily", "hourly"])
def test_the_first_and_last_partition_keys_are_cut_from_the_lowest_and_highest_value(
    spark, granularity
):
    # As Spark cuts each row's value and takes the lowest and highest cut, with or
    # without a condition on the rows, and rows without a value counted apart.
    spec = make_spec("unused", partitioning={"granularity": granularity})
    rng = random.Random(11)
    instants = [
        datetime(1969, 12, 31, tzinfo=UTC) + timedelta(seconds=rng.randrange(0, 3 * 86_400))
        for _ in range(200)
    ]
    rows = spark.createDataFrame(
        [(t, n % 3 == 0) for n, t in enumerate([*instants, None, None])],
        f"{spec.partition_column} timestamp, above boolean",
    )
    key = rows_module.partition_key(spec, rows.schema)
    above = F.col("above")

    for where in (None, above):
        kept = rows if where is None else rows.filter(where)
        expected = kept.select(
            key.text(F.min(key.start)), key.text(F.max(key.start)), F.count(F.lit(1))
        ).first()
        keyed = kept.filter(key.start.isNotNull()).count()
        found = rows.select(key.first(where), key.last(where), key.missing(where)).first()
        assert (found[0], found[1]) == (expected[0], expected[1])
        assert found[2] == expected[2] - keyed
