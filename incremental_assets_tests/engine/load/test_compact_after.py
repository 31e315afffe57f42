"""target.compact_after: a load that leaves that many small files compacts them after its
commit (engine/load/upkeep.py), in a maintenance commit of its own that changes no row."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.delta_lake.maintenance import MAINTENANCE_KEY, small_files
from incremental_assets.engine.errors import MaintenanceError
from incremental_assets.engine.landing import run_landing_load
from incremental_assets.engine.reload import differences
from incremental_assets.specs import TargetSpec
from incremental_assets_tests.builders import (
    DeltaSourceTable,
    at,
    day_request,
    drop,
    invoice,
    landing_spec,
    load,
    make_spec,
)


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
    for day in (2, 3, 4, 5):
        _day(source, day)
        results.append(load(spark, spec, target, day))
        load(spark, unset, plain, day)
        if results[-1].files_compacted:
            break
        # Below the threshold: counted (every file is small), not compacted.
        assert results[-1].small_files == _files(target) < 3
        assert results[-1].compaction_version is None
    done = results[-1]
    # Compacted by the first load that left 3 or more small files: all of them, into one
    # file, in the commit after the load's; the load's own commit is the one it reports.
    assert done.small_files >= 3
    assert (done.files_compacted, done.files_compacted_into) == (done.small_files, 1)
    assert done.compaction_version == done.delta_version + 1
    assert _files(target) == 1 < _files(plain)
    assert "compact" in done.phase_seconds
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


def test_a_compaction_that_fails_names_the_loads_committed_version(spark, tmp_path):
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

    with pytest.raises(MaintenanceError) as failed:
        load(spark, spec, target, 2, hook=lose_a_file)

    table = DeltaTable(target.path)
    loaded = table.history(1)[0]
    assert loaded["operation"] == "MERGE"
    assert f"the load committed Delta version {table.version()} (its rows and its cursor)" in (
        str(failed.value)
    )
    assert "compaction after it (target.compact_after) failed" in str(failed.value)
    assert "FileNotFound" in str(failed.value) or "FILE_NOT_FOUND" in str(failed.value)
    assert "restore it first" in (failed.value.fix or "")


def test_a_landing_load_compacts_the_files_its_runs_add(spark, tmp_path):
    # A landing table adds a file (or more) a run: with compact_after 2, the run that
    # makes it two compacts, and every file version stays loaded once.
    folder = tmp_path / "landing"
    folder.mkdir()
    spec = landing_spec(folder)
    spec = spec.model_copy(update={"target": TargetSpec.model_validate({"compact_after": 2})})
    bronze = DeltaTarget("invoices_bronze", str(tmp_path / "bronze"))
    drop(folder, "a.json", [invoice(1), invoice(2)])
    first = run_landing_load(spark, spec, bronze, day_request(1))
    assert (first.small_files, first.files_compacted) == (0, 0)
    drop(folder, "b.json", [invoice(3)])

    second = run_landing_load(spark, spec, bronze, day_request(1))

    assert second.rows_inserted == 1
    assert (second.small_files, second.files_compacted, second.files_compacted_into) == (2, 2, 1)
    assert second.compaction_version == second.delta_version + 1
    assert "compact" in second.phase_seconds
    table = DeltaTable(bronze.path)
    assert len(table.file_uris()) == 1
    numbers = table.to_pyarrow_table(columns=["InvoiceNumber"]).column(0).to_pylist()
    assert sorted(numbers) == ["INV1", "INV2", "INV3"]
    again = run_landing_load(spark, spec, bronze, day_request(1))
    assert (again.committed, again.small_files) == (False, None)


def _actions(rows: list[tuple[int, str | None]]) -> pa.Table:
    """Add actions as delta-rs flattens them: a size and a partition value a file."""
    sizes, days = zip(*rows, strict=True)
    return pa.table({"size_bytes": list(sizes), "partition.day": list(days)})


def test_small_files_are_counted_where_a_compaction_can_pack_them():
    actions = _actions(
        [(10, "a"), (20, "a"), (500, "a"), (10, "b"), (10, None), (30, None), (999, "c")]
    )

    # Two small in "a" (the 500-byte file is not small), two in the null partition; "b"
    # holds one: nothing to pack it with.
    assert small_files(actions, 100, ["day"]) == 4
    assert small_files(actions.slice(3, 1), 100, ["day"]) == 0
    # Unpartitioned: every small file counts once there are two.
    assert small_files(actions, 100, []) == 5
    assert small_files(actions.slice(0, 1), 100, []) == 0
    # A partition column the actions do not list: not counted, rather than miscounted.
    assert small_files(actions, 100, ["day", "hour"]) is None
