"""Shared fixtures: one local Spark session for the whole test session, and the ``orders``
source and target in a test's temporary folder. The builders they use (and the tests use)
are in :mod:`incremental_assets_tests.builders`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.spark_session import local_session
from incremental_assets_tests.builders import DeltaSourceTable


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "2g",
        "spark.databricks.delta.snapshotPartitions": "2",
    }
    # JDBC drivers must be on the classpath at session start (engine/sources/test_jdbc.py).
    if Path("/usr/share/java/postgresql.jar").exists():
        conf["spark.jars"] = "/usr/share/java/postgresql.jar"
    session = local_session("incremental-assets-tests", **conf)
    yield session
    session.stop()


@pytest.fixture
def orders_source(tmp_path: Path) -> DeltaSourceTable:
    return DeltaSourceTable(tmp_path / "source" / "orders")


@pytest.fixture
def target(tmp_path: Path) -> DeltaTarget:
    return DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
