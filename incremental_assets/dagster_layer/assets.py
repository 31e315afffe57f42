"""One partitioned asset per table spec. The asset unpacks the Dagster context, calls the
engine, and reports the result; the logic lives in the engine.

(No ``from __future__ import annotations`` here: Dagster reads the context annotation.)
"""

import dagster as dg
from dagster_pyspark import PySparkResource

from incremental_assets.dagster_layer.checks import check_results, check_specs
from incremental_assets.dagster_layer.connections import (
    DatabaseConnections,
    connection_of,
    retry_policy,
)
from incremental_assets.dagster_layer.connections import pool_name as connection_pool
from incremental_assets.dagster_layer.landing import (
    landing_check_results,
    landing_check_specs,
    landing_metadata,
)
from incremental_assets.dagster_layer.metadata import (
    load_metadata,
    table_metadata,
    table_name_metadata,
)
from incremental_assets.dagster_layer.partitions import automation_for, load_request, partitions_for
from incremental_assets.dagster_layer.pools import mark_worker
from incremental_assets.dagster_layer.resources import DeltaWarehouse, spark_session
from incremental_assets.engine import IncrementalLoadError, run_load
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import SparkRemoteError
from incremental_assets.engine.landing import run_landing_load
from incremental_assets.engine.sources.jdbc import failures_explained
from incremental_assets.engine.spark import remote
from incremental_assets.engine.watermarks import format_value
from incremental_assets.specs import ProjectSpec, TableSpec


def pool_name(spec: TableSpec) -> str:
    """One pool per table: with a limit of 1 (dagster.yaml), runs of a table never overlap.

    Tables of a database connection share the connection's pool instead (an asset has one
    pool): its limit caps the loads that hit that database at once, and at its default of
    1 it also keeps runs of one table apart. With a higher limit two runs of one table can
    overlap; the Delta commit's conflict check then fails one of them, writing nothing.
    """
    connection = connection_of(spec)
    if connection is not None:
        return connection_pool(connection)
    return f"incremental_assets_{spec.name}"


def table_asset(project: ProjectSpec, spec: TableSpec) -> dg.AssetsDefinition:
    target_path = project.target_path(spec)
    wm = spec.watermark
    connection = connection_of(spec)
    # A landing folder has its own runner (engine/landing.py), picked here.
    landing = spec.landing is not None
    # A database connection's password is its own resource, so only its tables need it.

    @dg.asset(
        name=spec.name,
        group_name=spec.group,
        description=spec.description
        or f"{spec.strategy.kind} of {spec.source.format} source {spec.source.location} by "
        f"{wm.kind} watermark '{wm.column}' into Delta table {target_path}.",
        partitions_def=partitions_for(spec),
        backfill_policy=dg.BackfillPolicy.single_run(),
        automation_condition=automation_for(spec),
        check_specs=[*check_specs(spec), *landing_check_specs(spec)],
        kinds={"spark", "delta"},
        pool=pool_name(spec),
        retry_policy=retry_policy(connection) if connection else None,
        metadata={
            "keys": ", ".join(spec.keys),
            "strategy": spec.strategy.kind,
            "watermark": f"{wm.column} ({wm.kind})",
            "target": dg.MetadataValue.path(target_path),
            **table_name_metadata(target_path, spec.target.table),
        },
    )
    def _load(
        context: dg.AssetExecutionContext,
        spark: PySparkResource,
        warehouse: DeltaWarehouse,
        databases: DatabaseConnections,
    ) -> dg.MaterializeResult:
        mark_worker(context)
        run_spec = databases.bind(spec)
        target = warehouse.target(project, spec)
        session = spark_session(spark)
        request = load_request(context)
        unrecorded = _unrecorded_commits(context, target)
        try:
            with failures_explained(spec.name, run_spec.source):
                if landing:
                    # A landing folder is loaded by file, not by watermark window.
                    result = run_landing_load(
                        session, run_spec, target, request, warehouse.staging_dir
                    )
                else:
                    result = run_load(
                        session,
                        run_spec,
                        target,
                        request,
                        source_storage=warehouse.storage_options(),
                        staging_dir=warehouse.staging_dir,
                    )
        except IncrementalLoadError as exc:
            raise dg.Failure(
                description=str(exc),
                metadata={"table": spec.name, "fix": exc.fix or ""},
                # A lost database connection may come back; a bad spec will not.
                allow_retries=getattr(exc, "retryable", False),
            ) from exc
        except Exception as exc:
            # A Spark Connect server gone mid-run: one line naming the setting, not the
            # client's traceback (the run's Delta commit either happened whole or not at all).
            url = (spark.spark_config or {}).get("spark.remote")
            gone = exc if isinstance(exc, SparkRemoteError) else remote.lost(url, exc)
            if gone is None:
                raise
            raise dg.Failure(
                description=str(gone),
                metadata={"table": spec.name, "fix": gone.fix},
                allow_retries=True,
            ) from None
        context.log.info(
            f"{spec.name}: {result.mode} {result.window}: extracted {result.rows_extracted}, "
            f"inserted {result.rows_inserted}, updated {result.rows_updated}, watermark "
            f"{format_value(result.cursor_before)} -> {format_value(result.cursor_after)}"
        )
        metadata = {
            **load_metadata(result, target_path),
            **table_name_metadata(target_path, spec.target.table),
            **table_metadata(target.open() if target.exists() else None, column_roles(spec)),
            **landing_metadata(result),
        }
        if result.committed:
            _attribute_other_partitions(context, spec, result.rows_by_partition)
        if result.late_unchecked:
            context.log.warning(
                f"{spec.name}: late rows not checked: {result.late_unchecked}. Set "
                "delta.enableChangeDataFeed = true on the source to have them read, or "
                f"run incremental-assets reconcile {spec.name}."
            )
        if result.compaction_note:
            context.log.warning(f"{spec.name}: small files not counted: {result.compaction_note}")
        elif result.files_compacted:
            context.log.info(
                f"{spec.name}: {result.small_files} small files, compacted "
                f"{result.files_compacted} into {result.files_compacted_into} (Delta version "
                f"{result.compaction_version})"
            )
        if spec.target.purge_after and result.committed and result.deleted_share is None:
            context.log.warning(
                f"{spec.name}: the rows deletion vectors mark deleted were not judged against "
                "target.purge_after: the Delta log does not count the rows of some of the "
                "table's files (written without statistics); the maintenance job purges them"
            )
        if result.files_purged:
            context.log.info(
                f"{spec.name}: deletion vectors marked {result.deleted_share:.2%} of the rows "
                f"deleted; purged {result.files_purged} files into {result.files_purged_into} "
                f"(Delta version {result.purge_version})"
            )
        if unrecorded:
            metadata["recovered_commits"] = ", ".join(str(v) for v in unrecorded)
            context.log.warning(
                f"Delta versions {unrecorded} of {spec.name} were committed by a run that "
                "ended before Dagster recorded it; the Delta log is the truth and this run "
                "continued from it."
            )
        return dg.MaterializeResult(
            metadata=metadata,
            check_results=[
                *check_results(session, spec, target, result),
                *landing_check_results(result),
            ],
        )

    return _load


def _attribute_other_partitions(
    context: dg.AssetExecutionContext, spec: TableSpec, loaded: dict[str, int]
) -> None:
    """Rows the run loaded into partitions other than its own (an ``id`` watermark reads
    every row above its cursor; a late file brings older ones) are reported as
    materializations of those partitions, so the UI shows where rows landed."""
    own = set(context.partition_keys)
    partitions = partitions_for(spec)
    label = context.partition_key_range.start
    if len(own) > 1:
        label = f"{label}...{context.partition_key_range.end}"
    for key, count in sorted(loaded.items()):
        if key in own or not partitions.has_partition_key(key):
            continue
        context.log_event(
            dg.AssetMaterialization(
                asset_key=spec.name,
                partition=key,
                description=f"{count} row(s) of this partition loaded by the run of {label}",
                metadata={"rows_loaded": count, "loaded_by_partition": label},
            )
        )


def column_roles(spec: TableSpec) -> dict[str, str]:
    """What the spec makes of a column, for the catalog's column list."""
    roles = {spec.watermark.column: f"watermark ({spec.watermark.kind})"}
    for key in spec.keys:
        roles[key] = "key"
    return roles


def _unrecorded_commits(context: dg.AssetExecutionContext, target: DeltaTarget) -> list[int]:
    """Delta versions this loader committed after the last one Dagster recorded."""
    if not target.exists():
        return []
    event = context.instance.get_latest_materialization_event(context.asset_key)
    if event is None or event.asset_materialization is None:
        # A new Dagster instance knows no loads at all: nothing was lost, nothing to recover.
        context.log.info(
            "Dagster has no record of earlier loads of this table; its Delta log, which "
            "holds the watermark, is used as it is."
        )
        return []
    value = event.asset_materialization.metadata.get("delta_version")
    recorded = int(value.value) if value is not None else -1
    return sorted(
        int(load["version"]) for load in target.loads(limit=50) if int(load["version"]) > recorded
    )
