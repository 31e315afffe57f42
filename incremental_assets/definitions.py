"""The Dagster code location: tables from ``tables.yaml`` (or ``INCREMENTAL_ASSETS_TABLES``).

Nothing runs here beyond building definitions: the Spark session starts with the first run.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import dagster as dg

from incremental_assets.defs.build import build_definitions
from incremental_assets.specs import load_project

# Single-run backfills are a beta Dagster API; the project relies on them deliberately.
warnings.filterwarnings("ignore", category=dg.BetaWarning)

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def tables_path() -> Path:
    return Path(os.environ.get("INCREMENTAL_ASSETS_TABLES", PROJECT_ROOT / "tables.yaml"))


defs = build_definitions(load_project(tables_path()))
