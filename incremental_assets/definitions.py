"""The Dagster code location: every component under ``incremental_assets/defs/`` (the
project's ``IncrementalTables``, reading ``tables.yaml`` or ``INCREMENTAL_ASSETS_TABLES``).

``workspace.yaml`` (``dagster dev``) and ``dg dev`` both load this module. Nothing runs here
beyond building definitions: the Spark session starts with the first run.
"""

import os
import warnings
from pathlib import Path

import dagster as dg

# Single-run backfills are a beta Dagster API; the project relies on them deliberately.
warnings.filterwarnings("ignore", category=dg.BetaWarning)

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def tables_path() -> Path:
    return Path(os.environ.get("INCREMENTAL_ASSETS_TABLES", PROJECT_ROOT / "tables.yaml"))


defs = dg.load_from_defs_folder(project_root=PROJECT_ROOT)
