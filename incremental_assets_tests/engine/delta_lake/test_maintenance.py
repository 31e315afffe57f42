"""Delta maintenance: compaction and vacuum through delta-rs, and the Dagster job that runs
them per table. Real Delta tables in temp folders; loads through the engine."""

from __future__ import annotations

import os

import dagster as dg
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.engine import DeltaTarget, checks
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.maintenance import (
    MaintenanceSettings,
    maintain,
    maintain_table,
    target_file_bytes,
)
from incremental_assets.engine.delta_lake.store import ROWS_PER_FILE
from incremental_assets.engine.errors import MaintenanceError
from incremental_assets.specs import load_project
from incremental_assets_tests.builders import at, load, make_spec

ALL_COLUMNS = ("order_id", "status", "amount", "updated_at", "_ia_row_hash")


def rows(table: DeltaTable) -> list[tuple]:
    data = table.to_pyarrow_table(columns=list(ALL_COLUMNS)).to_pylist()
    return sorted(tuple(r[c] for c in ALL_COLUMNS) for r in data)


def on_storage(target: DeltaTarget) -> set[str]:
    return {
        os.path.join(folder, name)
        for folder, _, names in os.walk(target.path)
        if "_delta_log" not in folder
        for name in names
        if name.endswith(".parquet")
    }


@pytest.fixture
def loaded(spark, orders_source, target):
    """An orders table after three loads: small files, one replaced by an update."""
    spec = make_spec(orders_source.path)
    orders_source.upsert([(i, "placed", 1.0, at(1, 1)) for i in range(1, 31)])
    load(spark, spec, target, 1)
    orders_source.upsert([(i, "paid", 1.0, at(1, 2)) for i in range(1, 11)])
    load(spark, spec, target, 1)
    orders_source.upsert([(i, "placed", 2.0, at(1, 3)) for i in range(31, 61)])
    load(spark, spec, target, 1)
    return spec, target


@pytest.fixture
def churned(tmp_path) -> DeltaTarget:
    """A table written by delta-rs alone: four appends, then a delete that replaces a file."""
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    for i in range(4):
        batch = {c: [None, None] for c in ALL_COLUMNS}
        batch["order_id"] = [2 * i, 2 * i + 1]
        write_deltalake(target.path, pa.table(batch).cast(_SCHEMA), mode="append")
    DeltaTable(target.path).delete("order_id = 0")
    return target


_SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("status", pa.string()),
        ("amount", pa.float64()),
        ("updated_at", pa.timestamp("us", tz="UTC")),
        ("_ia_row_hash", pa.int64()),
    ]
)


def test_compaction_leaves_contents_cursor_and_last_load_identical(spark, loaded):
    spec, target = loaded
    before = DeltaTable(target.path)
    state = target.state("timestamp")
    # Compaction aims for files of ROWS_PER_FILE rows at the table's bytes per row.
    files = delta_io.live_files(before)
    per_row = sum(files.column("size_bytes").to_pylist()) / sum(
        files.column("num_records").to_pylist()
    )
    assert target_file_bytes(before) == int(per_row * ROWS_PER_FILE)

    result = maintain(spark, target, MaintenanceSettings(retention_hours=None))

    after = DeltaTable(target.path)
    assert result.files_before == len(before.file_uris()) > result.files_after == 1
    assert (result.files_compacted, result.files_written) == (result.files_before, 1)
    assert rows(after) == rows(before)
    assert after.version() == before.version() + 1
    # The maintenance commit is neither a load nor a cursor move.
    assert target.state("timestamp").cursor == state.cursor
    assert target.last_load(after)["version"] == state.last_load["version"]
    assert checks.watermark_monotonic(target, "timestamp").passed
    assert checks.keys_unique(spark, target, spec.keys).passed
    # The next run continues from the same cursor and finds nothing to write.
    assert not load(spark, spec, target, 1).committed


def test_vacuum_keeps_what_the_snapshot_and_the_retention_window_need(spark, churned):
    target = churned
    maintain(spark, target, MaintenanceSettings(retention_hours=None))
    compacted = DeltaTable(target.path)
    versions = {v: rows(DeltaTable(target.path, version=v)) for v in range(compacted.version())}
    stored = on_storage(target)

    # Inside the retention window (a week): every file stays, every version is readable.
    within = maintain(spark, target, MaintenanceSettings(compact=False, retention_hours=168))

    assert within.files_vacuumed == 0 and on_storage(target) == stored
    assert within.version_after == compacted.version()  # nothing to do, no commit
    for version, expected in versions.items():
        assert rows(DeltaTable(target.path, version=version)) == expected

    # A retention of zero deletes the removed files, and only those.
    gone = maintain(
        spark,
        target,
        MaintenanceSettings(compact=False, retention_hours=0, enforce_retention=False),
    )

    live = set(DeltaTable(target.path).file_uris())
    assert gone.files_vacuumed == gone.stale_files_before == len(stored - live) > 0
    assert gone.stale_files_after == 0
    assert on_storage(target) == live
    assert rows(DeltaTable(target.path)) == rows(compacted)


def test_vacuum_refuses_a_retention_below_the_tables_minimum(spark, churned):
    target = churned
    version = DeltaTable(target.path).version()

    with pytest.raises(MaintenanceError, match=r"shorter than the table's minimum of 168 hours"):
        maintain(spark, target, MaintenanceSettings(compact=False, retention_hours=1))

    assert DeltaTable(target.path).version() == version


def test_side_tables_are_maintained_with_their_table(spark, tmp_path):
    target = DeltaTarget("customers", str(tmp_path / "customers"))
    for i in range(3):
        write_deltalake(target.path, pa.table({"id": [i]}), mode="append")
        write_deltalake(f"{target.path}__tombstones", pa.table({"id": [i]}), mode="append")

    results = maintain_table(spark, target, MaintenanceSettings(retention_hours=None))

    assert [(r.table, r.files_before, r.files_after) for r in results] == [
        ("customers", 3, 1),
        ("customers__tombstones", 3, 1),
    ]
    assert (
        maintain_table(spark, DeltaTarget("none", str(tmp_path / "none")), MaintenanceSettings())
        == []
    )


TABLES_YAML = """
warehouse:
  root: ./warehouse
tables:
  - name: orders
    source: {format: delta, path: ./source/orders}
    keys: [order_id]
    watermark: {column: updated_at, kind: timestamp}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
"""


def test_maintenance_job_reports_files_before_and_after_per_table(spark, tmp_path):
    (tmp_path / "tables.yaml").write_text(TABLES_YAML)
    project = load_project(tmp_path / "tables.yaml")
    defs = build_definitions(project)
    target = DeltaTarget("orders", project.target_path(project.tables[0]))
    for i in range(3):
        write_deltalake(target.path, pa.table({"order_id": [i]}), mode="append")

    with dg.instance_for_test() as instance:
        result = defs.get_job_def("maintain_tables").execute_in_process(instance=instance)
        observations = instance.fetch_observations(dg.AssetKey("orders"), limit=1).records

    assert result.success
    meta = {k: v.value for k, v in observations[0].asset_observation.metadata.items()}
    assert (meta["files_before"], meta["files_after"], meta["files_compacted"]) == (3, 1, 3)
    schedule = defs.resolve_schedule_def("maintain_tables_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
