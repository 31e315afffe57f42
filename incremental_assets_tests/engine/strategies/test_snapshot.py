"""Snapshot diff (strategy snapshot): a source without a change column, read whole each run."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget, IncrementalLoadError
from incremental_assets.engine.reload import differences
from incremental_assets.specs.models import SNAPSHOT_AT
from incremental_assets_tests.builders import (
    DeltaSourceTable,
    history,
    load,
    make_spec,
    products,
    rows,
    snapshot_spec,
)


@pytest.fixture
def source(tmp_path) -> DeltaSourceTable:
    return DeltaSourceTable(tmp_path / "source")


def test_only_inserted_changed_and_vanished_rows_are_written_and_counted(spark, source, tmp_path):
    spec = snapshot_spec(source.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.0), (3, "pad", 3.0), (4, "cap", 4.0)))
    first = load(spark, spec, target, 1)
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.5), (4, "cap", 4.0), (5, "box", 5.0)))

    second = load(spark, spec, target, 2)

    assert rows(target, "id", "name", "price") == [
        (1, "pen", 1.0),
        (2, "ink", 2.5),
        (4, "cap", 4.0),
        (5, "box", 5.0),
    ]
    assert first.changes == {"insert": 4, "change": 0, "vanish": 0}
    assert second.changes == {"insert": 1, "change": 1, "vanish": 1}
    assert (second.rows_inserted, second.rows_updated, second.rows_deleted) == (1, 1, 1)
    assert (second.rows_extracted, second.rows_unchanged) == (4, 2)
    # The unchanged rows keep the time of the snapshot that last changed them.
    stamps = dict(rows(target, "id", SNAPSHOT_AT))
    assert stamps[1] == first.cursor_after and stamps[2] == second.cursor_after
    assert differences(spark, spec, target) == (0, 0)


def test_an_unchanged_snapshot_writes_no_data(spark, source, tmp_path):
    spec = snapshot_spec(source.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.0)))
    load(spark, spec, target, 1)
    files = set(DeltaTable(target.path).file_uris())

    again = load(spark, spec, target, 1)

    assert again.changes == {"insert": 0, "change": 0, "vanish": 0}
    assert set(DeltaTable(target.path).file_uris()) == files
    assert again.cursor_after > again.cursor_before  # the snapshot time is still recorded


def test_soft_deletes_flag_vanished_rows_and_revive_them_when_they_return(spark, source, tmp_path):
    spec = snapshot_spec(source.path, deletes="soft")
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.0)))
    load(spark, spec, target, 1)
    source.replace(products((1, "pen", 1.0)))
    gone = load(spark, spec, target, 2)
    assert rows(target, "id", "is_deleted", "deleted_at") == [
        (1, False, None),
        (2, True, gone.cursor_after),
    ]
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.0)))

    back = load(spark, spec, target, 3)

    assert rows(target, "id", "name", "is_deleted", "deleted_at") == [
        (1, "pen", False, None),
        (2, "ink", False, None),
    ]
    assert back.changes == {"insert": 1, "change": 0, "vanish": 0}


def test_change_to_an_untracked_column_alone_is_not_written(spark, source, tmp_path):
    spec = snapshot_spec(source.path, tracked=["price"])
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.0)))
    load(spark, spec, target, 1)
    source.replace(products((1, "Pen", 1.0), (2, "Ink", 2.2)))

    result = load(spark, spec, target, 2)

    assert result.changes == {"insert": 0, "change": 1, "vanish": 0}
    assert rows(target, "id", "name", "price") == [(1, "pen", 1.0), (2, "Ink", 2.2)]


def test_run_for_a_partition_older_than_the_last_snapshot_is_refused(spark, source, tmp_path):
    spec = snapshot_spec(source.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0)))
    load(spark, spec, target, 3)
    version = DeltaTable(target.path).version()
    source.replace(products((1, "pen", 9.0)))

    with pytest.raises(IncrementalLoadError, match="cannot be rebuilt"):
        load(spark, spec, target, 2, backfill=True)

    assert DeltaTable(target.path).version() == version
    assert rows(target, "id", "price") == [(1, 1.0)]


def test_duplicate_keys_in_a_snapshot_are_refused_and_nothing_is_written(spark, source, tmp_path):
    # Issue 23: keeping one of the rows (as this test once pinned) lost the other silently.
    spec = snapshot_spec(source.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0), (1, "pen", 1.5), (2, "ink", 2.0)))

    with pytest.raises(IncrementalLoadError, match=r"id=1 \(2 rows\)"):
        load(spark, spec, target, 1)

    assert not DeltaTable.is_deltatable(target.path)


def test_snapshot_table_refuses_a_watermark(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="has no watermark"):
        make_spec(str(tmp_path), strategy="snapshot")


def test_null_key_in_a_snapshot_fails_and_commits_nothing(spark, source, tmp_path):
    from incremental_assets.engine import NullValuesError

    spec = snapshot_spec(source.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0)))
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()
    source.replace(products((1, "pen", 2.0), (None, "ink", 2.0)))

    with pytest.raises(NullValuesError, match="id: 1"):
        load(spark, spec, target, 2)

    assert DeltaTable(target.path).version() == version
    assert rows(target, "id", "price") == [(1, 1.0)]


# --- property test: random sequences of snapshots, against a plain-Python reference ---


def states(seed: int) -> list[dict[int, str]]:
    """Source states after random prefixes of a random change history (with deletes and
    re-inserts), some repeated, as a snapshot source would show them over time."""
    rng = random.Random(seed)
    events = history(seed, keys=150, events=700, names=("a", "b", "c"))
    # Five cuts of the history (seven until the suite outgrew its time: each state taken
    # is a whole load); with the repeated ones, seven states for seed 7.
    cuts = [*sorted(rng.sample(range(1, len(events)), 4)), len(events)]
    state: dict[int, str] = {}
    out, done = [], 0
    for cut in cuts:
        for key, name, op, _, _ in events[done:cut]:
            if op == "D":
                state.pop(key, None)
            else:
                state[key] = name
        done = cut
        out.append(dict(state))
        if rng.random() < 0.3:
            out.append(dict(state))  # the same state taken again
    return out


def snapshot_reference(taken: list[tuple[object, dict[int, str]]], mode: str) -> list[tuple]:
    seen: dict[int, tuple] = {}
    versions: list[list] = []
    current: dict[int, list] = {}
    for stamp, state in taken:
        for key, name in state.items():
            seen[key] = (key, name, False, None)
            if key in current and current[key][1] != name:
                current.pop(key)[3] = stamp
            if key not in current:
                current[key] = [key, name, stamp, None]
                versions.append(current[key])
        for key in [k for k in current if k not in state]:
            current.pop(key)[3] = stamp
            seen[key] = (key, seen[key][1], True, stamp)
    if mode == "hard":
        return sorted((k, n) for k, n in taken[-1][1].items())
    if mode == "soft":
        return sorted(seen.values())
    return sorted((k, n, start, end, end is None) for k, n, start, end in versions)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hard", "soft", "scd2"])
def test_random_snapshot_sequences_equal_the_reference(spark, tmp_path, mode):
    source = DeltaSourceTable(tmp_path / "source")
    strategy = (
        {"kind": "scd2", "changes": "snapshot"}
        if mode == "scd2"
        else {"kind": "snapshot", "deletes": mode}
    )
    spec = make_spec(source.path, keys=["id"], watermark=None, strategy=strategy)
    target = DeltaTarget("t", str(tmp_path / "target"))
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    taken = []
    for day, state in enumerate(states(7), start=1):
        source.replace(
            pa.Table.from_pylist([{"id": k, "name": v} for k, v in state.items()], schema)
        )
        result = load(spark, spec, target, min(day, 28))
        taken.append((result.cursor_after, state))

    columns = {
        "hard": ("id", "name"),
        "soft": ("id", "name", "is_deleted", "deleted_at"),
        "scd2": ("id", "name", "valid_from", "valid_to", "is_current"),
    }[mode]
    assert rows(target, *columns) == snapshot_reference(taken, mode)
