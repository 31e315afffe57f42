"""What a load does to its table right after its commit, when the table asks for it: purge
its deletion vectors (``target.purge_after``), then compact its small files
(``target.compact_after``), each the maintenance job's own step
(engine/delta_lake/maintenance.py ``purge_if_due``, ``compact_if_due``) in a commit of its
own that changes no row.

The load is committed before either starts. One that fails raises ``MaintenanceError``
naming the load's committed version (and the purge's, when the compaction after it
fails): the run fails, nothing of the load is lost, and the next load that commits, or
the maintenance job, purges or compacts (a re-run of the same window commits nothing, so
it does neither). A killed one leaves the table as the load left it.

Example:
    >>> purge, compaction = after_load(spark, target, spec.target, version)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pyspark.sql import SparkSession

from incremental_assets.engine.delta_lake.maintenance import (
    Compaction,
    Purge,
    compact_if_due,
    purge_if_due,
)
from incremental_assets.engine.delta_lake.store import DeltaTarget, overtaken
from incremental_assets.engine.errors import IncrementalLoadError, MaintenanceError
from incremental_assets.specs.models import TargetSpec

T = TypeVar("T")


def after_load(
    spark: SparkSession, target: DeltaTarget, settings: TargetSpec, version: int | None
) -> tuple[Purge | None, Compaction | None]:
    """The purge and the compaction after the load that committed ``version``, as the
    table's ``settings`` ask for them (None: not asked for).

    Raises:
        MaintenanceError: one failed; the load's commit stands.
    """
    purge = compaction = None
    done = f"the load committed Delta version {version} (its rows and its cursor)"
    if settings.purge_after:
        share = settings.purge_after
        purge = _step(
            target,
            done,
            "the purge of its deletion vectors after it (target.purge_after)",
            lambda: purge_if_due(spark, target, share),
        )
        if purge.version is not None:
            done += f", the purge of its deletion vectors version {purge.version}"
    if settings.compact_after:
        at, file_bytes = settings.compact_after, settings.file_size
        compaction = _step(
            target,
            done,
            "the compaction after it (target.compact_after)",
            lambda: compact_if_due(spark, target, at, file_bytes),
        )
    return purge, compaction


def _step(target: DeltaTarget, done: str, what: str, run: Callable[[], T]) -> T:
    """``run``, one step after the load; its failure said after what was ``done``."""
    try:
        return run()
    except IncrementalLoadError:
        raise
    except Exception as exc:  # py4j and Connect wrap Delta's errors; told apart by text
        why = (
            "another writer committed to the table while it ran (a writer outside the table's pool)"
            if overtaken(str(exc))
            else _cause(exc)
        )
        raise MaintenanceError(
            target.table_name,
            f"{done}, then {what} failed: {why}",
            "nothing of the load is lost: the next load that commits does it again, or run "
            "the maintenance job (a re-run of this window commits nothing and does neither); "
            "if the error names a file missing from storage, restore it first (the table "
            "cannot be read without it)",
        ) from exc


def _cause(exc: Exception) -> str:
    """What went wrong, from a Spark error's text: its first line that says something (not
    py4j's "An error occurred while calling ..."), and its root cause (the last "Caused
    by:" of a Java stack trace), each at most 300 characters."""
    lines = [line.strip().removeprefix(": ") for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(("An error occurred", "at "))]
    first = said[0][:300] if said else type(exc).__name__
    causes = [line.removeprefix("Caused by: ") for line in lines if line.startswith("Caused by:")]
    root = causes[-1][:300] if causes else ""
    return first if not root or root in first else f"{first} (caused by {root})"
