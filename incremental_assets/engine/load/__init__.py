"""One incremental load, by phase: ``probe`` (source, cursor, window), ``stage`` (the
window's rows reduced by the strategy to a staged increment), ``commit`` (side tables,
then one Delta commit with the cursor) and ``result`` (``LoadResult``); ``run`` chains
them (``run_load``)."""

from __future__ import annotations

from incremental_assets.engine.load.commit import merge_plan_of
from incremental_assets.engine.load.probe import Probe, probe
from incremental_assets.engine.load.result import LoadResult
from incremental_assets.engine.load.run import Hook, run_load
from incremental_assets.engine.load.stage import prepared_rows, window_rows
from incremental_assets.engine.strategies.scd2 import history_columns

__all__ = [
    "Hook",
    "LoadResult",
    "Probe",
    "history_columns",
    "merge_plan_of",
    "prepared_rows",
    "probe",
    "run_load",
    "window_rows",
]
