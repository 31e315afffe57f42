"""A run that died holding its table's pool slot never blocks the table.

Each table's pool has a limit of 1 (``dagster.yaml``). A run killed inside its step
(SIGKILL, out of memory, a lost machine) never releases its slot, and Dagster's own
executor would then wait for it forever. So:

- every load step tags its run with the process that does the work, ``host:pid``
  (``WORKER_TAG``), as soon as it holds the slot;
- before a run's steps start (the project's executor, the CLI and the demo), the holders
  of the pools it needs are looked at: a holder whose run has ended, or whose process on
  this host is gone, is marked failed and its slots are freed, with a warning naming it;
  a live holder is waited for, with a warning every minute naming it and the command that
  frees it if it is in fact dead (a holder on another host cannot be checked from here);
  the wait sleeps, and stops on SIGTERM/SIGINT;
- with a daemon (``dagster dev``), ``PoolAwareRunLauncher`` tells Dagster's run
  monitoring whether a run's worker is alive by the same tag, so the monitoring marks a
  dead run failed and frees its slots (``free_slots_after_run_end_seconds``).

``incremental-assets free-slots RUN_ID`` does by hand what the check does.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import dagster as dg
from dagster._core.execution.retries import RetryMode
from dagster._core.executor.base import Executor
from dagster._core.launcher import DefaultRunLauncher
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus
from dagster._core.storage.dagster_run import FINISHED_STATUSES
from dagster._core.storage.tags import GLOBAL_CONCURRENCY_TAG
from dagster._utils.interrupts import check_captured_interrupt

WORKER_TAG = "incremental_assets/worker"
FREE_COMMAND = "incremental-assets free-slots {run_id}"


def worker_id() -> str:
    """This process, as a run's worker: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def mark_worker(context: dg.AssetExecutionContext | dg.OpExecutionContext) -> None:
    """Tag the step's run with the process doing its work (the step holds its slot now)."""
    context.instance.add_run_tags(context.run_id, {WORKER_TAG: worker_id()})


def worker_alive(tag: str | None) -> bool | None:
    """Whether the worker ``host:pid`` runs: None when it cannot be told from here (no
    tag, or another host)."""
    if not tag or ":" not in tag:
        return None
    host, _, pid = tag.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Holder:
    """A run holding a slot of ``pool``: ``alive`` is None when that cannot be told."""

    pool: str
    run_id: str
    status: str
    worker: str | None
    alive: bool | None

    def describe(self) -> str:
        where = f"worker {self.worker}" if self.worker else "no worker recorded"
        state = {True: "running", False: "dead", None: "state unknown from this host"}
        return f"run {self.run_id} ({self.status}, {where}, {state[self.alive]})"


def holders(instance: dg.DagsterInstance, pool: str, exclude: str | None = None) -> list[Holder]:
    """The runs (other than ``exclude``) holding slots of ``pool``."""
    info = instance.event_log_storage.get_concurrency_info(pool)
    found = []
    for run_id in sorted({slot.run_id for slot in info.claimed_slots} - {exclude}):
        run = instance.get_run_by_id(run_id)
        if run is None or run.status in FINISHED_STATUSES:
            status = "deleted" if run is None else run.status.value
            found.append(Holder(pool, run_id, status, None, False))
            continue
        tag = run.tags.get(WORKER_TAG)
        found.append(Holder(pool, run_id, run.status.value, tag, worker_alive(tag)))
    return found


def free(instance: dg.DagsterInstance, run_id: str, reason: str) -> list[str]:
    """Mark ``run_id`` failed (unless it has ended) and free every slot it holds; returns
    the pools whose slots it held."""
    run = instance.get_run_by_id(run_id)
    if run is not None and run.status not in FINISHED_STATUSES:
        instance.report_run_failed(run, reason)
    storage = instance.event_log_storage
    held = [
        pool
        for pool in sorted(storage.get_concurrency_keys())
        for slot in storage.get_concurrency_info(pool).claimed_slots
        if slot.run_id == run_id
    ]
    storage.free_concurrency_slots_for_run(run_id)
    return held


def free_dead(
    instance: dg.DagsterInstance, pools: Iterable[str], log: Callable[[str], None], me=None
) -> list[Holder]:
    """Free the slots of the pools' dead holders; returns the holders left (alive or not
    known)."""
    left = []
    for pool in dict.fromkeys(pools):
        for holder in holders(instance, pool, exclude=me):
            if holder.alive is False:
                free(
                    instance,
                    holder.run_id,
                    f"Its worker ({holder.worker or 'unknown'}) is gone while it held pool "
                    f"{pool}; marked failed so the pool's next run can proceed.",
                )
                log(f"Freed pool {pool} from {holder.describe()}: its process is gone.")
            else:
                left.append(holder)
    return left


def wait_for_pools(
    instance: dg.DagsterInstance,
    pools: Iterable[str],
    log: Callable[[str], None],
    me: str | None = None,
    poll_seconds: float = 2.0,
    say_every_seconds: float = 60.0,
    interrupted: Callable[[], bool] = check_captured_interrupt,
) -> None:
    """Return once no pool of ``pools`` is full with other runs' slots, freeing dead
    holders' slots on the way; while a live holder keeps one full, sleep and say so."""
    pools = [p for p in dict.fromkeys(pools) if p]
    if not pools or not instance.event_log_storage.supports_global_concurrency_limits:
        return
    said = 0.0
    while True:
        left = free_dead(instance, pools, log, me)
        full = [h for h in left if _full(instance, h.pool, me)]
        if not full:
            return
        if time.monotonic() - said >= say_every_seconds:
            said = time.monotonic()
            for holder in full:
                log(
                    f"Waiting for pool {holder.pool}, held by {holder.describe()}. If that "
                    f"run is dead, free its slot with: {FREE_COMMAND.format(run_id=holder.run_id)}"
                )
        if interrupted():
            raise dg.DagsterExecutionInterruptedError(
                f"Interrupted while waiting for pools {', '.join(sorted({h.pool for h in full}))}"
            )
        time.sleep(poll_seconds)


def _full(instance: dg.DagsterInstance, pool: str, me: str | None) -> bool:
    info = instance.event_log_storage.get_concurrency_info(pool)
    if info.limit is None:
        return False
    others = [s for s in info.claimed_slots if s.run_id != me]
    return len(others) >= info.limit


class PoolAwareExecutor(Executor):
    """Dagster's in-process executor, after ``wait_for_pools`` for the pools of the plan's
    steps: Dagster's own wait cannot tell a dead holder from a slow one."""

    def __init__(self, inner: Executor):
        self._inner = inner

    @property
    def retries(self) -> RetryMode:
        return self._inner.retries

    @property
    def step_dependency_config(self):
        return self._inner.step_dependency_config

    def execute(self, plan_context, execution_plan):
        steps = execution_plan.get_steps_to_execute_in_topo_order()
        pools = [step.pool or step.tags.get(GLOBAL_CONCURRENCY_TAG) for step in steps]
        wait_for_pools(
            plan_context.instance, pools, plan_context.log.warning, me=plan_context.run_id
        )
        yield from self._inner.execute(plan_context, execution_plan)


@dg.executor(name="in_process_pool_aware", config_schema=dg.in_process_executor.config_schema)
def pool_aware_executor(init_context: dg.InitExecutorContext) -> Executor:
    """The project's executor: every step in the run's process (one Spark session per run),
    started once no dead run holds a pool it needs."""
    return PoolAwareExecutor(dg.in_process_executor.executor_creation_fn(init_context))


class PoolAwareRunLauncher(DefaultRunLauncher):
    """Dagster's default launcher, telling run monitoring (``dagster dev``'s daemon) whether
    a run's worker process is alive by ``WORKER_TAG``: a run whose worker died holding its
    slot is marked failed, and ``free_slots_after_run_end_seconds`` frees the slot."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        tag = run.tags.get(WORKER_TAG)
        if worker_alive(tag) is False:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker {tag} is gone")
        # Not started its step yet, or on another host: take it as running.
        return CheckRunHealthResult(WorkerStatus.RUNNING)
