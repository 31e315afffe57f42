"""Definitions from a project spec: assets, per-table jobs and schedules, the maintenance
job and its schedule, resources."""

from __future__ import annotations

import dagster as dg

from incremental_assets.defs.assets import table_asset
from incremental_assets.defs.connections import connection_resources
from incremental_assets.defs.landing import landing_sensor
from incremental_assets.defs.maintenance import maintenance_job, maintenance_schedule
from incremental_assets.defs.partitions import partitions_for
from incremental_assets.defs.pools import pool_aware_executor
from incremental_assets.defs.resources import DeltaWarehouse, spark_resource
from incremental_assets.demo.invoice_assets import refined_layers
from incremental_assets.specs import ProjectSpec


def build_definitions(
    project: ProjectSpec, resources: dict[str, object] | None = None
) -> dg.Definitions:
    assets = [table_asset(project, spec) for spec in project.tables]
    assets += refined_layers(project)  # silver and gold after landing tables that ask
    jobs = [
        dg.define_asset_job(
            f"load_{spec.name}", selection=[spec.name], partitions_def=partitions_for(spec)
        )
        for spec in project.tables
    ]
    schedules = [dg.build_schedule_from_partitioned_job(job) for job in jobs]
    # Landing folders: a sensor per table starts its load job when new files are ready.
    sensors = [
        landing_sensor(project, spec, job)
        for spec, job in zip(project.tables, jobs, strict=True)
        if spec.landing is not None
    ]
    if project.tables:
        maintenance = maintenance_job(project)
        jobs.append(maintenance)
        schedules.append(maintenance_schedule(maintenance))
    return dg.Definitions(
        assets=assets,
        jobs=jobs,
        schedules=schedules,
        sensors=sensors,
        resources={
            "spark": spark_resource(project.spark),
            "warehouse": DeltaWarehouse(options=dict(project.warehouse.storage_options)),
            **connection_resources(project),
            **(resources or {}),
        },
        # Spark parallelizes inside a step; one process per run keeps one Spark session.
        # A dead run's pool slot is freed before the steps wait for it (defs/pools.py).
        executor=pool_aware_executor,
    )
