"""Exactly once under a real process kill: ``dagster asset materialize`` in a child process
is SIGKILLed at a named point of the load, then re-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.faults import CRASH_ENV
from incremental_assets.engine.reload import differences
from incremental_assets.specs import load_project
from incremental_assets_tests.conftest import DeltaSourceTable, at, target_rows

pytestmark = pytest.mark.slow

TABLES_YAML = """
warehouse:
  root: ./warehouse
tables:
  - name: orders
    source: {format: delta, path: ./source/orders}
    keys: [order_id]
    watermark: {column: updated_at, kind: timestamp, lookback: 30m}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
"""


class ChildProject:
    """A project folder with its own tables.yaml and Dagster home, run by the CLI."""

    def __init__(self, root: Path):
        self.root = root
        (root / "home").mkdir(parents=True)
        (root / "tables.yaml").write_text(TABLES_YAML)
        self.spec = load_project(root / "tables.yaml").tables[0]
        self.source = DeltaSourceTable(root / "source" / "orders")
        self.target = DeltaTarget("orders", str(root / "warehouse" / "orders"))

    def materialize(self, partition: str, crash_at: str | None = None) -> int:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(self.root / "home"),
            "INCREMENTAL_ASSETS_TABLES": str(self.root / "tables.yaml"),
            "INCREMENTAL_ASSETS_DRIVER_MEMORY": "1g",
        }
        env.pop(CRASH_ENV, None)
        if crash_at:
            env[CRASH_ENV] = crash_at
        command = [
            sys.executable, "-m", "dagster", "asset", "materialize",
            "-m", "incremental_assets.definitions",
            "--select", "orders", "--partition", partition,
        ]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        if crash_at is None and done.returncode != 0:
            raise AssertionError(done.stdout[-3000:] + done.stderr[-3000:])
        return done.returncode

    def materializations(self) -> list[dg.EventLogRecord]:
        with dg.DagsterInstance.from_config(str(self.root / "home")) as instance:
            records = instance.fetch_materializations(dg.AssetKey("orders"), limit=100).records
            return list(records)


@pytest.fixture
def child(tmp_path, spark) -> ChildProject:
    project = ChildProject(tmp_path)
    project.source.upsert([(i, "placed", float(i), at(1, 1 + i % 20)) for i in range(1, 201)])
    assert project.materialize("2026-01-01") == 0
    project.source.upsert(
        [(i, "paid", float(i), at(2, 3)) for i in range(1, 51)]
        + [(i, "placed", float(i), at(2, 4)) for i in range(201, 261)]
    )
    return project


def test_kill_after_extraction_commits_nothing_and_rerun_is_exact(child, spark):
    version = DeltaTable(child.target.path).version()

    code = child.materialize("2026-01-02", crash_at="after_extract")

    assert code == -signal.SIGKILL
    assert DeltaTable(child.target.path).version() == version
    assert len(child.materializations()) == 1

    assert child.materialize("2026-01-02") == 0
    assert differences(spark, child.spec, child.target) == (0, 0)
    assert len(target_rows(child.target)) == 260
    assert child.target.state("timestamp").cursor == at(2, 4)
    last = child.materializations()[0].asset_materialization.metadata
    assert (last["rows_inserted"].value, last["rows_updated"].value) == (60, 50)


def test_kill_after_delta_commit_before_dagster_records_it_is_recovered_on_rerun(child, spark):
    version = DeltaTable(child.target.path).version()

    code = child.materialize("2026-01-02", crash_at="after_commit")

    assert code == -signal.SIGKILL
    assert DeltaTable(child.target.path).version() == version + 1  # the data landed...
    assert len(child.materializations()) == 1  # ...but Dagster never heard of it
    assert child.target.state("timestamp").cursor == at(2, 4)

    assert child.materialize("2026-01-02") == 0

    assert DeltaTable(child.target.path).version() == version + 1  # nothing twice
    assert differences(spark, child.spec, child.target) == (0, 0)
    assert len(target_rows(child.target)) == 260
    last = child.materializations()[0].asset_materialization.metadata
    assert last["recovered_commits"].value == str(version + 1)
    assert last["watermark_after"].value == "2026-01-02T04:00:00Z"
    assert (last["rows_inserted"].value, last["rows_updated"].value) == (0, 0)
