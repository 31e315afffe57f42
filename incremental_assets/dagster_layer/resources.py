"""Resources: the Spark session (dagster-pyspark) and where Delta tables live."""

from __future__ import annotations

from typing import Union

import dagster as dg
from dagster_deltalake import AzureConfig, GcsConfig, LocalConfig, S3Config
from dagster_pyspark import PySparkResource
from pydantic import Field

from incremental_assets.dagster_layer.workers import record_worker
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.spark.settings import project_conf
from incremental_assets.engine.spark_session import ensure_required_conf, start_session
from incremental_assets.specs import ProjectSpec, TableSpec

StorageConfig = Union[LocalConfig, S3Config, AzureConfig, GcsConfig]


class DeltaWarehouse(dg.ConfigurableResource):
    """Storage settings for the Delta targets, Delta sources and landing folders, shared
    with dagster-deltalake so local folders and object stores are configured the same way.

    Example:
        .. code-block:: python

            DeltaWarehouse(storage=S3Config(bucket="lake", region="eu-west-1"))
    """

    storage: StorageConfig = Field(
        default_factory=LocalConfig,
        discriminator="provider",
        description="delta-rs storage options: local, s3, azure or gcs.",
    )
    options: dict[str, str] = Field(
        default_factory=dict,
        description="More delta-rs storage options, added to storage's: ones its config "
        "lacks, e.g. {'allow_http': 'true'} for an S3-compatible endpoint over plain http "
        "(MinIO on premises).",
    )
    staging_dir: str | None = Field(
        default=None,
        description="Folder (local path or object-store URI) under which each table's runs "
        "stage their increments, in `<staging_dir>/<table>__staging`; every executor must reach it "
        "(default: `<target>__staging` beside each target, on the warehouse's own store).",
    )

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Names an in-process run's process, as the Spark resource does, for steps that
        # take the warehouse without Spark.
        record_worker(context.instance, context.run_id)

    def storage_options(self) -> dict[str, str]:
        options = self.storage.str_dict()
        options.pop("provider", None)
        return {**options, **self.options}

    def target(self, project: ProjectSpec, spec: TableSpec) -> DeltaTarget:
        return DeltaTarget(
            spec.name,
            project.target_path(spec),
            self.storage_options(),
            read_by=project.readers_of(spec),
            catalog_table=spec.target.table,
        )


class DeltaSparkResource(PySparkResource):
    """dagster-pyspark's resource, started the engine's way: with Delta Lake's extension
    and its jars from the cache (fetched once; see engine/jars.py)."""

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # A run executed in process by Dagster's own executor (dg.materialize) reaches no
        # project code before its steps queue for their pool slots but this set-up: name
        # its process now, so a run killed while queued is known dead (dagster_layer/pools.py).
        record_worker(context.instance, context.run_id)
        # Through Spark Connect, the session the last run's process left (its compiled
        # classes): engine/spark/session_slots.py.
        self._spark_session = start_session(dict(self.spark_config), across_processes=True)


def spark_resource(project: ProjectSpec) -> PySparkResource:
    """dagster-pyspark's resource with the project's Spark settings (see
    engine/spark/settings.py: master, connectors, s3a, and the ones the engine needs)."""
    return DeltaSparkResource(spark_config=project_conf(project))


def spark_session(resource: PySparkResource):
    """The resource's session with the settings the engine needs: checked when the
    project's resource started it (start_session), here when the resource is another
    (a PySparkResource made elsewhere and handed over)."""
    session = resource.spark_session
    if not isinstance(resource, DeltaSparkResource):
        ensure_required_conf(session)
    return session
