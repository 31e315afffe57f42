"""Delta maintenance as a Dagster job: one op per table, compacting and vacuuming the table
and its side tables, with the files before and after as metadata (on the op's output and as
an observation of the table's asset); and a daily schedule, stopped until turned on.

Each op runs in its table's concurrency pool, so it never overlaps a load of that table.
Run one table alone by selecting its op (``maintain_<table>``) in the launchpad.

(No ``from __future__ import annotations`` here: Dagster reads the config and resource
annotations.)
"""

import dagster as dg
from dagster_pyspark import PySparkResource
from pydantic import Field

from incremental_assets.dagster_layer.assets import pool_name
from incremental_assets.dagster_layer.pools import mark_worker
from incremental_assets.dagster_layer.resources import DeltaWarehouse, spark_session
from incremental_assets.engine.delta_lake.maintenance import (
    MaintenanceSettings,
    maintain_table,
)
from incremental_assets.engine.errors import MaintenanceError
from incremental_assets.specs import ProjectSpec, TableSpec

JOB_NAME = "maintain_tables"


class MaintenanceConfig(dg.Config):
    """Per table, in the run config under ``ops: maintain_<table>: config:``."""

    compact: bool = Field(default=True, description="Bin-pack small files into larger ones.")
    purge: bool = Field(
        default=True,
        description="First rewrite the files whose rows deletion vectors mark deleted "
        "(REORG ... APPLY (PURGE)), so reads stop filtering them; nothing to do on tables "
        "without deletion vectors.",
    )
    zorder_by_keys: bool = Field(
        default=False,
        description="Rewrite the whole table sorted by its keys (narrow key ranges per file, "
        "so merges rewrite fewer files) instead of bin-packing small files only.",
    )
    retention_hours: int | None = Field(
        default=168,
        description="Vacuum files the table removed more than this many hours ago; null "
        "skips the vacuum.",
    )
    enforce_retention: bool = Field(
        default=True,
        description="Refuse a retention shorter than the table's "
        "delta.deletedFileRetentionDuration (7 days unless set).",
    )


def maintenance_op(project: ProjectSpec, spec: TableSpec) -> dg.OpDefinition:
    @dg.op(
        name=f"maintain_{spec.name}",
        description=f"Compact and vacuum the Delta table of {spec.name} and its side tables.",
        pool=pool_name(spec),
        out=dg.Out(dg.Nothing),
    )
    def _maintain(
        context: dg.OpExecutionContext,
        config: MaintenanceConfig,
        spark: PySparkResource,
        warehouse: DeltaWarehouse,
    ) -> dg.Output:
        mark_worker(context)
        settings = MaintenanceSettings(
            compact=config.compact,
            purge=config.purge,
            zorder=tuple(spec.keys) if config.zorder_by_keys else (),
            file_bytes=spec.target.file_size,
            retention_hours=config.retention_hours,
            enforce_retention=config.enforce_retention,
        )
        try:
            results = maintain_table(
                spark_session(spark), warehouse.target(project, spec), settings
            )
        except MaintenanceError as exc:
            raise dg.Failure(
                description=str(exc), metadata={"table": spec.name, "fix": exc.fix or ""}
            ) from exc
        metadata: dict[str, object] = {}
        for result in results:
            # Side tables' figures are prefixed with their kind: tombstones_, changes_.
            side = result.table.removeprefix(f"{spec.name}__")
            metadata.update(result.metadata("" if result.table == spec.name else f"{side}_"))
            context.log.info(
                f"{result.table}: files {result.files_before} -> {result.files_after}, "
                f"{result.files_vacuumed} removed files vacuumed"
            )
            if result.vacuum_note:
                context.log.warning(f"{result.table}: {result.vacuum_note}")
        if not results:
            metadata["skipped"] = "the table has not been loaded yet"
        else:
            context.log_event(dg.AssetObservation(asset_key=spec.name, metadata=metadata))
        return dg.Output(None, metadata=metadata)

    return _maintain


def maintenance_job(project: ProjectSpec, name: str = JOB_NAME) -> dg.JobDefinition:
    ops = [maintenance_op(project, spec) for spec in project.tables]

    @dg.job(
        name=name,
        description="Delta maintenance of every table: compaction of small files, then "
        "vacuum of files removed longer ago than the retention.",
    )
    def _job() -> None:
        for op in ops:
            op()

    return _job


def maintenance_schedule(job: dg.JobDefinition) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name=f"{job.name}_schedule",
        job=job,
        cron_schedule="0 3 * * *",
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Daily Delta maintenance at 03:00 UTC (stopped until turned on).",
    )
