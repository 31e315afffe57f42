"""Table specs: validated models loaded from YAML."""

from incremental_assets.specs.loader import SpecError, load_project, parse_project
from incremental_assets.specs.models import (
    PartitioningSpec,
    ProjectSpec,
    SourceSpec,
    SparkSpec,
    TableSpec,
    TargetSpec,
    WarehouseSpec,
    WatermarkSpec,
)

__all__ = [
    "PartitioningSpec",
    "ProjectSpec",
    "SourceSpec",
    "SparkSpec",
    "SpecError",
    "TableSpec",
    "TargetSpec",
    "WarehouseSpec",
    "WatermarkSpec",
    "load_project",
    "parse_project",
]
