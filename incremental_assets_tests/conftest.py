"""Shared fixtures: one local Spark session for the whole test session, the ``orders``
source and target in a test's temporary folder, and the servers tests past one machine
share (incremental_assets_tests/servers.py): moto's S3 server, a Spark standalone cluster
and a Spark Connect server, each started once, on first use. The builders the fixtures use
(and the tests use) are in :mod:`incremental_assets_tests.builders`."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from pyspark.sql import SparkSession

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.spark import class_archive, remote
from incremental_assets.engine.spark.connect_server import ConnectServer
from incremental_assets.engine.spark_session import local_session, start_session
from incremental_assets_tests.builders import (
    DeltaSourceTable,
    FinishedDemo,
    hive_catalog_conf,
    run_demo,
)
from incremental_assets_tests.object_stores import S3Server
from incremental_assets_tests.postgres import free_port, skip_or_fail_on_ci
from incremental_assets_tests.servers import (
    INTERPRETED,
    S3_CREDENTIALS,
    STARTED,
    SUITE_GC,
    StandaloneCluster,
    cluster_unavailable,
    s3_spark_conf,
    start_connect_server,
)


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    """Where moto's S3 server will listen: reserved now, because the tests' Spark session
    takes its s3a settings at start; the server starts when a test asks for ``s3``."""
    return f"http://127.0.0.1:{free_port()}"


# Set (to anything but "" or "0"), the tests run through the shared Spark Connect server:
# ``spark`` is a Connect client session and the project's Dagster resources reach the same
# server (INCREMENTAL_ASSETS_SPARK_REMOTE). ./dev test sets it for the subset it runs that
# way (incremental_assets_tests/connect_suite.txt).
REMOTE_ENV = "INCREMENTAL_ASSETS_TEST_REMOTE"
THROUGH_CONNECT = os.environ.get(REMOTE_ENV, "") not in ("", "0")


# ./dev test runs the suite in two pytest-xdist workers, each with its own Spark session
# (--dist loadscope, with the scopes below). A test module stays on one worker, so its
# module fixtures are built once. The modules whose tests share a heavy server (the
# standalone cluster, the Connect server, the demo run) are one scope, so each server is
# started once, and it is handed out first: it is the longest (about 13 minutes in CI),
# and handed out last it would run alone at the end. (xdist's own loadgroup marks do not take
# with pytest 9, which no longer reads the node id xdist rewrites.)
SHARED_SERVERS = {"spark_cluster", "connect_server", "finished_demo"}
SHARED_MODULES = {
    "incremental_assets_tests/cluster/test_cluster_demo.py",
    "incremental_assets_tests/cluster/test_connect.py",
    "incremental_assets_tests/cluster/test_connect_sessions.py",
    "incremental_assets_tests/cluster/test_standalone.py",
    "incremental_assets_tests/demo/test_demo.py",
    "incremental_assets_tests/ui/test_browser.py",
}
SHARED_SCOPE = "shared-servers"


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


def _scope(nodeid: str) -> str:
    module = _module(nodeid)
    return SHARED_SCOPE if module in SHARED_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedServersFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if SHARED_SCOPE in self.workqueue:
                self.workqueue.move_to_end(SHARED_SCOPE, last=False)
            super()._assign_work_unit(node)

    return SharedServersFirst(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unlisted = {
        _module(item.nodeid) for item in items if SHARED_SERVERS.intersection(item.fixturenames)
    } - SHARED_MODULES
    if unlisted:
        servers = ", ".join(sorted(SHARED_SERVERS))
        raise pytest.UsageError(
            f"{', '.join(sorted(unlisted))} use a shared server ({servers}):"
            " add them to SHARED_MODULES in incremental_assets_tests/conftest.py, so that"
            " ./dev test's workers start each server once"
        )
    for item in items:
        if not THROUGH_CONNECT and item.get_closest_marker("connect_only") is not None:
            item.add_marker(
                pytest.mark.skip(reason=f"runs only through Spark Connect ({REMOTE_ENV}=1)")
            )
    if not THROUGH_CONNECT:
        return
    for item in items:
        marker = item.get_closest_marker("classic_only")
        if marker is not None:
            why = marker.args[0] if marker.args else "needs a local (classic) Spark session"
            item.add_marker(pytest.mark.skip(reason=f"through Spark Connect: {why}"))


@pytest.fixture(scope="session")
def spark(
    s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[SparkSession]:
    conf = {
        "spark.sql.shuffle.partitions": "2",
        # One session runs the whole suite. With 2g, the tables of an hour of tests kept
        # its old generation near full (1.3 GB live), and G1 (the collector then) marked
        # it ~1,000 times.
        "spark.driver.memory": "4g",
        "spark.databricks.delta.snapshotPartitions": "2",
        # Delta keeps a table's log and snapshots (their plans and encoders) in a cache of
        # 10,000 tables for 60 minutes; the suite creates thousands of tables it never
        # reads again. A test's own tables stay in a cache of 64.
        "spark.databricks.delta.delta.log.cacheSize": "64",
        # Spark keeps the last 1,000 SQL executions (plans and metrics), jobs and stages,
        # and 100,000 tasks a stage, for its UI's store even with the UI off; the suite
        # runs tens of thousands.
        "spark.sql.ui.retainedExecutions": "50",
        "spark.ui.retainedJobs": "100",
        "spark.ui.retainedStages": "100",
        "spark.ui.retainedTasks": "1000",
        # Tens of rows a load: interpreted, not compiled (servers.INTERPRETED).
        **INTERPRETED,
        # s3a (and s3://) on the moto server; the AWS SDK stays on the driver's class path.
        **s3_spark_conf(s3_endpoint),
        # Spark's catalog backed by a Hive metastore, as in production, for the tests of
        # catalog tables (engine/test_catalog_tables.py): embedded Derby in this session's
        # own folder, opened on the first catalog lookup.
        **hive_catalog_conf(tmp_path_factory.mktemp("catalog")),
    }
    # The local JVM runs the whole session: the parallel collector (servers.SUITE_GC).
    # Through Connect the setting is the server's (servers.connect_conf), not this one.
    options = conf["spark.driver.extraJavaOptions"]
    conf["spark.driver.extraJavaOptions"] = f"{options} {SUITE_GC}"
    # JDBC drivers must be on the classpath at session start (engine/sources/test_jdbc.py).
    if Path("/usr/share/java/postgresql.jar").exists():
        conf["spark.jars"] = "/usr/share/java/postgresql.jar"
    # Credentials reach S3A through the environment the JVM starts with, never the settings.
    for name, value in S3_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    if THROUGH_CONNECT:
        server: ConnectServer = request.getfixturevalue("connect_server")
        os.environ[remote.REMOTE_ENV] = server.url
        session = start_session({"spark.remote": server.url, **conf})
    else:
        started = time.monotonic()
        # This JVM runs the whole suite and exits last: it would record the driver's
        # class archive only then. The child runs record it and map it
        # (engine/spark/class_archive.py).
        before = os.environ.get(class_archive.ARCHIVE_ENV)
        os.environ[class_archive.ARCHIVE_ENV] = "off"
        try:
            session = local_session("incremental-assets-tests", **conf)
        finally:
            if before is None:
                os.environ.pop(class_archive.ARCHIVE_ENV)
            else:
                os.environ[class_archive.ARCHIVE_ENV] = before
        STARTED["local Spark session"] = time.monotonic() - started
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server at ``s3_endpoint``, shared by the session's tests."""
    missing = S3Server.missing()
    if missing:
        skip_or_fail_on_ci(missing)
    started = time.monotonic()
    server = S3Server(tmp_path_factory.mktemp("s3"), port=urlparse(s3_endpoint).port)
    STARTED["moto S3"] = time.monotonic() - started
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone cluster (Master and 2 Workers, each worker with a private /tmp)."""
    why = cluster_unavailable()
    if why:
        skip_or_fail_on_ci(why)
    cluster = StandaloneCluster(tmp_path_factory.mktemp("cluster"), env=S3_CREDENTIALS)
    STARTED["standalone cluster"] = cluster.started_in
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def connect_server(
    s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConnectServer]:
    """A Spark Connect server (local[2], Delta Lake, s3a on ``s3_endpoint``); through
    Connect it runs every test of the session, with the optimizing JIT compiler."""
    for name, value in S3_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    folder = tmp_path_factory.mktemp("connect")
    server = start_connect_server(folder, s3_endpoint, serves_a_suite=THROUGH_CONNECT)
    STARTED["Spark Connect server"] = server.started_in
    yield server
    # The sessions made on it (and on the servers tests start) would each wait out their
    # retries at exit, when PySpark clears their ML caches on the stopped server.
    remote.give_up_on_servers()
    server.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if STARTED:
        started = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in STARTED.items())
        terminalreporter.write_line(f"shared servers started: {started}")


# Rounds of the shared demo run: the demo test checks a second round and the backfill over
# both; the browser test backfills the next day, which has ended too (start is today-4d).
DEMO_ROUNDS = 2


@pytest.fixture(scope="session")
def finished_demo(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> FinishedDemo:
    """The README's demo, run once per test session in a folder of its own (minutes on 2
    cores), shared by the demo test, which asserts on what it printed and left there, and
    the browser test, which serves the folder in ``dagster dev`` and backfills in it. The
    backfill only adds to what the demo test reads (its output is kept from the run), so
    either may run first."""
    return run_demo(tmp_path_factory.mktemp("demo"), DEMO_ROUNDS)


@pytest.fixture
def orders_source(tmp_path: Path) -> DeltaSourceTable:
    return DeltaSourceTable(tmp_path / "source" / "orders")


@pytest.fixture
def target(tmp_path: Path) -> DeltaTarget:
    return DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
