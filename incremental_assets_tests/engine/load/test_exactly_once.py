"""Exactly once under a real process kill: ``dagster asset materialize`` in a child process
is SIGKILLed at a named point of the load (``after_extract``; ``before_commit``, when a
hard-delete CDC table's tombstones are written but its merge is not; ``after_commit``),
then re-run, for an upsert table, for CDC tables with hard and with soft deletes, and for
an SCD2 history of the CDC feed (``before_commit``: its change log written, its merge not);
each point with the tables whose writes before it differ, and a first load killed before
the commit that creates its table (eight tests; each starts two Spark applications).

Each table is seeded with its first day in this process (the engine's load, and a Dagster
record of it), so every test starts only the child process it is about: the killed run (it
starts its own Spark; with the optimizing JIT compiler and 8 shuffle partitions a child took
43-48 s on 2 shared cores, with builders.CHILD_SPARK_CONF 26-27 s). The re-run is the same
asset materialized in this process, on the suite's Spark session, after freeing the pool
of the dead run as the project's executor does (dagster_layer/test_crashed_runs.py runs
that re-run as a CLI child): the recovery under test is the engine's, from the Delta log."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable

from incremental_assets.dagster_layer.assets import pool_name
from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.dagster_layer.pools import wait_for_pools
from incremental_assets.engine import DeltaTarget, LoadRequest, run_load
from incremental_assets.engine.faults import CRASH_ENV
from incremental_assets.engine.reload import differences
from incremental_assets.engine.watermarks import format_value
from incremental_assets.specs import TableSpec, load_project
from incremental_assets_tests.builders import (
    PROJECT_ROOT,
    DeltaSourceTable,
    ParquetFolder,
    at,
    feed,
    reference,
    scd2_reference,
    spark_section,
    staging_left,
    target_rows,
)

pytestmark = pytest.mark.slow

FIRST_DAY, CRASH_DAY = "2026-01-01", "2026-01-02"
# The suite session's own settings (conftest.py), for the re-runs made in this process.
SESSION_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.databricks.delta.snapshotPartitions": "2",
}

# --- the tables ------------------------------------------------------------------------


class UpsertOrders:
    """A mutable ``orders`` table (Delta) loaded by upsert on a timestamp watermark."""

    name = "orders"
    kind = "timestamp"
    yaml = """
  - name: orders
    source: {format: delta, path: ./source/orders}
    keys: [order_id]
    watermark: {column: updated_at, kind: timestamp, lookback: 30m}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
"""

    def __init__(self, root: Path):
        self.source = DeltaSourceTable(root / "source" / "orders")

    def deliver(self, day: int) -> None:
        if day == 1:
            self.source.upsert([(i, "placed", float(i), at(1, 1 + i % 20)) for i in range(1, 201)])
        else:  # 50 updates and 60 new orders, all stamped 2026-01-02 03:00-04:00
            self.source.upsert(
                [(i, "paid", float(i), at(2, 3)) for i in range(1, 51)]
                + [(i, "placed", float(i), at(2, 4)) for i in range(201, 261)]
            )

    def expected(self) -> list[tuple]:
        """The source table as it is: what the target must hold."""
        table = DeltaTable(self.source.path).to_pyarrow_table(columns=list(self.columns))
        return sorted(tuple(r[c] for c in self.columns) for r in table.to_pylist())

    columns = ("order_id", "status", "amount", "updated_at")

    def cursor(self) -> datetime:
        return max(r[3] for r in self.expected())


class CdcCustomers:
    """A ``customers`` change feed (Parquet files, I/U/D by LSN) with hard or soft deletes.

    Day 2, the day the tests crash, holds updates, deletes of loaded rows, re-inserts of
    rows deleted on day 1, keys deleted and re-inserted (or inserted and deleted) within
    the day, duplicated events and shuffled delivery; the reference is computed in plain
    Python from the full history (``builders.reference``)."""

    name = "customers"
    kind = "id"

    def __init__(self, root: Path, deletes: str):
        self.deletes = deletes
        self.yaml = f"""
  - name: customers
    source: {{format: parquet, path: ./source/customers}}
    keys: [id]
    watermark: {{column: lsn, kind: id, lookback: 0}}
    strategy: {{kind: cdc, deletes: {deletes}}}
    partitioning: {{granularity: daily, start: 2026-01-01, column: changed_at}}
"""
        self.columns = ("id", "name", "lsn") + (
            ("is_deleted", "deleted_at") if deletes == "soft" else ()
        )
        self.folder = ParquetFolder(root / "source" / "customers")
        self.days = change_history()
        self.delivered: list[tuple] = []
        self._rng = random.Random(11)

    def deliver(self, day: int) -> None:
        events = self.days[day - 1]
        batch = events + self._rng.sample(events, len(events) // 8)  # duplicated events
        if self.delivered:  # a few old events delivered again (below the cursor)
            batch += self._rng.sample(self.delivered, 5)
        self._rng.shuffle(batch)
        self.folder.drop(feed(*batch))
        self.delivered += events

    def expected(self) -> list[tuple]:
        return reference(self.delivered, self.deletes)

    def cursor(self) -> int:
        return max(e[3] for e in self.delivered)

    def deleted_on(self, day: int) -> dict[int, int]:
        """Keys whose newest change of ``day`` is a delete, with its LSN: tombstones a run
        of that day writes (hard deletes)."""
        newest: dict[int, tuple] = {}
        for event in self.days[day - 1]:
            newest[event[0]] = event
        return {k: e[3] for k, e in newest.items() if e[2] == "D"}


class CdcCustomerHistory(CdcCustomers):
    """The same feed kept as SCD2 history (strategy ``scd2`` of ``cdc`` changes): a version
    per tracked change, every change logged in ``<target>__changes`` before the commit;
    the reference is ``builders.scd2_reference`` of the full history."""

    def __init__(self, root: Path):
        super().__init__(root, "hard")
        self.yaml = self.yaml.replace("{kind: cdc, deletes: hard}", "{kind: scd2, changes: cdc}")
        self.columns = ("id", "name", "lsn", "valid_from", "valid_to", "is_current")

    def expected(self) -> list[tuple]:
        return scd2_reference(self.delivered)

    def identity(self, row: tuple) -> tuple:
        return (row[0], row[3])  # a version: its key and valid_from

    def deleted_on(self, day: int) -> dict[int, int]:
        return {}  # a delete closes a version; no tombstones


def change_history(seed: int = 1, keys: int = 40, per_day: int = 80) -> list[list[tuple]]:
    """Two days of changes with increasing LSNs: inserts, updates, deletes, re-inserts."""
    rng = random.Random(seed)
    alive: dict[int, bool] = {}
    days: list[list[tuple]] = [[], []]
    for day in (1, 2):
        for i in range(per_day):
            lsn = (day - 1) * per_day + i + 1
            key = rng.randint(1, keys)
            op = rng.choice("UUUD") if alive.get(key) else "I"
            alive[key] = op != "D"
            name = None if op == "D" else f"v{lsn}"
            days[day - 1].append((key, name, op, lsn, at(day, i * 24 / per_day)))
    _check_crash_day_covers_the_hard_cases(days)
    return days


def _check_crash_day_covers_the_hard_cases(days: list[list[tuple]]) -> None:
    alive_after_day_1: dict[int, bool] = {}
    for key, _, op, _, _ in days[0]:
        alive_after_day_1[key] = op != "D"
    ops: dict[int, str] = {}
    for key, _, op, _, _ in days[1]:
        ops[key] = ops.get(key, "") + op
    assert any(alive_after_day_1.get(k) and o.endswith("D") for k, o in ops.items())
    assert any(alive_after_day_1.get(k) is False and o.startswith("I") for k, o in ops.items())
    assert any("DI" in o for o in ops.values())
    assert any(k not in alive_after_day_1 and o.startswith("I") and o.endswith("D")
               for k, o in ops.items())  # fmt: skip


TABLES: dict[str, Callable[[Path], UpsertOrders | CdcCustomers]] = {
    "upsert": UpsertOrders,
    "cdc_hard": lambda root: CdcCustomers(root, "hard"),
    "cdc_soft": lambda root: CdcCustomers(root, "soft"),
    "scd2": CdcCustomerHistory,
}


# --- a project run by the CLI ----------------------------------------------------------


class ChildProject:
    """A project folder with its own tables.yaml and Dagster home, run by the CLI."""

    def __init__(self, root: Path, table: UpsertOrders | CdcCustomers):
        self.root = root
        self.table = table
        (root / "home").mkdir(parents=True)
        # The shipped instance configuration: pools of limit 1, run monitoring, so a killed
        # run's slot must be freed for the re-run to proceed.
        shutil.copy(PROJECT_ROOT / "dagster.yaml", root / "home" / "dagster.yaml")
        # The child runs' Spark: small settings, the quick JIT (builders.CHILD_SPARK_CONF).
        (root / "tables.yaml").write_text(
            f"warehouse:\n  root: ./warehouse\n{spark_section()}tables:{table.yaml}"
        )
        self.spec: TableSpec = load_project(root / "tables.yaml").tables[0]
        self.target = DeltaTarget(table.name, str(root / "warehouse" / table.name))
        self.first_day_rows: list[tuple] = []

    def seed(self, spark) -> None:
        """Load the first day in this process and record it in Dagster as the asset does
        (a materialization carrying the Delta version), so only the runs under test start
        a child."""
        self.table.deliver(1)
        request = LoadRequest(at(1), at(2), run_id="seed", partition_label=FIRST_DAY)
        result = run_load(spark, self.spec, self.target, request)
        assert result.committed
        with self.instance() as instance:
            instance.report_runless_asset_event(
                dg.AssetMaterialization(
                    self.table.name,
                    partition=FIRST_DAY,
                    metadata={"delta_version": result.delta_version},
                )
            )
        self.first_day_rows = self.rows()
        assert self.first_day_rows == self.table.expected()

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
            "--select", self.table.name, "--partition", partition,
        ]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if crash_at is None and done.returncode != 0:
            raise AssertionError(done.stdout[-3000:] + done.stderr[-3000:])
        return done.returncode

    def rerun_here(self, partition: str) -> dict[str, dg.AssetCheckEvaluation]:
        """Materialize ``partition`` again in this process: the same tables (a file beside
        the child's, with this session's settings), the same instance, the dead run's pool
        slot freed first (``dg.materialize`` runs Dagster's own executor). Returns the
        run's asset check evaluations, by name."""
        here = self.root / "here.yaml"
        here.write_text(
            f"warehouse:\n  root: ./warehouse\n{spark_section(SESSION_CONF)}"
            f"tables:{self.table.yaml}"
        )
        project = load_project(here)
        defs = build_definitions(project)
        with self.instance() as instance:
            wait_for_pools(instance, [pool_name(project.tables[0])], lambda text: None)
            result = dg.materialize(
                [defs.get_assets_def(self.table.name)],
                partition_key=partition,
                instance=instance,
                resources=defs.resources,
            )
        assert result.success
        return {e.check_name: e for e in result.get_asset_check_evaluations()}

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_config(str(self.root / "home"))

    def slot_holders(self) -> dict[str, str]:
        """The runs holding a pool slot, with their status."""
        with self.instance() as instance:
            storage = instance.event_log_storage
            held = {
                slot.run_id
                for pool in storage.get_concurrency_keys()
                for slot in storage.get_concurrency_info(pool).claimed_slots
            }
            return {run_id: instance.get_run_by_id(run_id).status.value for run_id in held}

    def assert_killed_run_held_its_slot(self) -> str:
        """The killed run still holds its table's slot (as the shipped dagster.yaml makes
        it); returns its id."""
        (holder, status), *others = self.slot_holders().items()
        assert (status, others) == ("STARTED", [])
        return holder

    def assert_rerun_freed(self, dead_run: str) -> None:
        assert self.slot_holders() == {}
        with self.instance() as instance:
            assert instance.get_run_by_id(dead_run).status == dg.DagsterRunStatus.FAILURE

    def materializations(self) -> list[dg.EventLogRecord]:
        with self.instance() as instance:
            key = dg.AssetKey(self.table.name)
            return list(instance.fetch_materializations(key, limit=100).records)

    def last_metadata(self) -> dict:
        return self.materializations()[0].asset_materialization.metadata

    def rows(self) -> list[tuple]:
        return target_rows(self.target, self.table.columns)

    def version(self) -> int:
        return DeltaTable(self.target.path).version()

    def logged_changes(self) -> int:
        path = f"{self.target.path}__changes"
        return DeltaTable(path).to_pyarrow_table().num_rows if DeltaTable.is_deltatable(path) else 0

    def tombstones(self) -> dict[int, int]:
        """Each tombstoned key's sequence (a key recorded twice fails)."""
        path = f"{self.target.path}__tombstones"
        if not DeltaTable.is_deltatable(path):
            return {}
        found = DeltaTable(path).to_pyarrow_table().to_pylist()
        assert len({r["id"] for r in found}) == len(found), "a key has two tombstones"
        return {r["id"]: r["lsn"] for r in found}


def counts(before: list[tuple], after: list[tuple], identity=lambda r: r[0]) -> tuple[int, ...]:
    """Rows inserted, updated and deleted going from ``before`` to ``after``."""
    old, new = {identity(r): r for r in before}, {identity(r): r for r in after}
    inserted = len(new.keys() - old.keys())
    deleted = len(old.keys() - new.keys())
    updated = sum(1 for k in new.keys() & old.keys() if new[k] != old[k])
    return inserted, updated, deleted


def assert_equals_reference(child: ChildProject, spark) -> None:
    """Same as a full reload of the source, and as the plain-Python reference; the cursor
    is the newest watermark of the source."""
    assert differences(spark, child.spec, child.target) == (0, 0)
    assert child.rows() == child.table.expected()
    assert child.target.state(child.table.kind).cursor == child.table.cursor()


@pytest.fixture
def child(request, tmp_path, spark) -> ChildProject:
    """A project whose table has its first day loaded and its second day waiting."""
    project = ChildProject(tmp_path, TABLES[request.param](tmp_path))
    project.seed(spark)
    project.table.deliver(2)
    return project


@pytest.fixture
def unloaded(request, tmp_path) -> ChildProject:
    """A project whose table was never loaded, its first day waiting."""
    project = ChildProject(tmp_path, TABLES[request.param](tmp_path))
    project.table.deliver(1)
    return project


@pytest.mark.parametrize(
    ("child", "point"),
    [
        # Nothing is written before the extract ends, whatever the strategy: one table
        # stands for all (upsert and soft-delete CDC were run here too until the suite
        # outgrew its time).
        ("cdc_hard", "after_extract"),
        # The tombstones are written, the target's merge is not: the re-run must apply
        # the deletes whose tombstones are already recorded.
        ("cdc_hard", "before_commit"),
        # The change log holds the day's changes, the history's merge is not done: the
        # re-run must find them logged, log none twice, and write the versions.
        ("scd2", "before_commit"),
    ],
    indirect=["child"],
)
def test_kill_before_the_delta_commit_commits_nothing_and_rerun_is_exact(child, point, spark):
    version, tombstones, logged = child.version(), child.tombstones(), child.logged_changes()
    recorded = {**tombstones, **child.table.deleted_on(2)}  # once the day is loaded

    code = child.materialize(CRASH_DAY, crash_at=point)

    assert code == -signal.SIGKILL
    assert child.version() == version
    if point == "before_commit" and isinstance(child.table, CdcCustomers):
        tombstones = {**tombstones, **child.table.deleted_on(2)}
    assert child.tombstones() == tombstones  # after_extract: not yet written
    assert len(child.materializations()) == 1
    dead_run = child.assert_killed_run_held_its_slot()
    staging_root = Path(f"{child.target.path}__staging")
    assert staging_left(staging_root)  # the killed run's folder, on the warehouse

    checks = child.rerun_here(CRASH_DAY)
    child.assert_rerun_freed(dead_run)
    # The re-run's own checks hold: an SCD2 re-run finds the day's events logged (none
    # new) and still writes their versions, which its reconciliation accounts for.
    assert "rows_reconciled" in checks
    assert {n: e.description for n, e in checks.items() if not e.passed} == {}
    assert staging_left(staging_root) == []  # removed by the next run
    # Each deleted key's tombstone once: a re-run merges those the killed run recorded.
    assert child.tombstones() == recorded
    assert_equals_reference(child, spark)
    last = child.last_metadata()
    reported = tuple(last[f"rows_{n}"].value for n in ("inserted", "updated", "deleted"))
    identity = getattr(child.table, "identity", lambda r: r[0])
    assert reported == counts(child.first_day_rows, child.table.expected(), identity)
    if isinstance(child.table, CdcCustomerHistory):  # every change logged exactly once
        assert child.logged_changes() == len(child.table.delivered)
        said = {k: v.value for k, v in checks["rows_reconciled"].metadata.items()}
        crash_day_events = child.logged_changes() - logged
        assert (said["events_new"], said["events_recovered"]) == (0, crash_day_events)


# Hard-delete CDC recovers through the same commit record as soft-delete CDC (its
# tombstones are tested killed before the commit, above); upsert writes nothing beside
# the target, SCD2 a change log.
@pytest.mark.parametrize("child", ["upsert", "cdc_soft", "scd2"], indirect=True)
def test_kill_after_delta_commit_before_dagster_records_it_is_recovered_on_rerun(child, spark):
    version = child.version()

    code = child.materialize(CRASH_DAY, crash_at="after_commit")

    assert code == -signal.SIGKILL
    assert child.version() == version + 1  # the data landed...
    assert len(child.materializations()) == 1  # ...but Dagster never heard of it
    assert child.target.state(child.table.kind).cursor == child.table.cursor()
    dead_run = child.assert_killed_run_held_its_slot()

    child.rerun_here(CRASH_DAY)
    child.assert_rerun_freed(dead_run)

    assert child.version() == version + 1  # nothing twice
    assert_equals_reference(child, spark)
    last = child.last_metadata()
    assert last["recovered_commits"].value == str(version + 1)
    assert last["watermark_after"].value == format_value(child.table.cursor())
    assert (last["rows_inserted"].value, last["rows_updated"].value) == (0, 0)
    assert last["rows_deleted"].value == 0


# A first load writes its rows once, as the table it creates, after what it records beside
# the table: a hard-delete CDC table's tombstones, found in the window's rows; an SCD2
# table's change log. Killed between the two, it leaves no table and those side tables.
@pytest.mark.parametrize("unloaded", ["cdc_hard", "scd2"], indirect=True)
def test_kill_before_a_first_loads_commit_leaves_no_table_and_rerun_is_exact(unloaded, spark):
    child = unloaded

    code = child.materialize(FIRST_DAY, crash_at="before_commit")

    assert code == -signal.SIGKILL
    assert not child.target.exists()
    recorded = (child.tombstones(), child.logged_changes())
    if isinstance(child.table, CdcCustomerHistory):
        assert recorded == ({}, len(child.table.delivered))  # every event, once
    else:  # every key whose last change of the day deletes it (and those deleted, then
        # inserted again)
        assert child.table.deleted_on(1)
        assert child.table.deleted_on(1).items() <= recorded[0].items()
        assert recorded[1] == 0
    dead_run = child.assert_killed_run_held_its_slot()

    checks = child.rerun_here(FIRST_DAY)
    child.assert_rerun_freed(dead_run)

    assert {n: e.description for n, e in checks.items() if not e.passed} == {}
    assert_equals_reference(child, spark)
    assert (child.tombstones(), child.logged_changes()) == recorded  # nothing twice
    assert child.version() == 0  # the table, created once
