"""Late files: a folder feed's file that arrives after the run that passed its range is read
by the next incremental run, merged once, counted, and noticed by ``late_files.pending``
before that run."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.late_files import SourceFiles, pending
from incremental_assets.specs import TableSpec
from incremental_assets_tests.builders import (
    DeltaSourceTable,
    ParquetFolder,
    at,
    feed,
    feed_spec,
    history,
    load,
    reference,
    rows,
    scd2_reference,
)

COLUMNS = {
    "hard": ("id", "name", "lsn"),
    "soft": ("id", "name", "lsn", "is_deleted", "deleted_at"),
    "upsert": ("id", "name", "lsn"),
    "scd2": ("id", "name", "lsn", "valid_from", "valid_to", "is_current"),
}


STRATEGIES = {
    "hard": {"kind": "cdc", "deletes": "hard"},
    "soft": {"kind": "cdc", "deletes": "soft"},
    "upsert": "upsert",
    "scd2": {"kind": "scd2", "changes": "cdc"},
}


def spec_for(kind: str, folder: ParquetFolder | DeltaSourceTable) -> TableSpec:
    source_format = "delta" if isinstance(folder, DeltaSourceTable) else "parquet"
    return feed_spec(folder.path, STRATEGIES[kind], source_format)


def feed_store(store: str, path: Path) -> ParquetFolder | DeltaSourceTable:
    return ParquetFolder(path) if store == "folder" else DeltaSourceTable(path)


def expected(kind: str, events: list[tuple]) -> list[tuple]:
    if kind == "scd2":
        return scd2_reference(events)
    return reference(events, kind)


def events_for(kind: str, seed: int, **kwargs) -> list[tuple]:
    events = history(seed, names=("a", "b", "c") if kind == "scd2" else (), **kwargs)
    return [e for e in events if e[2] != "D"] if kind == "upsert" else events


def by_day(events: list[tuple]) -> dict[int, list[tuple]]:
    days: dict[int, list[tuple]] = {}
    for event in events:
        days.setdefault(event[4].day, []).append(event)
    return days


# Each strategy with each kind of store, split between this test and the property test
# below (the store's late-file detection and the strategy's merge are independent parts).
@pytest.mark.parametrize(
    ("kind", "store"),
    [("hard", "delta"), ("soft", "folder"), ("upsert", "delta"), ("scd2", "folder")],
)
def test_a_day_delivered_after_the_next_is_loaded_by_the_very_next_run(
    spark, tmp_path, kind, store
):
    """Day 2 is delivered after day 3 was loaded (a file in a folder, or an append commit
    to a Delta table): the next scheduled run loads it, no backfill."""
    folder = feed_store(store, tmp_path / "feed")
    spec = spec_for(kind, folder)
    target = DeltaTarget("t", str(tmp_path / "target"))
    events = events_for(kind, seed=3, keys=60, events=400)
    days = by_day(events)

    folder.drop(feed(*days[1]))
    load(spark, spec, target, 1)
    folder.drop(feed(*days[3]))  # day 2's file is held back: day 3 is loaded first
    third = load(spark, spec, target, 3)
    assert (third.files_late, third.rows_late) == (0, 0)  # a new file, nothing late in it
    delivered = days[1] + days[3]
    assert rows(target, *COLUMNS[kind]) == expected(kind, delivered)
    assert pending(spark, spec, target) == pending(spark, spec, target)  # reads nothing
    assert pending(spark, spec, target).rows == 0

    folder.drop(feed(*days[2]))  # day 2 arrives: every lsn in it is below the cursor
    waiting = pending(spark, spec, target)
    assert waiting.rows == len(days[2])
    assert waiting.partitions == (f"{at(2):%Y-%m-%d}",)
    assert len(waiting.files) == 1

    result = load(spark, spec, target, 4)  # the next scheduled run, no backfill

    assert (result.files_late, result.rows_late) == (1, len(days[2]))
    assert "in 1 new file" in result.window
    assert rows(target, *COLUMNS[kind]) == expected(kind, days[1] + days[2] + days[3])
    assert pending(spark, spec, target).rows == 0
    # A re-run reads no file late twice, and changes nothing.
    again = load(spark, spec, target, 4)
    assert (again.files_late, again.rows_late) == (0, 0)
    assert rows(target, *COLUMNS[kind]) == expected(kind, days[1] + days[2] + days[3])


def test_a_late_change_older_than_the_target_changes_nothing(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "feed")
    spec = spec_for("hard", folder)
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(feed((1, "new", "I", 10, at(2, 1))))
    load(spark, spec, target, 2)
    folder.drop(feed((1, "old", "U", 5, at(1, 1)), (2, "b", "I", 6, at(1, 2))))

    result = load(spark, spec, target, 2)

    assert result.rows_late == 2
    assert rows(target, "id", "name", "lsn") == [(1, "new", 10), (2, "b", 6)]
    # Only the row the merge wrote is attributed to its partition, not the stale one.
    assert result.rows_by_partition == {f"{at(1):%Y-%m-%d}": 1}


@pytest.mark.parametrize(
    "where",
    [
        ("exports du jour", "café feed"),
        # A folder Spark wrote a partition value into: its ':' is spelled '%3A'.
        ("feed", "hour=2026-01-02 00%3A00%3A00"),
    ],
    ids=["space and accent", "escaped partition value"],
)
def test_a_folder_whose_path_needs_escaping_has_its_late_files_read(spark, tmp_path, where):
    # Spark lists such a folder's files unescaped (a '%' in a name as it is), and reads
    # them back by that name.
    folder = ParquetFolder(tmp_path.joinpath(*where))
    spec = spec_for("hard", folder)
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(feed((1, "a", "I", 10, at(2, 1))))
    load(spark, spec, target, 2)
    folder.drop(feed((2, "b", "I", 6, at(1, 2))))
    assert pending(spark, spec, target).rows == 1

    result = load(spark, spec, target, 2)

    assert (result.files_late, result.rows_late) == (1, 1)
    assert rows(target, "id", "name", "lsn") == [(1, "a", 10), (2, "b", 6)]
    again = load(spark, spec, target, 2)
    assert (again.files_late, again.rows_late) == (0, 0)


def test_the_ledger_starts_with_a_target_loaded_before_it(spark, tmp_path):
    """Files present when the ledger begins are taken as covered (nothing is known of
    them): the run that starts it reads nothing late; files after it are read."""
    folder = ParquetFolder(tmp_path / "feed")
    spec = spec_for("hard", folder)
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(feed((1, "a", "I", 5, at(1, 1))))
    first = load(spark, spec, target, 1)
    assert first.files_late == 0
    assert SourceFiles(target).read().num_rows == 1
    folder.drop(feed((2, "b", "I", 3, at(1, 1))))  # below the cursor (5)

    assert load(spark, spec, target, 1).rows_late == 1
    assert rows(target, "id", "name", "lsn") == [(1, "a", 5), (2, "b", 3)]


def test_the_ledger_cache_is_caught_up_from_the_commits(spark, tmp_path):
    """A run that died after its commit and before caching its files leaves the cache
    behind; the commit's own record of the files still counts them as covered."""
    folder = ParquetFolder(tmp_path / "feed")
    spec = spec_for("hard", folder)
    target = DeltaTarget("t", str(tmp_path / "target"))
    folder.drop(feed((1, "a", "I", 5, at(1, 1))))
    load(spark, spec, target, 1)
    folder.drop(feed((2, "b", "I", 3, at(1, 1))))
    load(spark, spec, target, 1)
    cache = SourceFiles(target)
    spark.sql(f"DELETE FROM delta.`{cache.location.path}` WHERE target_version > 1")

    again = load(spark, spec, target, 1)

    assert (again.files_late, again.rows_late) == (0, 0)
    assert cache.read().num_rows == 2  # the commit's files are cached again
    assert (load(spark, spec, target, 1).rows_late, pending(spark, spec, target).files) == (0, ())


def test_a_file_rewritten_in_place_is_read_again(spark, tmp_path):
    """The ledger knows a file by name, size and modification time: an export rewritten
    under the same name with a late change in it is read again by the next run."""
    folder = ParquetFolder(tmp_path / "feed")
    spec = spec_for("hard", folder)
    target = DeltaTarget("t", str(tmp_path / "target"))
    first = folder.path / "day-1.parquet"
    pq.write_table(feed((1, "a", "I", 5, at(1, 1))), first)
    load(spark, spec, target, 1)
    folder.drop(feed((2, "b", "I", 8, at(2, 1))))
    load(spark, spec, target, 2)
    assert pending(spark, spec, target).files == ()

    pq.write_table(feed((1, "a", "I", 5, at(1, 1)), (3, "c", "I", 6, at(1, 2))), first)
    os.utime(first, (time.time() + 60, time.time() + 60))  # a later modification time
    assert pending(spark, spec, target).files == ("day-1.parquet",)
    result = load(spark, spec, target, 2)

    assert (result.files_late, result.rows_late) == (1, 2)
    assert rows(target, "id", "name", "lsn") == [(1, "a", 5), (2, "b", 8), (3, "c", 6)]
    assert pending(spark, spec, target).files == ()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "store"),
    [("hard", "folder"), ("soft", "delta"), ("upsert", "folder"), ("scd2", "delta")],
)
def test_shuffled_delayed_files_equal_the_reference_after_every_run(spark, tmp_path, kind, store):
    """Random batch cuts, files (or Delta append commits) delivered in shuffled order with
    random delays, and replays: after every run the target equals the reference for the
    events delivered so far."""
    rng = random.Random(len(kind) * 7)
    folder = feed_store(store, tmp_path / "feed")
    spec = spec_for(kind, folder)
    target = DeltaTarget("t", str(tmp_path / "target"))
    events = events_for(kind, seed=len(kind), keys=50, events=300)
    ordered = sorted(events, key=lambda e: e[3])
    # Six files (eight until the suite outgrew its time: a run per delivery).
    cuts = sorted(rng.sample(range(1, len(ordered)), 5))
    batches = [ordered[a:b] for a, b in zip([0, *cuts], [*cuts, len(ordered)], strict=True)]
    rng.shuffle(batches)  # files arrive out of order
    assert batches != sorted(batches, key=lambda b: b[0][3])  # some file is late
    waiting, delivered = list(batches), []
    while waiting:
        # Random delays: a run may find nothing new (never before the first file).
        for _ in range(rng.randint(0 if delivered else 1, min(2, len(waiting)))):
            batch = waiting.pop(0)
            folder.drop(feed(*batch))
            delivered += batch
        if rng.random() < 0.3 and delivered:  # a replay: the same file delivered again
            folder.drop(feed(*rng.choice([b for b in batches if b[0] in delivered])))
        load(spark, spec, target, 4)
        assert rows(target, *COLUMNS[kind]) == expected(kind, delivered)
