"""A load's compaction of the table's small files after its commit, when the table's
``target.compact_after`` asks for it (engine/delta_lake/maintenance.py ``compact_if_due``).

The load is committed before the compaction starts. A compaction that fails raises
``MaintenanceError`` naming the load's committed version: the run fails, nothing of the
load is lost, and a re-run loads nothing again (its window is empty) and compacts. A
killed one leaves the table as the load left it.

Example:
    >>> compaction = compact_after_load(spark, target, spec.target, version)  # doctest: +SKIP
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from incremental_assets.engine.delta_lake.maintenance import Compaction, compact_if_due
from incremental_assets.engine.delta_lake.store import DeltaTarget, overtaken
from incremental_assets.engine.errors import IncrementalLoadError, MaintenanceError
from incremental_assets.specs.models import TargetSpec


def compact_after_load(
    spark: SparkSession, target: DeltaTarget, settings: TargetSpec, version: int | None
) -> Compaction:
    """The compaction after the load that committed ``version``, for a table whose
    ``settings`` set ``compact_after``.

    Raises:
        MaintenanceError: the compaction failed; the load's commit stands.
    """
    assert settings.compact_after
    try:
        return compact_if_due(spark, target, settings.compact_after, settings.file_size)
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
            f"the load committed Delta version {version} (its rows and its cursor), then the "
            f"compaction after it (target.compact_after) failed: {why}",
            "nothing of the load is lost: a re-run loads nothing again and compacts; if the "
            "error names a file missing from storage, restore it first (the table cannot be "
            "read without it)",
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
