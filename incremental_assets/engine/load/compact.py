"""A load's compaction of the table's small files after its commit, when the table's
``target.compact_after`` asks for it (engine/delta_lake/maintenance.py ``compact_if_due``).

The load is committed before it starts: a compaction that fails, or is killed, loses
nothing and leaves the table as the load left it (the maintenance job, or the next load,
compacts). Its failure is reported on the result, not raised.

Example:
    >>> compaction, note = compact_after_load(spark, target, spec.target)  # doctest: +SKIP
"""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from incremental_assets.engine.delta_lake.maintenance import Compaction, compact_if_due
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.specs.models import TargetSpec

log = logging.getLogger(__name__)


def compact_after_load(
    spark: SparkSession, target: DeltaTarget, settings: TargetSpec
) -> tuple[Compaction | None, str]:
    """The compaction (None when the table does not ask for one) and a note ("" unless it
    failed)."""
    if not settings.compact_after:
        return None, ""
    try:
        return compact_if_due(spark, target, settings.compact_after, settings.file_size), ""
    except Exception as exc:  # the load is committed: report, do not fail it
        note = (
            f"the compaction after the load failed ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); the load is committed, and the "
            "next load or the maintenance job compacts"
        )
        log.warning("%s: %s", target.table_name, note)
        return None, note
