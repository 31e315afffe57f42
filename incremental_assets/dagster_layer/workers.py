"""Which process runs a Dagster run, and whether that process is gone.

Dagster records no process for a run, so the project tags each run with its worker,
``host:pid`` (``WORKER_TAG``), before the run claims or waits for a pool slot: the
project's executor when it starts, the Spark resource when it is set up (an in-process
``dg.materialize`` reaches no project code earlier), and each step once it holds its slot.

From that, a run that has not ended is taken as

- **dead** when its worker is on this host and its process is gone;
- **dead** when it has no worker tag, never reached an executor (no executor, resource or
  step event in its log) and started (or was created) longer ago than the instance's
  ``run_monitoring.start_timeout_seconds`` (Dagster's default 180 s): the project's runs
  tag themselves within a second of reaching their executor, so it was killed starting;
- **unknown** when its worker is on another host, or it has no tag yet ran an executor
  (not one of the project's runs): left to Dagster, and to ``incremental-assets
  free-slots`` by hand;
- **alive** otherwise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import dagster as dg

from incremental_assets.engine.processes import process_alive, this_process

WORKER_TAG = "incremental_assets/worker"
FREE_COMMAND = "incremental-assets free-slots {run_id}"
# Dagster's own default for run_monitoring.start_timeout_seconds.
DEFAULT_START_SECONDS = 180

# Events a run logs once an executor runs it (the in-process executors' first event is an
# engine event "Executing steps in process (pid: N)").
_EXECUTOR_EVENTS = {
    dg.DagsterEventType.RESOURCE_INIT_STARTED,
    dg.DagsterEventType.STEP_WORKER_STARTING,
    dg.DagsterEventType.STEP_START,
}
_EXECUTOR_STARTED = "Executing steps"


def record_worker(instance: dg.DagsterInstance | None, run_id: str | None) -> None:
    """Tag ``run_id`` with this process as its worker."""
    if instance is not None and run_id:
        instance.add_run_tags(run_id, {WORKER_TAG: this_process()})


def mark_worker(context: dg.AssetExecutionContext | dg.OpExecutionContext) -> None:
    """Tag the step's run with the process doing its work (the step holds its slot now)."""
    record_worker(context.instance, context.run_id)


@dataclass(frozen=True)
class Liveness:
    """Whether a run's process runs (``alive`` None: cannot be told from here), and why."""

    alive: bool | None
    why: str


def liveness(instance: dg.DagsterInstance, run: dg.DagsterRun | None) -> Liveness:
    """Whether ``run`` still has a process, by the rules of this module's docstring."""
    if run is None:
        return Liveness(False, "deleted")
    if run.is_finished:
        return Liveness(False, f"ended {run.status.value}")
    tag = run.tags.get(WORKER_TAG)
    if tag:
        alive = process_alive(tag)
        state = {True: "running", False: "gone", None: "on another host, not checked"}[alive]
        return Liveness(alive, f"worker {tag} {state}")
    if reached_executor(instance, run.run_id):
        return Liveness(None, "no worker recorded, not run by the project's executor")
    record = instance.get_run_record_by_id(run.run_id)
    if record is None:
        return Liveness(False, "deleted")
    began = record.start_time or record.create_timestamp.timestamp()
    age = time.time() - began
    bound = start_bound(instance)
    if age > bound:
        return Liveness(
            False,
            f"no worker recorded {age:.0f} s after it started (run monitoring's "
            f"start_timeout_seconds: {bound}): killed before its executor started",
        )
    return Liveness(None, f"starting, no worker recorded yet ({age:.0f} s)")


def reached_executor(instance: dg.DagsterInstance, run_id: str) -> bool:
    """Whether an executor started on ``run_id`` (its log has executor or step events)."""
    if instance.all_logs(run_id, of_type=_EXECUTOR_EVENTS):
        return True
    engine = instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
    return any((e.message or "").startswith(_EXECUTOR_STARTED) for e in engine)


def start_bound(instance: dg.DagsterInstance) -> int:
    """Seconds a run may take to reach its executor: run monitoring's start timeout."""
    return instance.run_monitoring_start_timeout_seconds or DEFAULT_START_SECONDS


def unfinished_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    """Runs that have been created or started and not ended (queued runs are Dagster's)."""
    statuses = [
        dg.DagsterRunStatus.NOT_STARTED,
        dg.DagsterRunStatus.STARTING,
        dg.DagsterRunStatus.STARTED,
    ]
    return list(instance.get_runs(filters=dg.RunsFilter(statuses=statuses)))
