"""Incremental loads on PySpark into Delta Lake, as partitioned Dagster assets."""

from typing import Any

# The Dagster Component, named as defs.yaml files and dg know it:
# ``incremental_assets.IncrementalTables``. Imported on first use so that the engine and
# the specs never import Dagster.
__all__ = ["IncrementalTables"]


def __getattr__(name: str) -> Any:
    if name == "IncrementalTables":
        from incremental_assets.dagster_layer.component import IncrementalTables

        return IncrementalTables
    raise AttributeError(f"module 'incremental_assets' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
