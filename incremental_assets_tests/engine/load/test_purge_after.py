"""target.purge_after: a load after which the table's deletion vectors mark at least that
share of its rows deleted purges them after its commit (engine/load/upkeep.py), in a
maintenance commit of its own that changes no row. Real Spark, real Delta tables."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake import maintenance
from incremental_assets.engine.delta_lake.maintenance import MAINTENANCE_KEY
from incremental_assets.engine.errors import MaintenanceError
from incremental_assets.engine.reload import differences
from incremental_assets_tests.builders import DeltaSourceTable, at, load, make_spec

DV = {"deletion_vectors": True, "purge_after": 0.05}


def _update(source: DeltaSourceTable, day: int, ids: range) -> None:
    source.upsert([(n, "paid", float(n), at(day, 10)) for n in ids])


def _deleted(target: DeltaTarget) -> int:
    return delta_io.rows_deleted_by_vectors(DeltaTable(target.path))


def test_a_load_leaving_enough_rows_deleted_by_vectors_purges_them(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    spec = make_spec(source.path, watermark={"lookback": "0s"}, target=DV)
    target = DeltaTarget("orders", str(tmp_path / "target"))
    source.upsert([(n, "placed", float(n), at(1, 5)) for n in range(1, 101)])
    first = load(spark, spec, target, 1)
    # Nothing deleted yet: counted, nothing purged.
    assert (first.deleted_share, first.files_purged, first.purge_version) == (0.0, 0, None)

    _update(source, 2, range(1, 4))
    below = load(spark, spec, target, 2)
    # 3 rows marked deleted of 103 the log counts (the 3 updates written anew): under 5%.
    assert below.rows_updated == 3
    assert below.deleted_share == pytest.approx(3 / 103)
    assert (below.files_purged, below.purge_version) == (0, None)
    assert _deleted(target) == 3

    _update(source, 3, range(10, 15))
    done = load(spark, spec, target, 3)

    # 8 of 108: the purge rewrote the files carrying vectors, in the commit after the
    # load's, tagged as maintenance; the load's own commit is the one it reports.
    assert done.rows_updated == 5
    assert done.deleted_share == pytest.approx(8 / 108)
    assert done.files_purged >= 1
    assert done.purge_version == done.delta_version + 1
    assert "compact" in done.phase_seconds
    assert _deleted(target) == 0
    history = {c["version"]: c for c in DeltaTable(target.path).history()}
    assert json.loads(history[done.purge_version]["userMetadata"]) == {MAINTENANCE_KEY: "purge"}
    assert history[done.delta_version]["operation"] == "MERGE"
    assert differences(spark, spec, target) == (0, 0)

    # The next load goes on from the cursor the purged load committed; a re-run of it
    # writes nothing more.
    _update(source, 4, range(20, 22))
    after = load(spark, spec, target, 4)
    assert after.cursor_before == done.cursor_after
    assert (after.rows_updated, after.files_purged) == (2, 0)
    assert after.deleted_share == pytest.approx(2 / 102)
    again = load(spark, spec, target, 4)
    assert (again.committed, again.rows_updated) == (False, 0)
    assert differences(spark, spec, target) == (0, 0)


def test_a_table_without_deletion_vectors_has_nothing_to_purge(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    spec = make_spec(source.path, target={"purge_after": 0.01})
    target = DeltaTarget("orders", str(tmp_path / "target"))
    source.upsert([(n, "placed", float(n), at(1, 5)) for n in range(1, 21)])
    load(spark, spec, target, 1)
    _update(source, 2, range(1, 11))

    result = load(spark, spec, target, 2)

    assert result.rows_updated == 10
    assert (result.deleted_share, result.files_purged, result.purge_version) == (0.0, 0, None)
    assert DeltaTable(target.path).history(1)[0]["operation"] == "MERGE"


def test_a_purge_that_fails_names_the_loads_committed_version(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    spec = make_spec(source.path, watermark={"lookback": "0s"}, target=DV)
    target = DeltaTarget("orders", str(tmp_path / "target"))
    source.upsert([(n, "placed", float(n), at(1, 5)) for n in range(1, 11)])
    load(spark, spec, target, 1)
    _update(source, 2, range(1, 4))

    def lose_a_file(phase: str) -> None:
        # The files the load's vectors mark rows of gone from storage (someone's clean-up)
        # between the load's commit and its purge, which must rewrite them.
        if phase == "committed":
            vectors = pa.table(DeltaTable(target.path).deletion_vectors())
            assert vectors.num_rows
            for uri in vectors.column("filepath").to_pylist():
                Path(unquote(urlparse(uri).path)).unlink()

    with pytest.raises(MaintenanceError) as failed:
        load(spark, spec, target, 2, hook=lose_a_file)

    table = DeltaTable(target.path)
    assert table.history(1)[0]["operation"] == "MERGE"
    said = str(failed.value)
    assert f"the load committed Delta version {table.version()} (its rows and its cursor)" in said
    assert "purge of its deletion vectors after it (target.purge_after) failed" in said
    assert "FileNotFound" in said or "FILE_NOT_FOUND" in said
    assert "restore it first" in (failed.value.fix or "")


def test_a_share_the_log_cannot_count_is_not_judged_and_nothing_is_purged(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    spec = make_spec(
        source.path,
        watermark={"lookback": "0s"},
        target={"deletion_vectors": True, "purge_after": 0.5},
    )
    target = DeltaTarget("orders", str(tmp_path / "target"))
    source.upsert([(n, "placed", float(n), at(1, 5)) for n in range(1, 11)])
    load(spark, spec, target, 1)
    _update(source, 2, range(1, 4))
    assert load(spark, spec, target, 2).deleted_share == pytest.approx(3 / 13)
    # A writer that records no row counts in its statistics (Delta makes them optional,
    # but for files that carry a vector): the other add actions lose ``numRecords``.
    for log in sorted(Path(target.path, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in log.read_text().splitlines() if line]
        for action in actions:
            add = action.get("add") or {}
            if add.get("stats") and not add.get("deletionVector"):
                stats = json.loads(add["stats"])
                stats.pop("numRecords", None)
                add["stats"] = json.dumps(stats)
        log.write_text("".join(json.dumps(a) + "\n" for a in actions))
    version = DeltaTable(target.path).version()

    purge = maintenance.purge_if_due(spark, target, 0.01)

    # 3 rows are marked deleted, but of how many the log does not say: no share, no purge.
    assert (purge.deleted_share, purge.files_purged, purge.version) == (None, 0, None)
    assert DeltaTable(target.path).version() == version
    assert _deleted(target) == 3
