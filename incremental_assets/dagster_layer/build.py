"""Definitions from a project spec: assets with their checks and automation conditions, the
automation sensor, landing sensors, the maintenance job and its schedule, resources."""

from __future__ import annotations

import dagster as dg

from incremental_assets.dagster_layer.assets import table_asset
from incremental_assets.dagster_layer.connections import DatabaseConnections
from incremental_assets.dagster_layer.declared import layer_assets
from incremental_assets.dagster_layer.landing import landing_sensor
from incremental_assets.dagster_layer.late import late_rows_checks
from incremental_assets.dagster_layer.maintenance import (
    JOB_NAME,
    maintenance_job,
    maintenance_schedule,
)
from incremental_assets.dagster_layer.pools import pool_aware_executor
from incremental_assets.dagster_layer.resource_config import refuse_literal_secrets
from incremental_assets.dagster_layer.resources import DeltaWarehouse, spark_resource
from incremental_assets.specs import ProjectSpec

AUTOMATION_SENSOR = "incremental_assets_automation"

# One switch for the project's automation: tables load their latest partition when its day
# (or hour) ends, silver and gold follow their upstream (automation conditions on the
# assets, evaluated by this one sensor). One object, so that several IncrementalTables
# components in a project share it (Dagster keeps one of identical definitions).
AUTOMATION = dg.AutomationConditionSensorDefinition(
    AUTOMATION_SENSOR,
    target=dg.AssetSelection.all(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Evaluates every asset's automation condition: each table loads its latest "
    "partition when the partition's day or hour has ended (UTC); silver and gold follow "
    "their upstream. Stop it to pause the project's loads.",
)


def build_definitions(
    project: ProjectSpec,
    resources: dict[str, object] | None = None,
    maintenance_job_name: str = JOB_NAME,
) -> dg.Definitions:
    assets = [table_asset(project, spec) for spec in project.tables]
    assets += layer_assets(project)  # the declared layers (tables file's ``layers``)
    # Landing folders: a sensor per table requests a load when new files are ready.
    sensors = [landing_sensor(project, spec) for spec in project.tables if spec.landing]
    sensors.append(AUTOMATION)
    jobs, schedules = [], []
    if project.tables:
        # Maintenance is an op job over every table, not an asset: a schedule runs it.
        maintenance = maintenance_job(project, maintenance_job_name)
        jobs.append(maintenance)
        schedules.append(maintenance_schedule(maintenance))
    # The late-rows checks due at a tick run together: one run, one Spark start. Named
    # after the maintenance job, which is unique per component (late_rows_checks[_<folder>]).
    late = late_rows_checks(project, maintenance_job_name.replace(JOB_NAME, "late_rows_checks"))
    resources = {
        "spark": spark_resource(project),
        "warehouse": DeltaWarehouse(options=dict(project.warehouse.storage_options)),
        "databases": DatabaseConnections(),
        **(resources or {}),
    }
    # What the UI shows of them holds no secret (see resource_config.py).
    refuse_literal_secrets(resources)
    return dg.Definitions(
        assets=assets,
        asset_checks=[late] if late else [],
        jobs=jobs,
        schedules=schedules,
        sensors=sensors,
        resources=resources,
        # Spark parallelizes inside a step; one process per run keeps one Spark session.
        # A dead run's pool slot is freed before the steps wait for it (dagster_layer/pools.py).
        executor=pool_aware_executor,
    )
