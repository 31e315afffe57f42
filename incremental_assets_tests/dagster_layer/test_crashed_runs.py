"""A run that dies holding its table's pool slot never blocks the table (dagster_layer/pools.py).

Real runs of ``dagster asset materialize``, as separate processes, on an instance made from
the project's own dagster.yaml (pool limit 1, run monitoring, the project's run launcher;
incremental_assets_tests/dagster_homes.py). A run holds its pool's slot inside its step;
it is killed with SIGKILL there, as an out-of-memory kill would; then the next run of that
pool must go through by itself, the daemon's run monitoring must mark the dead run failed
and free its slot, and a live holder must be waited for with a warning, without burning
CPU, until SIGTERM stops it. No Spark: the steps only hold the slot (the load steps tag
their runs the same way). Runs that die queued for the slot, or handed it, are in
incremental_assets_tests/bad_input/test_dead_runs.py.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._daemon.monitoring.concurrency import execute_concurrency_slots_iteration
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

from incremental_assets.cli import main as cli
from incremental_assets.dagster_layer.pools import WORKER_TAG
from incremental_assets_tests.dagster_homes import POOL, DaemonContext, Home, cpu_seconds


@pytest.fixture
def home(tmp_path) -> Iterator[Home]:
    home = Home(tmp_path)
    yield home
    home.close()


def test_a_run_killed_holding_its_slot_is_freed_by_the_next_run(home):
    home.holding_run().kill()
    dead = home.run_of("holds")
    assert dead.status == dg.DagsterRunStatus.STARTED  # nobody told Dagster
    assert home.holders() == {dead.run_id}  # and the slot is still taken

    started = time.monotonic()
    rerun = home.start("quick")
    code = rerun.finish(timeout=180)
    out = rerun.out

    assert code == 0, out
    assert time.monotonic() - started < 120
    assert f"Freed pool {POOL} from run {dead.run_id}" in out
    assert home.run_of("holds").status == dg.DagsterRunStatus.FAILURE
    assert home.run_of("quick").status == dg.DagsterRunStatus.SUCCESS
    assert home.holders() == set()


def test_the_daemons_run_monitoring_fails_a_dead_run_and_frees_its_slot(tmp_path):
    # Slots freed 1 s after a run's end instead of the shipped 30 s, which the test waits.
    home = Home(tmp_path, free_slots_after_run_end_seconds=1)
    try:
        home.holding_run().kill()
        dead = home.run_of("holds")
        assert home.holders() == {dead.run_id}

        with home.instance() as instance:
            # One pass of each daemon loop, as `dagster dev` runs them every poll interval.
            record = instance.get_run_record_by_id(dead.run_id)
            monitor_started_run(instance, None, record, logging.getLogger("test"))
            assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
            after = instance.run_monitoring_settings["free_slots_after_run_end_seconds"]
            time.sleep(after + 1)
            context = DaemonContext(instance)
            list(execute_concurrency_slots_iteration(context, logging.getLogger("test")))
        assert home.holders() == set()
    finally:
        home.close()


def test_a_live_holder_is_waited_for_with_a_warning_until_sigterm(home):
    holder = home.holding_run()
    try:
        run = home.run_of("holds")
        waiting = home.start("quick")
        out = waiting.until("Waiting for pool", timeout=120)
        assert f"held by run {run.run_id}" in out
        assert f"incremental-assets free-slots {run.run_id}" in out
        # The wait sleeps: a few seconds of it cost the waiting process little CPU.
        pid = waiting.process.pid
        cpu = cpu_seconds(pid)
        time.sleep(5)
        assert cpu_seconds(pid) - cpu < 1.0
        os.killpg(pid, signal.SIGTERM)
        assert waiting.finish(timeout=30) != 0
        assert home.holders() == {run.run_id}  # the live holder keeps its slot
    finally:
        holder.kill()


def test_free_slots_refuses_a_live_worker_and_frees_a_dead_one(home, monkeypatch, capsys):
    monkeypatch.setenv("DAGSTER_HOME", str(home.root / "home"))
    holder = home.holding_run()
    run = home.run_of("holds")
    try:
        assert cli(["free-slots", run.run_id]) == 1
        assert "still running on this host" in capsys.readouterr().err
        assert home.holders() == {run.run_id}
    finally:
        holder.kill()
    assert cli(["free-slots", run.run_id]) == 0
    assert f"1 slot(s) of pool {POOL} freed" in capsys.readouterr().out
    assert home.holders() == set()
    assert home.run_of("holds").status == dg.DagsterRunStatus.FAILURE
    assert run.tags.get(WORKER_TAG)
