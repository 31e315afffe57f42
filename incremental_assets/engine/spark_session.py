"""Spark settings the engine relies on, and a local session for scripts and tests."""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

# Settings without which results would differ from machine to machine.
REQUIRED_CONF: dict[str, str] = {
    # Time is UTC end to end; never the machine's zone.
    "spark.sql.session.timeZone": "UTC",
    # Parquet timestamps as UTC-adjusted microseconds, as Arrow and Delta expect them.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # Delta partition values are read as text and cast to the table's types.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
}

LOCAL_DEFAULTS: dict[str, str] = {
    "spark.master": os.environ.get("INCREMENTAL_ASSETS_SPARK_MASTER", "local[*]"),
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "ERROR",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.memory": os.environ.get("INCREMENTAL_ASSETS_DRIVER_MEMORY", "4g"),
    "spark.sql.adaptive.enabled": "true",
}


def spark_conf(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Local defaults, then ``overrides``, then the settings correctness depends on."""
    return {**LOCAL_DEFAULTS, **(overrides or {}), **REQUIRED_CONF}


def local_session(app_name: str = "incremental-assets", **overrides: str) -> SparkSession:
    builder = SparkSession.builder.appName(app_name)
    for key, value in spark_conf(overrides).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def ensure_required_conf(session: SparkSession) -> None:
    """Apply the runtime-settable required settings to a session made elsewhere."""
    for key, value in REQUIRED_CONF.items():
        session.conf.set(key, value)
