"""SCD type 2 history tables (strategy scd2), fed by upserts, CDC feeds and snapshots."""

from __future__ import annotations

import random
import shutil
from dataclasses import replace
from datetime import timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import functions as F

from incremental_assets.engine import DeltaTarget, IncrementalLoadError, NullValuesError, checks
from incremental_assets.engine.delta_lake.store import ChangeLog
from incremental_assets.engine.load import commit as commit_module
from incremental_assets.engine.reload import differences
from incremental_assets_tests.builders import (
    DeltaSourceTable,
    ParquetFolder,
    at,
    cdc_history_spec,
    deliver,
    feed,
    feed_spec,
    history,
    load,
    make_spec,
    rows,
    scd2_reference,
    staging_seen,
)

VERSION = ("id", "name", "valid_from", "valid_to", "is_current")


CUSTOMERS = pa.schema(
    [
        ("id", pa.int64()),
        ("city", pa.string()),
        ("email", pa.string()),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)


def customers(*rows) -> pa.Table:
    return pa.Table.from_pylist(
        [dict(zip(CUSTOMERS.names, r, strict=True)) for r in rows], CUSTOMERS
    )


@pytest.fixture
def folder(tmp_path) -> ParquetFolder:
    return ParquetFolder(tmp_path / "feed")


def test_tracked_change_opens_a_version_untracked_change_updates_in_place(spark, folder, tmp_path):
    spec = make_spec(
        str(folder.path),
        source={"format": "parquet"},
        keys=["id"],
        strategy={"kind": "scd2", "tracked": ["city"]},
    )
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(customers((1, "Oslo", "a@x", at(1, 1)), (2, "Rome", "b@x", at(1, 1))))
    first = load(spark, spec, target, 1)
    folder.drop(
        customers(
            (1, "Bergen", "a@x", at(2, 1)),  # tracked: closes Oslo, opens Bergen
            (2, "Rome", "b@new", at(2, 1)),  # untracked only: the version is updated
        )
    )
    second = load(spark, spec, target, 2)

    assert rows(target, "id", "city", "email", "valid_from", "valid_to", "is_current") == [
        (1, "Bergen", "a@x", at(2, 1), None, True),
        (1, "Oslo", "a@x", at(1, 1), at(2, 1), False),
        (2, "Rome", "b@new", at(1, 1), None, True),
    ]
    assert first.changes == {"open": 2, "close": 0, "update": 0, "remove": 0}
    assert second.changes == {"open": 1, "close": 1, "update": 1, "remove": 0}
    assert (second.rows_inserted, second.rows_updated, second.rows_deleted) == (1, 2, 0)


def test_a_history_run_merges_its_difference_in_one_pass(spark, folder, tmp_path):
    # A run's increment is the difference between the versions its keys should have and
    # those the table holds: every staged row writes or removes one. So the MERGE reads
    # the staged rows in one pass, with no acting rows staged apart first, on a table of
    # any size (target.one_pass_below off here); a re-delivered event stages nothing.
    spec = make_spec(
        str(folder.path),
        source={"format": "parquet"},
        keys=["id"],
        strategy={"kind": "scd2", "tracked": ["city"]},
        target={"one_pass_below": 0},
    )
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(customers((1, "Oslo", "a@x", at(1, 1)), (2, "Rome", "b@x", at(1, 1))))
    load(spark, spec, target, 1)
    folder.drop(
        customers(
            (1, "Bergen", "a@x", at(2, 1)),  # closes Oslo, opens Bergen
            (2, "Rome", "b@new", at(2, 1)),  # updates Rome in place
            (2, "Rome", "b@x", at(1, 1)),  # day 1's event again: nothing
        )
    )
    look, staged_apart = staging_seen(target, "committed", "**/*_acting")

    second = load(spark, spec, target, 2, hook=look)

    assert staged_apart == [[]]
    assert second.changes == {"open": 1, "close": 1, "update": 1, "remove": 0}
    assert (second.rows_inserted, second.rows_updated, second.rows_deleted) == (1, 2, 0)
    assert rows(target, "id", "city", "email", "valid_from", "valid_to", "is_current") == [
        (1, "Bergen", "a@x", at(2, 1), None, True),
        (1, "Oslo", "a@x", at(1, 1), at(2, 1), False),
        (2, "Rome", "b@new", at(1, 1), None, True),
    ]
    assert checks.rows_reconciled(spec, second).passed


def test_unchanged_rows_and_replays_write_nothing(spark, folder, tmp_path):
    spec = make_spec(str(folder.path), source={"format": "parquet"}, keys=["id"], strategy="scd2")
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(customers((1, "Oslo", "a@x", at(1, 1)), (2, "Rome", "b@x", at(1, 2))))
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()

    replay = load(spark, spec, target, 1, backfill=True)

    assert replay.changes == {"open": 0, "close": 0, "update": 0, "remove": 0}
    assert not replay.committed and DeltaTable(target.path).version() == version


def test_late_change_is_placed_in_history_and_does_not_become_current(spark, folder, tmp_path):
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(feed((1, "a", "I", 1, at(1, 1)), (1, "c", "U", 3, at(1, 5))))
    load(spark, spec, target, 1)
    # lsn 2 arrives after lsn 3 was loaded: the next run reads its file as a late file.
    folder.drop(feed((1, "b", "U", 2, at(1, 3))))
    incremental = load(spark, spec, target, 1)
    backfill = load(spark, spec, target, 1, backfill=True)

    assert (incremental.rows_extracted, incremental.rows_late) == (1, 1)
    assert incremental.changes == {"open": 1, "close": 0, "update": 1, "remove": 0}
    assert rows(target, *VERSION) == [
        (1, "a", at(1, 1), at(1, 3), False),
        (1, "b", at(1, 3), at(1, 5), False),
        (1, "c", at(1, 5), None, True),
    ]
    assert backfill.changes == {"open": 0, "close": 0, "update": 0, "remove": 0}


def test_delete_closes_the_current_version_and_a_reinsert_opens_a_new_one(spark, folder, tmp_path):
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(feed((1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(1, 1))))
    load(spark, spec, target, 1)
    folder.drop(feed((1, None, "D", 3, at(2, 1)), (2, "b", "U", 4, at(2, 2))))
    load(spark, spec, target, 2)
    folder.drop(feed((1, "a", "I", 5, at(3, 1))))
    load(spark, spec, target, 3)

    assert rows(target, *VERSION) == [
        (1, "a", at(1, 1), at(2, 1), False),
        (1, "a", at(3, 1), None, True),
        (2, "b", at(1, 1), None, True),
    ]
    assert differences(spark, spec, target) == (0, 0)


def test_backfill_of_old_partitions_never_rewrites_newer_history(spark, folder, tmp_path):
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    for day in (1, 2, 3):
        folder.drop(feed((1, f"v{day}", "U" if day > 1 else "I", day, at(day, 1))))
        load(spark, spec, target, day)
    before = rows(target, *VERSION)
    version = DeltaTable(target.path).version()

    for day in (1, 2):
        result = load(spark, spec, target, day, backfill=True)
        assert result.rows_extracted == 1 and not result.committed

    assert rows(target, *VERSION) == before
    assert DeltaTable(target.path).version() == version


def test_history_from_snapshots_closes_vanished_keys(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source")
    spec = make_spec(
        source.path, keys=["id"], watermark=None, strategy={"kind": "scd2", "changes": "snapshot"}
    )
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(customers((1, "Oslo", "a", at(1)), (2, "Rome", "b", at(1))))
    first = load(spark, spec, target, 1)
    source.replace(customers((1, "Bergen", "a", at(1)), (3, "Pisa", "c", at(1))))
    second = load(spark, spec, target, 2)
    t1, t2 = first.cursor_after, second.cursor_after

    assert rows(target, "id", "city", "valid_from", "valid_to", "is_current") == [
        (1, "Bergen", t2, None, True),
        (1, "Oslo", t1, t2, False),
        (2, "Rome", t1, t2, False),
        (3, "Pisa", t2, None, True),
    ]
    assert second.changes == {"open": 2, "close": 2, "update": 0, "remove": 0}
    assert differences(spark, spec, target) == (0, 0)


def test_a_late_event_that_joins_versions_removes_them_in_one_pass(spark, folder, tmp_path):
    # A late event at the time of a version, newer than its event, takes its place: the
    # key's three versions become one. The run's increment updates the first (open
    # again) and removes the other two; the MERGE reads it in one pass (no acting rows
    # staged apart, target.one_pass_below off), and each of its rows acts.
    spec = feed_spec(folder.path, {"kind": "scd2", "changes": "cdc"}, target={"one_pass_below": 0})
    target = DeltaTarget("t", str(tmp_path / "target"))
    day1 = [(1, "a", "I", 1, at(1, 1)), (2, "x", "I", 2, at(1, 1))]
    day2 = [(1, "b", "U", 3, at(2, 1)), (1, "a", "U", 4, at(2, 2))]
    folder.drop(feed(*day1))
    load(spark, spec, target, 1)
    folder.drop(feed(*day2))
    load(spark, spec, target, 2)
    assert len(rows(target, "id", "valid_from")) == 4
    late = [(1, "a", "U", 5, at(2, 1))]  # in place of lsn 3 ("b"): "a" throughout
    folder.drop(feed(*late))
    look, staged_apart = staging_seen(target, "committed", "**/*_acting")

    result = load(spark, spec, target, 2, hook=look)

    assert staged_apart == [[]]
    assert result.changes == {"open": 0, "close": 0, "update": 1, "remove": 2}
    assert (result.rows_inserted, result.rows_updated, result.rows_deleted) == (0, 1, 2)
    assert rows(target, "id", "name", *VERSION[2:]) == [
        (1, "a", at(1, 1), None, True),
        (2, "x", at(1, 1), None, True),
    ]
    assert checks.rows_reconciled(spec, result).passed
    assert differences(spark, spec, target) == (0, 0)


def test_a_first_load_writes_its_versions_once_and_its_change_log_beside_them(
    spark, folder, tmp_path
):
    # The versions are not staged to be rewritten by the commit: the commit writes them
    # as the table, after the new events are appended to the change log. A first load
    # killed between the two (the log written, the table not) is loaded again from the
    # logged events, to the same table.
    events = [
        (1, "a", "I", 1, at(1, 1)),
        (2, "b", "I", 2, at(1, 1)),
        (1, "a2", "U", 3, at(1, 2)),
        (2, None, "D", 4, at(1, 3)),
        (2, "b", "I", 5, at(1, 4)),
        (2, "b", "I", 5, at(1, 4)),  # a duplicate event
    ]
    folder.drop(feed(*events))
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    look, staged = staging_seen(target, "staged", "*/*")

    first = load(spark, spec, target, 1, hook=look)

    # Nothing: the events are read once, shuffled into key ranges, by the log's append,
    # and the versions are computed from the log as the table is written.
    assert staged == [[]]
    expected = scd2_reference(events)
    assert rows(target, "id", "name", "lsn", *VERSION[2:]) == expected
    assert first.changes == {"open": 4, "close": 0, "update": 0, "remove": 0}
    assert (first.rows_extracted, first.rows_staged, first.rows_inserted) == (6, 4, 4)
    assert first.rows_unchanged == 1  # the duplicate, not logged twice
    assert checks.rows_reconciled(spec, first).passed
    log = DeltaTable(f"{target.path}__changes").to_pyarrow_table(columns=["lsn"])
    assert sorted(log.column("lsn").to_pylist()) == [1, 2, 3, 4, 5]
    assert differences(spark, spec, target) == (0, 0)

    shutil.rmtree(target.path)  # what a kill after the log's append leaves
    again = load(spark, spec, target, 1)
    assert rows(target, "id", "name", "lsn", *VERSION[2:]) == expected
    assert (again.rows_inserted, again.rows_unchanged) == (4, 6)
    assert DeltaTable(f"{target.path}__changes").to_pyarrow_table().num_rows == 5
    # No event is new, and versions were written: the log's events were appended for a
    # commit the table does not hold, and reconciliation says so instead of failing.
    assert again.events_recovered == 6  # every extracted event: the table is new
    assert checks.rows_reconciled(spec, again).passed
    assert (
        "6 logged for a commit the table does not hold"
        in checks.rows_reconciled(spec, again).description
    )
    unexplained = checks.rows_reconciled(spec, replace(again, events_recovered=0))
    assert "4 version rows written without a new event" in unexplained.description
    replay = load(spark, spec, target, 1)  # every event logged, and committed
    assert (replay.events_recovered, replay.rows_inserted, replay.rows_updated) == (0, 0, 0)
    assert checks.rows_reconciled(spec, replay).passed


def test_a_later_run_stages_no_table_rows_nor_versions_and_logs_only_its_new_events(
    spark, folder, tmp_path
):
    # A later run stages its events, the logged events of the keys they touch, the new
    # ones, and the increment: neither the table's rows of those keys nor their versions
    # (each read once). The log's append takes the new events alone, each once, in key
    # order.
    day1 = [(3, "c", "I", 1, at(1, 1)), (1, "a", "I", 2, at(1, 2)), (2, "b", "I", 3, at(1, 3))]
    folder.drop(feed(*day1))
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    load(spark, spec, target, 1)
    day2 = [(3, "c2", "U", 4, at(2, 1))]
    folder.drop(feed(*day2))
    load(spark, spec, target, 2)
    later = [
        (3, "c2", "U", 4, at(2, 1)),  # logged by day 2's first run: delivered again
        (2, "b2", "U", 5, at(2, 2)),
        (1, None, "D", 6, at(2, 3)),
        (1, None, "D", 6, at(2, 3)),  # twice in this window
    ]
    folder.drop(feed(*later))
    look, staged = staging_seen(target, "staged", "*/*")

    again = load(spark, spec, target, 2, hook=look)  # day 2 again

    assert staged == [["events", "increment", "log", "new_changes"]]
    assert (again.rows_extracted, again.rows_unchanged) == (4, 2)  # 2 new events
    assert checks.rows_reconciled(spec, again).passed
    log = DeltaTable(f"{target.path}__changes")
    appended = log.to_pyarrow_table(columns=["id", "lsn"], filters=[("lsn", ">", 4)])
    assert appended.to_pylist() == [{"id": 1, "lsn": 6}, {"id": 2, "lsn": 5}]  # key order
    assert sorted(log.to_pyarrow_table(columns=["lsn"]).column("lsn").to_pylist()) == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert rows(target, "id", "name", "lsn", *VERSION[2:]) == scd2_reference(day1 + later)
    assert differences(spark, spec, target) == (0, 0)


def test_a_run_whose_events_all_follow_the_log_continues_the_newest_versions_unread(
    spark, folder, tmp_path
):
    # Every event of day 2 takes effect after every logged one: the run reads no row of
    # the log, and continues each key's newest version as the table holds it (updated in
    # place, closed, or followed after a delete), as a recomputation from the whole log
    # would.
    day1 = [
        (1, "a", "I", 1, at(1, 1)),
        (2, "b", "I", 2, at(1, 2)),
        (3, "c", "I", 3, at(1, 3)),
        (3, "c2", "U", 4, at(1, 4)),  # key 3 has an older version
        (4, "d", "I", 5, at(1, 5)),
        (4, None, "D", 6, at(1, 6)),  # key 4 is deleted
        (5, "e", "I", 7, at(1, 7)),
        (7, "g", "I", 8, at(1, 8)),  # keys 7 and 8: versions of two events, which
        (7, "g", "U", 9, at(1, 9)),  # start at their first
        (8, "h", "I", 10, at(1, 10)),
        (8, "h", "U", 11, at(1, 11)),
    ]
    folder.drop(feed(*day1))
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    load(spark, spec, target, 1)
    day2 = [
        (1, "a", "U", 12, at(2, 1)),  # untracked only: updated in place
        (2, "b2", "U", 13, at(2, 2)),  # closes b, opens b2
        (3, None, "D", 14, at(2, 3)),  # closes c2
        (4, "d2", "I", 15, at(2, 4)),  # opens a version after the delete
        (6, "f", "I", 16, at(2, 5)),  # a new key
        (6, "f", "I", 16, at(2, 5)),  # twice in this window
        (5, "e", "U", 17, at(2, 6)),  # continues e, then closes it
        (5, "e3", "U", 18, at(2, 7)),
        (7, "g", "U", 19, at(2, 8)),  # updated in place, still from at(1, 8)
        (8, "h2", "U", 20, at(2, 9)),  # closes h, which started at at(1, 10)
    ]
    folder.drop(feed(*day2))
    look, staged = staging_seen(target, "staged", "*/*")

    second = load(spark, spec, target, 2, hook=look)

    # No "log"; the new events, few, are not staged but counted as the increment is.
    assert staged == [["events", "increment"]]
    assert second.changes == {"open": 5, "close": 4, "update": 2, "remove": 0}
    assert (second.rows_extracted, second.rows_unchanged) == (10, 1)
    assert rows(target, "id", "name", "lsn", *VERSION[2:]) == scd2_reference(day1 + day2)
    assert checks.rows_reconciled(spec, second).passed
    assert differences(spark, spec, target) == (0, 0)
    log = DeltaTable(f"{target.path}__changes")
    logged = log.to_pyarrow_table(columns=["lsn"])
    assert sorted(logged.column("lsn").to_pylist()) == list(range(1, 21))  # each once
    appended = log.to_pyarrow_table(columns=["id", "lsn"], filters=[("lsn", ">", 11)])
    assert [row["id"] for row in appended.to_pylist()] == [1, 2, 3, 4, 5, 5, 6, 7, 8]
    assert len(log.get_add_actions()) == 2  # day 1's append, and one file of day 2's


def test_a_run_whose_new_events_count_comes_back_missing_fails_and_logs_nothing(
    spark, folder, tmp_path, monkeypatch
):
    # The new events of a run that follows its log are counted as its increment is
    # written, not staged. Should Spark return no count, the run fails before the log's
    # append and the commit: it neither commits versions without their events nor
    # appends events without their versions.
    from pyspark.sql import Observation

    from incremental_assets.engine.strategies import scd2

    folder.drop(feed((1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(1, 2))))
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    load(spark, spec, target, 1)
    before = rows(target, "id", "name", "lsn", *VERSION[2:])
    log = DeltaTable(f"{target.path}__changes")
    logged_version = log.version()
    folder.drop(feed((1, "a2", "U", 3, at(2, 1))))

    class Lost(Observation):
        @property
        def get(self):
            assert super().get["rows"] == 1  # the write did count
            return {}

    monkeypatch.setattr(scd2, "Observation", Lost)
    with pytest.raises(RuntimeError, match="no count of the run's new change-log events"):
        load(spark, spec, target, 2)

    assert rows(target, "id", "name", "lsn", *VERSION[2:]) == before
    assert DeltaTable(f"{target.path}__changes").version() == logged_version
    monkeypatch.undo()
    load(spark, spec, target, 2)
    assert rows(target, "id", "name", "lsn", *VERSION[2:]) == scd2_reference(
        [(1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(1, 2)), (1, "a2", "U", 3, at(2, 1))]
    )


def test_a_run_after_another_commit_on_the_log_reads_the_logged_events(spark, folder, tmp_path):
    # A commit on top of the log that is not the loader's append (here a property set by
    # hand) leaves unknown whether the table holds every logged event: the run reads them.
    folder.drop(feed((1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(1, 2))))
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    load(spark, spec, target, 1)
    spark.sql(
        f"ALTER TABLE delta.`{target.path}__changes` "
        "SET TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 60 days')"
    )
    day2 = [(1, "a2", "U", 3, at(2, 1))]
    folder.drop(feed(*day2))
    look, staged = staging_seen(target, "staged", "*/*")

    load(spark, spec, target, 2, hook=look)

    assert staged == [["events", "increment", "log", "new_changes"]]
    assert rows(target, "id", "name", "lsn", *VERSION[2:]) == scd2_reference(
        [(1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(1, 2)), *day2]
    )


def test_a_run_after_an_append_that_no_commit_followed_reads_the_log_and_folds_it(
    spark, folder, tmp_path, monkeypatch
):
    # A run killed after its change log's append and before its commit leaves an event the
    # table does not hold. The next run's events all take effect after it, but the log's
    # newest commit is that append, not the one of the table's last commit: the run reads
    # the log, and the killed run's event takes its place in the history.
    day1 = [(1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(1, 2))]
    folder.drop(feed(*day1))
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    load(spark, spec, target, 1)
    killed = (1, "a2", "U", 3, at(2, 1))
    folder.drop(feed(killed))
    with monkeypatch.context() as patched:

        def killed_before_commit(*args, **kwargs):
            raise RuntimeError("killed before its commit")

        patched.setattr(DeltaTarget, "commit", killed_before_commit)
        with pytest.raises(RuntimeError, match="killed before its commit"):
            load(spark, spec, target, 2)
    logged = DeltaTable(f"{target.path}__changes").to_pyarrow_table(columns=["lsn"])
    assert sorted(logged.column("lsn").to_pylist()) == [1, 2, 3]  # appended, not committed
    # The killed run's delivery is gone from the source (a retention, a withdrawn file):
    # else the next window reads its event again, and finds it logged by the time check.
    shutil.rmtree(folder.path)
    folder.path.mkdir()
    day3 = [(1, "a3", "U", 4, at(3, 1)), (2, "b3", "U", 5, at(3, 2))]
    folder.drop(feed(*day3))
    look, staged = staging_seen(target, "staged", "*/*")

    third = load(spark, spec, target, 3, hook=look)

    assert staged == [["events", "increment", "log", "new_changes"]]
    assert (third.rows_extracted, third.rows_unchanged, third.events_recovered) == (2, 0, 1)
    assert third.rows_by_partition == {"2026-01-01": 2, "2026-01-02": 1, "2026-01-03": 2}
    assert rows(target, "id", "name", "lsn", *VERSION[2:]) == scd2_reference([*day1, killed, *day3])


def test_a_replay_within_the_millisecond_of_the_newest_logged_event_reads_the_log(
    spark, folder, tmp_path
):
    # Delta keeps the log's timestamp statistics to the millisecond: an event replayed in
    # the newest logged event's millisecond (here at its microsecond) is not taken for
    # one after the log, so it is found logged and not logged twice.
    day1 = [(1, "a", "I", 1, at(1, 1))]
    folder.drop(feed(*day1))
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    load(spark, spec, target, 1)
    newest = (2, "b", "I", 2, at(2, 1) + timedelta(microseconds=900))
    folder.drop(feed(newest))
    load(spark, spec, target, 2)
    later = (2, "b2", "U", 3, at(2, 1) + timedelta(microseconds=950))  # the same millisecond
    folder.drop(feed(newest, later))
    look, staged = staging_seen(target, "staged", "*/*")

    again = load(spark, spec, target, 2, hook=look)  # day 2 again

    assert staged == [["events", "increment", "log", "new_changes"]]
    assert (again.rows_extracted, again.rows_unchanged) == (2, 1)
    logged = DeltaTable(f"{target.path}__changes").to_pyarrow_table(columns=["lsn"])
    assert sorted(logged.column("lsn").to_pylist()) == [1, 2, 3]
    assert rows(target, "id", "name", "lsn", *VERSION[2:]) == scd2_reference([*day1, newest, later])


def test_the_change_log_counts_as_uncommitted_only_appends_for_the_tables_next_commit(
    spark, tmp_path
):
    log = ChangeLog(DeltaTarget("t", str(tmp_path / "target")))
    events = spark.createDataFrame([(1, "a"), (2, "b")], "id long, name string")
    log.append(events, 3)  # for the table's commit 3, by a run killed before it
    log.append(events.limit(1), 3)  # then by a second one, which found one more event

    assert log.uncommitted(3) == 3
    assert log.uncommitted(4) == 0  # commit 3 happened since
    assert log.uncommitted(0) == 0  # a table loaded anew (its log holds older appends)


def test_a_first_loads_versions_come_from_the_change_log_as_its_own_append_left_it(
    spark, folder, tmp_path, monkeypatch
):
    # A first load appends its events to the change log, then writes the versions it
    # computes from the log. A stray writer's append in between (another event of another
    # key) is not folded into them: the log is read at the version of this run's append.
    folder.drop(feed((1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(1, 2))))
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    log = f"{target.path}__changes"

    def stray(point: str) -> None:
        if point == "before_commit":
            logged = spark.read.format("delta").load(log)
            other = logged.filter("id = 1").withColumn("id", F.lit(99).cast("long"))
            other.withColumn("lsn", F.lit(99).cast("long")).write.format("delta").mode(
                "append"
            ).save(log)

    monkeypatch.setattr(commit_module, "crash_point", stray)
    first = load(spark, spec, target, 1)

    assert first.rows_inserted == 2
    assert [r[0] for r in rows(target, "id", "name")] == [1, 2]
    assert DeltaTable(log).to_pyarrow_table(columns=["id"]).num_rows == 3  # the stray's too


def test_a_first_load_keyed_by_text_is_shuffled_by_sparks_range_partitioner(
    spark, folder, tmp_path
):
    # A text key has no numeric ranges to compute: the first load's events and versions
    # are shuffled by Spark's own range partitioner, to the same history.
    spec = make_spec(
        str(folder.path),
        source={"format": "parquet"},
        keys=["email"],
        strategy={"kind": "scd2", "tracked": ["city"]},
    )
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(
        customers(
            (1, "Oslo", "a@x", at(1, 1)),
            (1, "Bergen", "a@x", at(1, 2)),
            (2, "Rome", "b@x", at(1, 1)),
            (2, "Rome", "b@x", at(1, 1)),  # a duplicate event
        )
    )

    first = load(spark, spec, target, 1)

    assert rows(target, "email", "city", "valid_from", "valid_to", "is_current") == [
        ("a@x", "Bergen", at(1, 2), None, True),
        ("a@x", "Oslo", at(1, 1), at(1, 2), False),
        ("b@x", "Rome", at(1, 1), None, True),
    ]
    assert (first.changes["open"], first.rows_unchanged) == (3, 1)
    assert checks.rows_reconciled(spec, first).passed
    assert DeltaTable(f"{target.path}__changes").to_pyarrow_table().num_rows == 3


def test_a_tracked_map_column_opens_a_version_when_its_entries_change(spark, folder, tmp_path):
    # Spark cannot compare maps: their state is compared as JSON text.
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("tags", pa.map_(pa.string(), pa.string())),
            ("updated_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    spec = make_spec(str(folder.path), source={"format": "parquet"}, keys=["id"], strategy="scd2")
    target = DeltaTarget("t", str(tmp_path / "target"))
    tags = {1: [("a", "1")], 2: [("a", "1")], 3: [("a", "2")]}
    events = [{"id": 1, "tags": t, "updated_at": at(1, hour)} for hour, t in tags.items()]
    folder.drop(pa.Table.from_pylist(events, schema))

    load(spark, spec, target, 1)

    assert rows(target, "id", "valid_from", "valid_to", "is_current") == [
        (1, at(1, 1), at(1, 3), False),  # the same entries at 02:00: one version
        (1, at(1, 3), None, True),
    ]


def test_null_effective_time_fails_and_commits_nothing(spark, folder, tmp_path):
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(feed((1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, None)))

    with pytest.raises(NullValuesError, match="changed_at: 1"):
        load(spark, spec, target, 1)
    assert not target.exists()


# --- property test: random histories into scd2, against a plain-Python reference ------


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2])
def test_random_histories_into_scd2_equal_the_reference(spark, tmp_path, seed):
    rng = random.Random(seed * 17)
    events = history(seed, keys=120, events=600, names=("a", "b", "c"))
    folder = ParquetFolder(tmp_path / "feed")
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    columns = ("id", "name", "lsn", "valid_from", "valid_to", "is_current")

    for batch in deliver(events, rng):
        folder.drop(feed(*batch))
        load(spark, spec, target, 4)
        if rng.random() < 0.5:
            first = rng.randint(1, 4)
            load(spark, spec, target, first, rng.randint(first, 4), backfill=True)
    load(spark, spec, target, 1, 4, backfill=True)
    loaded = rows(target, *columns)
    day = rng.choice([1, 2, 3, 4])  # one old day replayed (two until the suite outgrew its time)
    load(spark, spec, target, day, backfill=True)

    assert loaded == scd2_reference(events)
    assert rows(target, *columns) == loaded


@pytest.mark.parametrize(
    ("events", "error", "says"),
    [
        ([(1, "a", "X", 3, at(2, 1))], IncrementalLoadError, "operation code"),
        ([(None, "a", "U", 3, at(2, 1))], NullValuesError, "id: 1"),
    ],
)
def test_bad_change_rows_fail_and_leave_target_and_change_log_untouched(
    spark, folder, tmp_path, events, error, says
):
    spec = cdc_history_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(feed((1, "a", "I", 1, at(1, 1))))
    load(spark, spec, target, 1)
    log = DeltaTable(f"{target.path}__changes")
    versions = (DeltaTable(target.path).version(), log.version())
    folder.drop(feed((2, "b", "I", 2, at(2, 1)), *events))

    with pytest.raises(error, match=says):
        load(spark, spec, target, 2)

    log.update_incremental()
    assert (DeltaTable(target.path).version(), log.version()) == versions
