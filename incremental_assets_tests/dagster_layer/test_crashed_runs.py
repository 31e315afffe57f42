"""A run that dies holding its table's pool slot never blocks the table (defs/pools.py).

Real runs of ``dagster asset materialize``, as separate processes, on an instance made from
the project's own dagster.yaml (pool limit 1, run monitoring, the project's run launcher).
A run holds its pool's slot inside its step; it is killed with SIGKILL there, as an
out-of-memory kill would; then the next run of that pool must go through by itself, the
daemon's run monitoring must mark the dead run failed and free its slot, and a live
holder must be waited for with a warning, without burning CPU, until SIGTERM stops it.
No Spark: the steps only hold the slot (the load steps tag their runs the same way).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._daemon.monitoring.concurrency import execute_concurrency_slots_iteration
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from incremental_assets.cli import main as cli
from incremental_assets.dagster_layer.pools import WORKER_TAG
from incremental_assets_tests.builders import PROJECT_ROOT

POOL = "incremental_assets_orders"

DEFS = f'''
import os, time
import dagster as dg
from incremental_assets.dagster_layer.pools import mark_worker, pool_aware_executor

@dg.asset(pool="{POOL}")
def holds(context):
    mark_worker(context)
    open(os.environ["HOLDING_FLAG"], "w").close()
    time.sleep(600)

@dg.asset(pool="{POOL}")
def quick(context):
    mark_worker(context)

defs = dg.Definitions(assets=[holds, quick], executor=pool_aware_executor)
'''


class Home:
    """A Dagster home with the project's dagster.yaml, and runs of DEFS in it."""

    def __init__(self, root: Path):
        self.root = root
        (root / "home").mkdir()
        shutil.copy(PROJECT_ROOT / "dagster.yaml", root / "home" / "dagster.yaml")
        (root / "defs.py").write_text(DEFS)
        self.flag = root / "holding"
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(root / "home"),
            "HOLDING_FLAG": str(self.flag),
            "PYTHONUNBUFFERED": "1",
        }

    def start(self, asset: str) -> subprocess.Popen:
        command = [
            sys.executable, "-m", "dagster", "asset", "materialize",
            "-f", str(self.root / "defs.py"), "--select", asset,
        ]  # fmt: skip
        return subprocess.Popen(
            command,
            env=self.env,
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def holding_run(self) -> subprocess.Popen:
        """A run of ``holds``, inside its step with the pool's slot claimed."""
        process = self.start("holds")
        deadline = time.monotonic() + 120
        while not self.flag.exists():
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "the holding run never reached its step"
            time.sleep(0.2)
        return process

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_config(str(self.root / "home"))

    def holders(self) -> set[str]:
        with self.instance() as instance:
            info = instance.event_log_storage.get_concurrency_info(POOL)
            return {slot.run_id for slot in info.claimed_slots}

    def run_of(self, asset: str) -> dg.DagsterRun:
        with self.instance() as instance:
            runs = [r for r in instance.get_runs() if asset in str(r.asset_selection)]
            assert len(runs) == 1, runs
            return runs[0]


def killed(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


@pytest.fixture
def home(tmp_path) -> Home:
    return Home(tmp_path)


def test_a_run_killed_holding_its_slot_is_freed_by_the_next_run(home):
    killed(home.holding_run())
    dead = home.run_of("holds")
    assert dead.status == dg.DagsterRunStatus.STARTED  # nobody told Dagster
    assert home.holders() == {dead.run_id}  # and the slot is still taken

    started = time.monotonic()
    rerun = home.start("quick")
    out, _ = rerun.communicate(timeout=180)

    assert rerun.returncode == 0, out
    assert time.monotonic() - started < 120
    assert f"Freed pool {POOL} from run {dead.run_id}" in out
    assert home.run_of("holds").status == dg.DagsterRunStatus.FAILURE
    assert home.run_of("quick").status == dg.DagsterRunStatus.SUCCESS
    assert home.holders() == set()


def test_the_daemons_run_monitoring_fails_a_dead_run_and_frees_its_slot(home):
    killed(home.holding_run())
    dead = home.run_of("holds")
    assert home.holders() == {dead.run_id}

    with home.instance() as instance:
        # One pass of each daemon loop, as `dagster dev` runs them every poll interval.
        record = instance.get_run_record_by_id(dead.run_id)
        monitor_started_run(instance, None, record, logging.getLogger("test"))
        assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
        after = instance.run_monitoring_settings["free_slots_after_run_end_seconds"]
        time.sleep(after + 1)
        context = _DaemonContext(instance)
        list(execute_concurrency_slots_iteration(context, logging.getLogger("test")))
    assert home.holders() == set()


def test_a_live_holder_is_waited_for_with_a_warning_until_sigterm(home):
    holder = home.holding_run()
    try:
        run = home.run_of("holds")
        waiting = home.start("quick")
        out = _read_until(waiting, "Waiting for pool", timeout=120)
        assert f"held by run {run.run_id}" in out
        assert f"incremental-assets free-slots {run.run_id}" in out
        # The wait sleeps: a few seconds of it cost the waiting process little CPU.
        cpu = _cpu_seconds(waiting.pid)
        time.sleep(5)
        assert _cpu_seconds(waiting.pid) - cpu < 1.0
        os.killpg(waiting.pid, signal.SIGTERM)
        waiting.wait(timeout=30)
        assert waiting.returncode != 0
        assert home.holders() == {run.run_id}  # the live holder keeps its slot
    finally:
        killed(holder)


def test_free_slots_refuses_a_live_worker_and_frees_a_dead_one(home, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(home.root / "home"))
    holder = home.holding_run()
    run = home.run_of("holds")
    try:
        assert cli(["free-slots", run.run_id]) == 1
        assert "still running on this host" in capsys.readouterr().err
        assert home.holders() == {run.run_id}
    finally:
        killed(holder)
    assert cli(["free-slots", run.run_id]) == 0
    assert f"1 slot(s) of pool {POOL} freed" in capsys.readouterr().out
    assert home.holders() == set()
    assert home.run_of("holds").status == dg.DagsterRunStatus.FAILURE
    assert run.tags.get(WORKER_TAG)


class _DaemonContext:
    """What the daemon's slot-freeing loop reads of its workspace context: the instance."""

    def __init__(self, instance: dg.DagsterInstance):
        self.instance = instance


def _read_until(process: subprocess.Popen, text: str, timeout: float) -> str:
    """The process's output up to (and a moment after) a line holding ``text``."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    deadline = time.monotonic() + timeout
    while not any(text in line for line in lines):
        assert time.monotonic() < deadline, "".join(lines)[-3000:]
        assert process.poll() is None, "".join(lines)[-3000:]
        time.sleep(0.2)
    time.sleep(0.5)
    return "".join(lines)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
