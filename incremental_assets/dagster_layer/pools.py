"""No dead run holds, is handed, or queues for a table's pool slot.

Each table's pool has a limit of 1 (``dagster.yaml``). Dagster keeps two books per pool:
the slots a step has **claimed**, and a queue of steps waiting for one, whose head is
**handed** the next free slot (assigned) before it claims it. A run killed holding a
slot, handed one, or queued for one (SIGKILL, out of memory, a lost machine) never leaves
either book, and Dagster then gives the slot to nobody, silently and for ever. So, with
a run's process known by its worker tag (``workers.py``: it also says when a run counts
as dead):

- before a run's steps start (the project's executor, the CLI and the demo), every run
  whose process is gone is marked failed, and the pools the run needs are looked at: an
  entry (claimed, handed or queued) of a dead run is removed with a warning naming it; a
  live holder is waited for, with a warning every minute naming it, since when it holds
  the slot, and the command that frees it if it is in fact dead; the wait sleeps, and
  stops on SIGTERM/SIGINT;
- while Dagster's own claim of a step waits ("Step blocked by limit for pool ..."), the
  project's executor does the same every few seconds, so a slot handed to a run that died
  meanwhile is taken back, and the wait is never silent;
- with a daemon (``dagster dev``), ``PoolAwareRunLauncher`` tells Dagster's run
  monitoring whether a run's worker is alive, so the monitoring marks a dead run failed
  and ``free_slots_after_run_end_seconds`` frees its entries (claimed and queued).

``incremental-assets free-slots RUN_ID`` does by hand what the check does.

Dagster's private APIs are used here and nowhere else; checked against Dagster 1.13.27.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

import dagster as dg
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.api import ExecuteRunWithPlanIterable
from dagster._core.execution.context_creation_job import PlanExecutionContextManager
from dagster._core.execution.plan.execute_plan import inner_plan_execution_iterator
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.executor.in_process import InProcessExecutor
from dagster._core.launcher import DefaultRunLauncher
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus
from dagster._core.storage.tags import GLOBAL_CONCURRENCY_TAG
from dagster._utils.interrupts import check_captured_interrupt

from incremental_assets.dagster_layer.workers import (
    FREE_COMMAND,
    WORKER_TAG,
    Liveness,
    liveness,
    mark_worker,
    record_worker,
    unfinished_runs,
)

# WORKER_TAG and mark_worker live in workers.py; the steps import them from here.
__all__ = [
    "WORKER_TAG",
    "Freed",
    "Holder",
    "PoolAwareExecutor",
    "PoolAwareRunLauncher",
    "fail_dead_runs",
    "free",
    "free_dead",
    "holders",
    "mark_worker",
    "pool_aware_executor",
    "say_waiting",
    "wait_for_pools",
]

Log = Callable[[str], None]

_ROLES = {
    "claimed": "holding the slot",
    "handed": "handed the slot, not claimed yet",
    "queued": "queued for it",
}


@dataclass(frozen=True)
class Holder:
    """A run in ``pool``'s books: ``role`` is ``claimed`` (it holds a slot), ``handed``
    (the next free slot is its to claim) or ``queued``."""

    pool: str
    run_id: str
    status: str
    liveness: Liveness
    role: str
    since: datetime | None = None

    @property
    def alive(self) -> bool | None:
        return self.liveness.alive

    @property
    def takes_slot(self) -> bool:
        return self.role != "queued"

    def describe(self) -> str:
        since = f" since {self.since:%Y-%m-%d %H:%M:%S} UTC" if self.since else ""
        return f"run {self.run_id} ({self.status}, {self.liveness.why}; {_ROLES[self.role]}{since})"


def holders(instance: dg.DagsterInstance, pool: str, exclude: str | None = None) -> list[Holder]:
    """The runs (other than ``exclude``) in ``pool``'s books, slot takers first."""
    info = instance.event_log_storage.get_concurrency_info(pool)
    pending = {(p.run_id, p.step_key): p for p in info.pending_steps}
    found: dict[str, tuple[str, datetime | None]] = {}
    for slot in info.claimed_slots:
        entry = pending.get((slot.run_id, slot.step_key))
        found[slot.run_id] = ("claimed", entry.assigned_timestamp if entry else None)
    for entry in sorted(info.pending_steps, key=lambda p: p.enqueued_timestamp):
        role = "handed" if entry.assigned_timestamp else "queued"
        if entry.run_id not in found or (role, found[entry.run_id][0]) == ("handed", "queued"):
            found[entry.run_id] = (role, entry.assigned_timestamp or entry.enqueued_timestamp)
    if exclude is not None:
        found.pop(exclude, None)
    result = []
    for run_id, (role, since) in found.items():
        run = instance.get_run_by_id(run_id)
        status = "deleted" if run is None else run.status.value
        result.append(Holder(pool, run_id, status, liveness(instance, run), role, since))
    order = list(_ROLES)
    return sorted(result, key=lambda h: order.index(h.role))


@dataclass(frozen=True)
class Freed:
    """What ``free`` removed, per pool: slots held or handed, places in a queue."""

    marked_failed: bool
    slots: dict[str, int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"{n} slot(s) of pool {pool} freed" for pool, n in sorted(self.slots.items())]
        parts += [
            f"{n} queued claim(s) on pool {pool} dropped" for pool, n in sorted(self.queued.items())
        ]
        return "; ".join(parts) or "it held no slot and waited for none"


def free(instance: dg.DagsterInstance, run_id: str, reason: str) -> Freed:
    """Mark ``run_id`` failed (unless it has ended) and remove it from every pool's books:
    the slots it holds or was handed, its places in queues."""
    run = instance.get_run_by_id(run_id)
    marked = run is not None and not run.is_finished
    if marked:
        instance.report_run_failed(run, reason)
    storage = instance.event_log_storage
    slots: dict[str, int] = {}
    queued: dict[str, int] = {}
    infos = storage.get_concurrency_infos(sorted(storage.get_concurrency_keys()))
    for pool, info in infos.items():
        claimed = {s.step_key for s in info.claimed_slots if s.run_id == run_id}
        for entry in info.pending_steps:
            if entry.run_id == run_id and entry.step_key not in claimed:
                book = slots if entry.assigned_timestamp else queued
                book[pool] = book.get(pool, 0) + 1
        if claimed:
            slots[pool] = slots.get(pool, 0) + len(claimed)
    # Also hands the freed slots to the queues' next runs.
    storage.free_concurrency_slots_for_run(run_id)
    return Freed(marked, slots, queued)


def fail_dead_runs(instance: dg.DagsterInstance, log: Log, me: str | None = None) -> list[str]:
    """Mark failed every unfinished run (but ``me``) whose process is gone, removing it
    from the pools' books; returns their ids."""
    dead = []
    for run in unfinished_runs(instance):
        if run.run_id == me:
            continue
        state = liveness(instance, run)
        if state.alive is not False:
            continue
        freed = free(instance, run.run_id, f"Its process is gone ({state.why}); marked failed.")
        log(f"Marked run {run.run_id} failed: {state.why}; {freed.describe()}.")
        dead.append(run.run_id)
    return dead


def free_dead(
    instance: dg.DagsterInstance, pools: Iterable[str], log: Log, me: str | None = None
) -> tuple[list[Holder], list[Holder]]:
    """Remove the pools' dead runs (holding, handed or queued) from their books; returns
    them, and the runs left in the books (alive or not known)."""
    pools = list(dict.fromkeys(pools))
    found = [h for pool in pools for h in holders(instance, pool, exclude=me)]
    freed = [h for h in found if h.alive is False]
    for holder in freed:
        free(
            instance,
            holder.run_id,
            f"Its process is gone ({holder.liveness.why}) while in pool {holder.pool}'s "
            "books; marked failed so the pool's next run can proceed.",
        )
        log(f"Freed pool {holder.pool} from {holder.describe()}: its process is gone.")
    if freed:  # read again: freeing a slot hands it to the queue's next run
        found = [h for pool in pools for h in holders(instance, pool, exclude=me)]
    return freed, found


def say_waiting(log: Log, pool: str, left: list[Holder]) -> None:
    """Name who keeps ``pool`` and the command that frees each, were it dead."""
    for holder in [h for h in left if h.takes_slot] or left:
        log(
            f"Waiting for pool {pool}, held by {holder.describe()}. If that run is dead, "
            f"free its slot with: {FREE_COMMAND.format(run_id=holder.run_id)}"
        )


def wait_for_pools(
    instance: dg.DagsterInstance,
    pools: Iterable[str],
    log: Log,
    me: str | None = None,
    poll_seconds: float = 2.0,
    say_every_seconds: float = 60.0,
    interrupted: Callable[[], bool] = check_captured_interrupt,
) -> None:
    """Mark dead runs failed; then return once no pool of ``pools`` has its slots taken by
    other runs, removing dead runs from the pools' books on the way; while live ones keep
    a pool full, sleep and say who (every ``say_every_seconds``)."""
    pools = [p for p in dict.fromkeys(pools) if p]
    if not instance.event_log_storage.supports_global_concurrency_limits:
        pools = []
    said = float("-inf")
    swept = False
    while True:
        _, left = free_dead(instance, pools, log, me)
        if not swept:  # after the pools' own dead, so that those are named by pool
            fail_dead_runs(instance, log, me)
            swept = True
        full = [p for p in pools if _full(instance, p, me)]
        if not full:
            return
        if time.monotonic() - said >= say_every_seconds:
            said = time.monotonic()
            for pool in full:
                say_waiting(log, pool, [h for h in left if h.pool == pool])
        if interrupted():
            raise dg.DagsterExecutionInterruptedError(
                f"Interrupted while waiting for pools {', '.join(full)}"
            )
        time.sleep(poll_seconds)


def _full(instance: dg.DagsterInstance, pool: str, me: str | None) -> bool:
    """Whether other runs hold, or were handed, all of ``pool``'s slots."""
    info = instance.event_log_storage.get_concurrency_info(pool)
    if info.limit is None:
        return False
    taken = {(s.run_id, s.step_key) for s in info.claimed_slots if s.run_id != me}
    handed = [p for p in info.pending_steps if p.assigned_timestamp and p.run_id != me]
    taken |= {(p.run_id, p.step_key) for p in handed}
    return len(taken) >= info.limit


class _WatchedConcurrency(InstanceConcurrencyContext):
    """Dagster's claims of the run's pool slots, watched: while a step's claim is blocked,
    the pool's dead runs are removed from its books every ``poll_seconds`` (a slot handed
    to a run that died would otherwise wait for it for ever), and the live ones are named
    every ``say_every_seconds``, with the command that frees them."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        dagster_run: dg.DagsterRun,
        log: Log,
        poll_seconds: float = 2.0,
        say_every_seconds: float = 60.0,
    ):
        super().__init__(instance, dagster_run)
        self._log = log
        self._poll_seconds = poll_seconds
        self._say_every_seconds = say_every_seconds
        self._looked: dict[str, float] = {}
        self._said: dict[str, float] = {}

    def claim(self, concurrency_key: str, step_key: str, step_priority: int = 0) -> bool:
        if super().claim(concurrency_key, step_key, step_priority):
            return True
        now = time.monotonic()
        if now - self._looked.get(concurrency_key, float("-inf")) >= self._poll_seconds:
            self._looked[concurrency_key] = now
            freed, left = free_dead(self._instance, [concurrency_key], self._log, self._run_id)
            if freed:
                # Dagster backs off up to 15 s between claims: ask again at once.
                self._pending_timeouts[step_key] = 0.0
            elif left and now - self._said.get(concurrency_key, float("-inf")) >= (
                self._say_every_seconds
            ):
                self._said[concurrency_key] = now
                say_waiting(self._log, concurrency_key, left)
        if check_captured_interrupt():
            raise dg.DagsterExecutionInterruptedError(
                f"Interrupted while waiting for pool {concurrency_key}"
            )
        # Dagster's in-process loop asks again at once, spinning a core for as long as the
        # wait lasts; a short sleep in its one call per turn keeps the wait cheap.
        time.sleep(0.5)
        return False


def _watched_execution(job_context, execution_plan):
    with _WatchedConcurrency(
        job_context.instance, job_context.dagster_run, job_context.log.warning
    ) as concurrency:
        yield from inner_plan_execution_iterator(job_context, execution_plan, concurrency)


class PoolAwareExecutor(InProcessExecutor):
    """Dagster's in-process executor (every step in the run's process, one Spark session),
    which records the run's worker, waits for the pools of the plan's steps (freeing dead
    runs' entries: Dagster's own wait cannot tell a dead holder from a slow one), and
    watches its steps' claims (``_WatchedConcurrency``)."""

    def execute(self, plan_context, execution_plan):
        run_id = plan_context.run_id
        record_worker(plan_context.instance, run_id)
        steps = execution_plan.get_steps_to_execute_in_topo_order()
        pools = [step.pool or step.tags.get(GLOBAL_CONCURRENCY_TAG) for step in steps]
        wait_for_pools(plan_context.instance, pools, plan_context.log.warning, me=run_id)
        # As InProcessExecutor.execute, with the watched claims.
        keys = execution_plan.step_keys_to_execute
        pid = os.getpid()
        yield DagsterEvent.engine_event(
            plan_context,
            f"Executing steps in process (pid: {pid})",
            event_specific_data=EngineEventData.in_process(pid, keys),
        )
        started = time.monotonic()
        yield from iter(
            ExecuteRunWithPlanIterable(
                execution_plan=plan_context.execution_plan,
                iterator=_watched_execution,
                execution_context_manager=PlanExecutionContextManager(
                    job=plan_context.job,
                    retry_mode=plan_context.retry_mode,
                    execution_plan=plan_context.execution_plan,
                    run_config=plan_context.run_config,
                    dagster_run=plan_context.dagster_run,
                    instance=plan_context.instance,
                    raise_on_error=plan_context.raise_on_error,
                    output_capture=plan_context.output_capture,
                    step_dependency_config=self.step_dependency_config,
                ),
            )
        )
        yield DagsterEvent.engine_event(
            plan_context,
            f"Finished steps in process (pid: {pid}) in {time.monotonic() - started:.1f} s",
            event_specific_data=EngineEventData.in_process(pid, keys),
        )


@dg.executor(name="in_process_pool_aware", config_schema=dg.in_process_executor.config_schema)
def pool_aware_executor(init_context: dg.InitExecutorContext) -> PoolAwareExecutor:
    """The project's executor: every step in the run's process (one Spark session per run),
    started once no dead run holds a pool it needs."""
    plain = dg.in_process_executor.executor_creation_fn(init_context)
    return PoolAwareExecutor(
        retries=plain.retries,
        step_dependency_config=plain.step_dependency_config,
        marker_to_close=plain.marker_to_close,
    )


class PoolAwareRunLauncher(DefaultRunLauncher):
    """Dagster's default launcher, telling run monitoring (``dagster dev``'s daemon) whether
    a run's process is alive (``workers.liveness``): a dead run is marked failed, and
    ``free_slots_after_run_end_seconds`` removes it from the pools' books."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        state = liveness(self._instance, run)
        if state.alive is False:
            return CheckRunHealthResult(WorkerStatus.FAILED, f"run's process is gone: {state.why}")
        # Alive, starting, or on another host: take it as running.
        return CheckRunHealthResult(WorkerStatus.RUNNING)
