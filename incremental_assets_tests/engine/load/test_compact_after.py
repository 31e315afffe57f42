"""target.compact_after: a load that leaves that many small files compacts them after its
commit (engine/load/compact.py), in a maintenance commit of its own that changes no row."""

from __future__ import annotations

import json
from pathlib import Path

from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.delta_lake.maintenance import MAINTENANCE_KEY
from incremental_assets.engine.reload import differences
from incremental_assets_tests.builders import DeltaSourceTable, at, load, make_spec


def _day(source: DeltaSourceTable, day: int) -> None:
    """Ten new orders of ``day`` (each run inserts them: a file of its own)."""
    first = day * 10
    source.upsert([(n, "placed", float(n), at(day, 10)) for n in range(first, first + 10)])


def _files(target: DeltaTarget) -> int:
    return len(DeltaTable(target.path).file_uris())


def test_a_load_leaving_enough_small_files_compacts_them_in_a_commit_of_its_own(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    spec = make_spec(source.path, target={"compact_after": 3})
    target = DeltaTarget("orders", str(tmp_path / "target"))
    plain = DeltaTarget("orders", str(tmp_path / "plain"))
    unset = make_spec(source.path)

    _day(source, 1)
    first = load(spark, spec, target, 1)
    load(spark, unset, plain, 1)
    # One file: nothing a compaction could pack with it.
    assert (_files(target), first.small_files) == (1, 0)
    assert (first.files_compacted, first.compaction_version) == (0, None)

    results = [first]
    for day in (2, 3, 4):
        _day(source, day)
        results.append(load(spark, spec, target, day))
        load(spark, unset, plain, day)
        if results[-1].files_compacted:
            break
    done = results[-1]
    # Compacted once the small files reached 3: all of them, into one file, in the commit
    # after the load's; the load's own commit is the one it reports.
    assert done.small_files >= 3
    assert (done.files_compacted, done.files_compacted_into) == (done.small_files, 1)
    assert done.compaction_version == done.delta_version + 1
    assert _files(target) == 1 < _files(plain)
    assert "compact" in done.phase_seconds
    assert all(r.files_compacted == 0 for r in results[:-1])

    history = {c["version"]: c for c in DeltaTable(target.path).history()}
    compaction = history[done.compaction_version]
    assert compaction["operation"] == "OPTIMIZE"
    assert json.loads(compaction["userMetadata"]) == {MAINTENANCE_KEY: "compact"}
    assert differences(spark, spec, target) == (0, 0)

    # The next load goes on from the cursor the compacted load committed, and a re-run of
    # it writes nothing more.
    day = len(results) + 1
    _day(source, day)
    after = load(spark, spec, target, day)
    assert after.cursor_before == done.cursor_after
    assert (after.rows_inserted, after.files_compacted) == (10, 0)
    again = load(spark, spec, target, day)
    assert (again.rows_inserted, again.rows_updated) == (0, 0)
    assert differences(spark, spec, target) == (0, 0)


def test_a_compaction_that_fails_is_reported_and_leaves_the_load_committed(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    spec = make_spec(source.path, target={"compact_after": 2})
    target = DeltaTarget("orders", str(tmp_path / "target"))
    _day(source, 1)
    load(spark, spec, target, 1)
    _day(source, 2)

    def lose_a_file(phase: str) -> None:
        # A file of the table gone from storage (someone's clean-up) between the load's
        # commit and its compaction, which must read it.
        if phase == "committed":
            Path(DeltaTable(target.path).file_uris()[0].removeprefix("file://")).unlink()

    loaded = load(spark, spec, target, 2, hook=lose_a_file)

    assert loaded.committed and loaded.rows_inserted == 10
    assert loaded.files_compacted == 0 and loaded.compaction_version is None
    assert loaded.compaction_note.startswith("the compaction after the load failed (")
    assert "the load is committed" in loaded.compaction_note
    assert DeltaTable(target.path).version() == loaded.delta_version
