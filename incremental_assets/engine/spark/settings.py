"""A project's Spark settings from its spec, in one place: what the Dagster resource, the
CLI, the demo and the Connect server start Spark with."""

from __future__ import annotations

import os
from collections.abc import Mapping

from incremental_assets.engine.spark import connectors
from incremental_assets.engine.spark.remote import REMOTE_ENV
from incremental_assets.engine.spark_session import REQUIRED_CONF, spark_conf
from incremental_assets.specs import ProjectSpec

MASTER_ENV = "INCREMENTAL_ASSETS_SPARK_MASTER"


def project_paths(project: ProjectSpec) -> list[str]:
    """Every location the project's runs read or write: the warehouse root, each target,
    each source with a path (Delta tables, file folders, landing folders)."""
    paths = [project.warehouse.root]
    for spec in project.tables:
        paths.append(project.target_path(spec))
        if spec.source.path is not None:
            paths.append(str(spec.source.path))
    return paths


def project_conf(
    project: ProjectSpec, overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The Spark settings of every session of ``project``: its ``spark.conf``, its master
    (``INCREMENTAL_ASSETS_SPARK_MASTER`` first, then ``spark.master``, else ``local[*]``),
    ``overrides``, the object-store connectors its paths need (with the s3a settings from
    ``warehouse.storage_options``; the project's own settings win), then the engine's.
    With a Spark Connect server (``INCREMENTAL_ASSETS_SPARK_REMOTE`` first, then
    ``spark.remote``): ``spark.remote``, the project's settings and the engine's only."""
    remote = os.environ.get(REMOTE_ENV) or project.spark.remote
    if remote:
        # Jars, connectors, the master and object-store settings are the server's.
        return {**project.spark.conf, **(overrides or {}), "spark.remote": remote, **REQUIRED_CONF}
    conf = dict(project.spark.conf)
    master = os.environ.get(MASTER_ENV) or project.spark.master
    if master:
        conf["spark.master"] = master
    conf.update(overrides or {})
    paths = project_paths(project)
    conf = connectors.with_connectors(
        conf, connectors.needed(paths), project.warehouse.storage_options, paths
    )
    return spark_conf(conf)
