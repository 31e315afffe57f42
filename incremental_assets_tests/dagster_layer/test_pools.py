"""A database's concurrency pool across parallel runs: two runs, each loading a different
table of one PostgreSQL connection, against one Dagster instance configured by the
project's own dagster.yaml (``pools: default_limit: 1``).

One run executes in the test process; while its step holds its slot of ``jdbc_shop`` (held
at a gate in front of the load), it launches the other run as a separate process,
``dagster asset materialize``, as a second run worker would. The order is forced, not left
to timing: at the default limit the second run's step must queue for the slot and stay
queued while the first is held; with the limit raised (``dagster instance concurrency set
jdbc_shop 2``) the second run must start, load and finish while the first still holds its
slot.

(Two runs in two threads of one process are not an option: Dagster reconfigures Python
logging when a run starts, which deadlocks against a run logging in another thread.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable

from incremental_assets.dagster_layer import assets as assets_module
from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.specs import load_project
from incremental_assets_tests.builders import CHILD_SPARK_CONF, PROJECT_ROOT, spark_section
from incremental_assets_tests.postgres import JDBC_JAR, PostgresServer, start_or_skip, wait_until

pytestmark = pytest.mark.slow

PASSWORD = "pool-Loader-pw-42"
PASSWORD_ENV = "IA_TEST_POOL_PASSWORD"
POOL = "jdbc_shop"
PARTITION = "2026-01-01"
TABLES_YAML = """
warehouse:
  root: ./warehouse
connections:
  shop:
    url: {url}
    driver: org.postgresql.Driver
    user: loader
    password_env: IA_TEST_POOL_PASSWORD
{spark}tables:
  - name: orders
    source: {{format: jdbc, connection: shop, table: public.orders}}
    keys: [id]
    watermark: {{column: updated_at, kind: timestamp}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
  - name: customers
    source: {{format: jdbc, connection: shop, table: public.customers}}
    keys: [id]
    watermark: {{column: updated_at, kind: timestamp}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
"""


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = start_or_skip(log_statements=False)
    server.create_user("loader", PASSWORD)
    server.create_database("pools")
    server.sql(
        "CREATE TABLE orders (id bigint PRIMARY KEY, updated_at timestamptz); "
        "CREATE TABLE customers (id bigint PRIMARY KEY, updated_at timestamptz); "
        "INSERT INTO orders SELECT i, '2026-01-01 00:00+00'::timestamptz + i * interval '1h' "
        "FROM generate_series(1, 5) i; "
        "INSERT INTO customers SELECT i, '2026-01-01 00:30+00'::timestamptz + i * interval '1h' "
        "FROM generate_series(1, 5) i; "
        'GRANT SELECT ON orders, customers TO "loader";',
        database="pools",
    )
    yield server
    server.close()


class PoolProject:
    """A project folder on the test database that is also the Dagster home, with a copy of
    the project's dagster.yaml."""

    def __init__(self, root: Path, pg: PostgresServer):
        self.root = root
        shutil.copy(PROJECT_ROOT / "dagster.yaml", root / "dagster.yaml")
        self.tables = root / "tables.yaml"
        # The JDBC driver, and for the child run's Spark small settings and the quick JIT.
        spark = spark_section({"spark.jars": JDBC_JAR, **CHILD_SPARK_CONF})
        self.tables.write_text(TABLES_YAML.format(url=pg.jdbc_url("pools"), spark=spark))
        self.defs = build_definitions(load_project(self.tables))
        self.child: subprocess.Popen | None = None
        self.hold_outcome: str | Exception | None = None
        with self.instance():  # create the storage now, not in two processes at once
            pass

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_config(str(self.root))

    def hold_loads(self, monkeypatch, hold: Callable[[], None]) -> None:
        """Run ``hold`` inside this process's step, after it claimed its pool slot and
        before it reads the database: once, and never failing the step (a failure would
        be retried by the connection's retry policy and hold again)."""
        real_run_load = assets_module.run_load

        def held_run_load(*args, **kwargs):
            if self.hold_outcome is None:
                self.hold_outcome = "held"
                try:
                    hold()
                except Exception as exc:
                    self.hold_outcome = exc
            return real_run_load(*args, **kwargs)

        monkeypatch.setattr(assets_module, "run_load", held_run_load)

    def materialize_here(self, name: str) -> dg.ExecuteInProcessResult:
        with self.instance() as instance:
            return dg.materialize(
                [self.defs.get_assets_def(name)],
                partition_key=PARTITION,
                instance=instance,
                resources=self.defs.resources,
            )

    def launch(self, name: str) -> subprocess.Popen:
        """``dagster asset materialize`` of ``name`` in a child process (its own Spark)."""
        env = {
            **os.environ,
            "DAGSTER_HOME": str(self.root),
            "INCREMENTAL_ASSETS_TABLES": str(self.tables),
            "INCREMENTAL_ASSETS_DRIVER_MEMORY": "1g",
        }
        command = [
            sys.executable, "-m", "dagster", "asset", "materialize",
            "-m", "incremental_assets.definitions", "--select", name, "--partition", PARTITION,
        ]  # fmt: skip
        assert self.child is None, "one child run per test"
        with (self.root / "child.log").open("w") as log:
            self.child = subprocess.Popen(
                command, env=env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT
            )
        return self.child

    def child_log(self, tail: int | None = 4000) -> str:
        text = (self.root / "child.log").read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def pool(self):
        """The pool's slots, claims and queued steps (a ConcurrencyKeyInfo)."""
        with self.instance() as instance:
            return instance.event_log_storage.get_concurrency_info(POOL)

    def step_times(self, run_id: str) -> tuple[float, float | None]:
        """When the run's step started and succeeded (None: not yet), from the event log."""
        with self.instance() as instance:
            times = {
                e.dagster_event.event_type_value: e.timestamp
                for e in instance.all_logs(run_id)
                if e.dagster_event is not None
            }
        return times.get("STEP_START", float("nan")), times.get("STEP_SUCCESS")

    def loaded(self) -> dict[str, int]:
        """Rows in each table's Delta target."""
        return {
            name: DeltaTable(str(self.root / "warehouse" / name)).to_pyarrow_table().num_rows
            for name in ("orders", "customers")
        }

    def child_run_id(self, ours: str) -> str:
        with self.instance() as instance:
            (run,) = [r for r in instance.get_runs() if r.run_id != ours]
            return run.run_id


@pytest.fixture
def project(tmp_path, postgres, monkeypatch, spark) -> Iterator[PoolProject]:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    project = PoolProject(tmp_path, postgres)
    yield project
    if project.child is not None and project.child.poll() is None:
        project.child.kill()
        project.child.wait()


def test_a_run_on_the_same_database_waits_for_the_pool_at_the_default_limit(project, monkeypatch):
    seen: dict[str, Any] = {}

    def hold() -> None:
        # This step holds the pool's only slot; now the other run starts.
        child = project.launch("customers")
        seen["queued"] = wait_until(
            lambda: "Waiting for pool" in project.child_log(None) or child.poll() is not None,
            timeout=180,
            interval=0.2,
        )
        seen["pool"] = project.pool()
        time.sleep(2.5)  # longer than the waiting run's poll of the pool (2 s)
        seen["pool_later"] = project.pool()
        seen["child_running"] = child.poll() is None

    project.hold_loads(monkeypatch, hold)

    ours = project.materialize_here("orders")

    assert ours.success and project.hold_outcome == "held", project.hold_outcome
    child = project.child
    assert child is not None and child.wait(timeout=180) == 0, project.child_log()
    assert seen["queued"] and seen["child_running"], (
        "the other run was not held back by the pool:\n" + project.child_log()
    )
    other = project.child_run_id(ours.run_id)
    for pool in (seen["pool"], seen["pool_later"]):
        assert (pool.slot_count, pool.using_default_limit) == (1, True)  # dagster.yaml's
        assert [(s.run_id, s.step_key) for s in pool.claimed_slots] == [(ours.run_id, "orders")]
    # The other run said whom it waited for, and how to free the slot were that run dead.
    log = project.child_log(None)
    assert f"Waiting for pool {POOL}, held by run {ours.run_id}" in log
    assert f"incremental-assets free-slots {ours.run_id}" in log
    our_start, our_end = project.step_times(ours.run_id)
    other_start, other_end = project.step_times(other)
    assert our_end is not None and other_end is not None
    assert our_start < our_end <= other_start < other_end  # one after the other
    assert project.pool().claimed_slots == []
    assert project.loaded() == {"orders": 5, "customers": 5}


def test_a_run_on_the_same_database_loads_at_once_when_the_pool_limit_is_two(project, monkeypatch):
    with project.instance() as instance:  # dagster instance concurrency set jdbc_shop 2
        instance.event_log_storage.set_concurrency_slots(POOL, 2)
    seen: dict[str, Any] = {}

    def hold() -> None:
        # This step holds one of two slots; the other run must get the second and finish.
        child = project.launch("customers")
        seen["both_claimed"] = False

        def both_claimed_or_child_done() -> bool:
            if len(project.pool().claimed_slots) == 2:
                seen["both_claimed"] = True
            return seen["both_claimed"] or child.poll() is not None

        wait_until(both_claimed_or_child_done, timeout=180, interval=0.2)
        try:
            seen["child_exit"] = child.wait(timeout=180)
        except subprocess.TimeoutExpired:
            seen["child_exit"] = "still waiting after 180 s"

    project.hold_loads(monkeypatch, hold)

    ours = project.materialize_here("orders")

    assert ours.success and project.hold_outcome == "held", project.hold_outcome
    assert seen["child_exit"] == 0, project.child_log()  # finished while we held our slot
    assert seen["both_claimed"]
    other = project.child_run_id(ours.run_id)
    our_start, our_end = project.step_times(ours.run_id)
    other_start, other_end = project.step_times(other)
    assert our_end is not None and other_end is not None
    assert our_start < other_start < other_end < our_end  # the other run inside ours
    assert project.pool().slot_count == 2
    assert project.loaded() == {"orders": 5, "customers": 5}
