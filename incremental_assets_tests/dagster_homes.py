"""A Dagster home made from the project's own dagster.yaml (pool limit 1, run monitoring,
the project's run launcher), and real runs in it as separate processes, to kill with
SIGKILL: ``dagster asset materialize`` (the project's executor, as ``dg launch`` and the
CLI run it) and an in-process ``dg.materialize`` (Dagster's own executor).

No Spark: the assets only hold a table's pool slot, tagging their runs as the load steps
do; the in-process run's step takes the project's ``DeltaWarehouse`` resource, which names
the run's worker as the Spark resource does.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from incremental_assets_tests.builders import PROJECT_ROOT

POOL = "incremental_assets_orders"

DEFS = f'''
import os, time
from pathlib import Path
import dagster as dg
from incremental_assets.dagster_layer.pools import mark_worker, pool_aware_executor

FLAGS = Path(os.environ["FLAGS"])

@dg.asset(pool="{POOL}")
def holds(context):
    mark_worker(context)
    (FLAGS / "holding").touch()
    time.sleep(600)

@dg.asset(pool="{POOL}")
def quick(context):
    mark_worker(context)

@dg.asset
def first(context):
    """Outside the pool: runs until told to go on, so a later step claims the slot late."""
    (FLAGS / "first").touch()
    while not (FLAGS / "go").exists():
        time.sleep(0.1)

@dg.asset(pool="{POOL}", deps=[first])
def after_first(context):
    mark_worker(context)

defs = dg.Definitions(assets=[holds, quick, first, after_first], executor=pool_aware_executor)
'''

# A run whose process dies while Dagster sets the run up, before its executor starts.
DEFS_DYING = """
import os, signal
import dagster as dg

@dg.executor(name="dies_starting")
def dies_starting(init_context):
    os.kill(os.getpid(), signal.SIGKILL)

@dg.asset
def never(context):
    pass

defs = dg.Definitions(assets=[never], executor=dies_starting)
"""

# dg.materialize in a process of its own: Dagster's in-process executor, not the project's;
# its step takes the project's warehouse resource, whose set-up names the run's worker.
IN_PROCESS = f"""
import dagster as dg
from incremental_assets.dagster_layer.pools import mark_worker
from incremental_assets.dagster_layer.resources import DeltaWarehouse

@dg.asset(pool="{POOL}")
def quick(context, warehouse: DeltaWarehouse):
    mark_worker(context)

with dg.DagsterInstance.get() as instance:
    dg.materialize([quick], instance=instance, resources={{"warehouse": DeltaWarehouse()}})
"""


class Child:
    """A run's process, its output read as it comes."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(process.stdout))
        self._reader.daemon = True
        self._reader.start()

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def until(self, text: str, timeout: float) -> str:
        """The output once a line holds ``text`` (fails when the process ends first)."""
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            tail = self.out[-4000:]
            assert time.monotonic() < deadline, f"no {text!r} after {timeout} s:\n{tail}"
            assert self.process.poll() is None, f"ended before {text!r}:\n{tail}"
            time.sleep(0.2)
        time.sleep(0.5)
        return self.out

    def finish(self, timeout: float) -> int:
        """Its exit code; kills it (and fails) when it runs longer than ``timeout``."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout} s:\n{self.out[-4000:]}") from None
        self._reader.join(timeout=30)  # the rest of its output
        return code

    def kill(self) -> None:
        """SIGKILL, as an out-of-memory kill would."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


class Home:
    """A Dagster home with the project's dagster.yaml, and runs of DEFS in it."""

    def __init__(self, root: Path, **run_monitoring: int):
        """``run_monitoring``: settings of run monitoring (``start_timeout_seconds``,
        ``free_slots_after_run_end_seconds``) set in the copied dagster.yaml."""
        self.root = root
        (root / "home").mkdir()
        config = (PROJECT_ROOT / "dagster.yaml").read_text()
        for key, value in run_monitoring.items():
            config = _run_monitoring_setting(config, key, value)
        (root / "home" / "dagster.yaml").write_text(config)
        (root / "defs.py").write_text(DEFS)
        (root / "defs_dying.py").write_text(DEFS_DYING)
        (root / "in_process.py").write_text(IN_PROCESS)
        self.flags = root / "flags"
        self.flags.mkdir()
        self.env = {
            **os.environ,
            "DAGSTER_HOME": str(root / "home"),
            "FLAGS": str(self.flags),
            "PYTHONUNBUFFERED": "1",
        }
        self.children: list[Child] = []
        with self.instance():  # create the storage now, not in two processes at once
            pass

    def _spawn(self, command: list[str]) -> Child:
        process = subprocess.Popen(
            command,
            env=self.env,
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.children.append(Child(process))
        return self.children[-1]

    def start(self, selection: str) -> Child:
        """``dagster asset materialize --select SELECTION``: the project's executor."""
        command = [
            sys.executable, "-m", "dagster", "asset", "materialize",
            "-f", str(self.root / "defs.py"), "--select", selection,
        ]  # fmt: skip
        return self._spawn(command)

    def start_dying(self) -> Child:
        """A run of ``never`` whose process dies before its executor starts."""
        command = [
            sys.executable, "-m", "dagster", "asset", "materialize",
            "-f", str(self.root / "defs_dying.py"), "--select", "never",
        ]  # fmt: skip
        return self._spawn(command)

    def start_in_process(self) -> Child:
        """``dg.materialize`` of a step in the pool, in a process of its own: Dagster's own
        executor."""
        return self._spawn([sys.executable, str(self.root / "in_process.py")])

    def holding_run(self) -> Child:
        """A run of ``holds``, inside its step with the pool's slot claimed."""
        flag = self.flags / "holding"
        flag.unlink(missing_ok=True)
        child = self.start("holds")
        wait_for(flag.exists, 120, lambda: child.process.poll() is None, child)
        return child

    def instance(self) -> dg.DagsterInstance:
        return dg.DagsterInstance.from_config(str(self.root / "home"))

    def holders(self) -> set[str]:
        """Runs with a claimed slot of the pool."""
        with self.instance() as instance:
            info = instance.event_log_storage.get_concurrency_info(POOL)
            return {slot.run_id for slot in info.claimed_slots}

    def books(self) -> tuple[list[str], list[tuple[str, bool]]]:
        """The pool's claimed slots (run ids) and its queue (run id, handed a slot), the
        queue oldest first."""
        with self.instance() as instance:
            info = instance.event_log_storage.get_concurrency_info(POOL)
        queue = sorted(info.pending_steps, key=lambda p: p.enqueued_timestamp)
        return (
            [slot.run_id for slot in info.claimed_slots],
            [(p.run_id, p.assigned_timestamp is not None) for p in queue],
        )

    def run(self, run_id: str) -> dg.DagsterRun:
        with self.instance() as instance:
            run = instance.get_run_by_id(run_id)
        assert run is not None, run_id
        return run

    def run_of(self, asset: str) -> dg.DagsterRun:
        with self.instance() as instance:
            runs = [r for r in instance.get_runs() if asset in str(r.asset_selection)]
        assert len(runs) == 1, runs
        return runs[0]

    def run_ids(self) -> set[str]:
        with self.instance() as instance:
            return {r.run_id for r in instance.get_runs()}

    def close(self) -> None:
        for child in self.children:
            child.kill()


def _run_monitoring_setting(config: str, key: str, value: int) -> str:
    """dagster.yaml's text with run monitoring's ``key`` set to ``value`` (replaced where
    the shipped file sets it, added otherwise)."""
    assert "run_monitoring:\n" in config
    shipped = re.compile(rf"^(  {key}:) .*$", re.MULTILINE)
    if shipped.search(config):
        return shipped.sub(rf"\g<1> {value}", config)
    return config.replace("run_monitoring:\n", f"run_monitoring:\n  {key}: {value}\n")


def wait_for(
    done: Callable[[], object],
    timeout: float,
    still: Callable[[], bool] = lambda: True,
    child: Child | None = None,
) -> None:
    """Poll ``done`` until true; fail after ``timeout`` s or once ``still`` is false."""
    deadline = time.monotonic() + timeout
    while not done():
        log = child.out[-4000:] if child else ""
        assert still(), f"ended early:\n{log}"
        assert time.monotonic() < deadline, f"not done after {timeout} s:\n{log}"
        time.sleep(0.2)


class DaemonContext:
    """What the daemon's slot-freeing loop reads of its workspace context: the instance."""

    def __init__(self, instance: dg.DagsterInstance):
        self.instance = instance


def cpu_seconds(pid: int) -> float:
    """CPU time (user and system) the process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
