"""Spark settings the engine relies on, and how a session starts: with Delta Lake's
extension and catalog, its jars from the cache (engine/jars.py), locally for scripts and
tests or as the Dagster resource's session."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Mapping

from pyspark import SparkContext
from pyspark.sql import SparkSession

from incremental_assets.engine import jars
from incremental_assets.engine.errors import SessionSettingError
from incremental_assets.engine.spark import class_archive, runtime_conf
from incremental_assets.engine.spark.cores import local_cores
from incremental_assets.engine.spark.master import check_master

# Settings without which results would differ from machine to machine.
REQUIRED_CONF: dict[str, str] = {
    # Time is UTC end to end; never the machine's zone.
    "spark.sql.session.timeZone": "UTC",
    # Parquet timestamps as UTC-adjusted microseconds, as Arrow and Delta expect them.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # Delta partition values are read as text and cast to the table's types.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    # Spark would otherwise replace ${env:NAME}, ${system:NAME} and ${<setting>} in SQL text
    # (a rule's check, a path in OPTIMIZE/VACUUM) with the machine's environment
    # variables, Java system properties and settings: secrets, shown in results and errors.
    "spark.sql.variable.substitute": "false",
    # Timestamps pushed down to a JDBC database are rendered in the session zone (UTC),
    # not the driver JVM's default zone, which no public API (nor Spark Connect) can read.
    "spark.sql.datetime.java8API.enabled": "true",
}

# Why each required setting matters, for the error when a session keeps another value.
_WHY: dict[str, str] = {
    "spark.sql.session.timeZone": "time is UTC end to end, never the machine's zone",
    "spark.sql.parquet.outputTimestampType": "Parquet timestamps are written as UTC "
    "microseconds, as Arrow and Delta expect them",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "Delta partition values are "
    "read as text and cast to the table's types",
    "spark.sql.variable.substitute": "with it on, Spark substitutes environment variables, "
    "Java system properties and settings (${env:NAME}, ${system:NAME}, ${spark.<setting>}) "
    "into SQL text, which could expose a secret of the machine in a result or an error",
    "spark.sql.datetime.java8API.enabled": "timestamps pushed down to a JDBC database are "
    "rendered in the session zone (UTC), not the driver JVM's default zone",
}

# Spark's Delta Lake: DeltaTable, MERGE/OPTIMIZE/VACUUM SQL and format("delta").
DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"

LOCAL_DEFAULTS: dict[str, str] = {
    "spark.master": os.environ.get("INCREMENTAL_ASSETS_SPARK_MASTER", "local[*]"),
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "ERROR",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.memory": os.environ.get("INCREMENTAL_ASSETS_DRIVER_MEMORY", "4g"),
    "spark.sql.adaptive.enabled": "true",
    # Adaptive execution merges a shuffle's small partitions, but by default aims at one a
    # core, none smaller than 1 MB ("parallelism first"): a 50,000-row increment (about
    # 2 MB shuffled) was written as 2 files on 2 cores; one of 8 MB would be 8 on 8. With
    # partitions of at least 16 MB, an increment of up to 16 MB shuffled is one file (30
    # append runs at 5M, compacted after runs 10 and 20: 27 files before, 17 after). A
    # shuffle of less than 16 MB a core runs fewer tasks than there are cores: on 8
    # cores, below 128 MB (docs/benchmark.md, "Files a run adds").
    "spark.sql.adaptive.coalescePartitions.minPartitionSize": "16m",
    # Delta rebuilds a table's state from its log in this many tasks (default 50): on a
    # few local cores, most of a small load's time went to them. A local master's own
    # cores, when fewer (spark_conf).
    SNAPSHOT_PARTITIONS: "8",
    # Delta's VACUUM (the full kind, which lists the table's folder) and Spark's listing
    # of many paths run this many tasks (default 10,000): a full VACUUM of a table of a
    # few files took 28 s here, 4 s with 8.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
    # PySpark 4 records the Python call site of every Column it builds (a stack walk and
    # extra JVM calls each), only to name it in an analysis error's query context; a
    # run builds thousands of Columns, and the engine's errors name the table and the
    # step themselves. Off: ~5% of a small run's time here.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Each SQL execution's start event (and adaptive execution's plan updates) carries its
    # plan as text, for the UI's SQL tab, even with the UI off: the "formatted" layout
    # (Spark's default) took ~6% of a small run's driver time in a profile here, the
    # plain tree less (benchmarks/small_run_settings.py: a 20-row first load 0.93x, an
    # incremental run 0.97x, within the noise). A session with the UI on may set
    # "formatted" back.
    "spark.sql.ui.explainMode": "simple",
    # Spark keeps the classes it generates for a query's operators and expressions in a
    # cache of this many (default 100), shared by every job of the JVM. One small run uses
    # more than 100 (the probe, the staging write, Delta's snapshot and MERGE), so with
    # the default each run evicted what the next would reuse and compiled about 70
    # classes again (some 25 ms each); with room for them, a warm run compiled 14 and its
    # step took about a second less. A class is a few kilobytes.
    "spark.sql.codegen.cache.maxEntries": "2000",
}


def spark_conf(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Local defaults, Delta Lake's extension, then ``overrides``, then the settings
    correctness depends on. A ``local`` master with fewer than 8 cores rebuilds Delta's
    snapshots in as many tasks as it has cores (engine/spark/cores.py), unless
    ``overrides`` says otherwise."""
    conf = {**LOCAL_DEFAULTS, **DELTA_CONF, **(overrides or {}), **REQUIRED_CONF}
    cores = local_cores(conf["spark.master"])
    if cores is not None and SNAPSHOT_PARTITIONS not in (overrides or {}):
        # Tasks beyond the cores queue behind them: on 2 cores the old fixed 8 made a small
        # run 1.16x slower than 2 (benchmarks/small_run_settings.py).
        conf[SNAPSHOT_PARTITIONS] = str(min(int(LOCAL_DEFAULTS[SNAPSHOT_PARTITIONS]), cores))
    return conf


def start_session(
    conf: dict[str, str], app_name: str | None = None, across_processes: bool = False
) -> SparkSession:
    """A session with ``conf`` and Delta Lake's jars: from the cache, or resolved once by
    Spark (said on stderr), or, when Spark's resolver cannot reach the repository, fetched
    by Maven into the cache. With ``spark.remote`` in ``conf``, a session on that Spark
    Connect server instead (engine/spark/remote.py): jars are then the server's, and with
    ``across_processes`` (a Dagster run's) the session an earlier run's process left."""
    if conf.get("spark.remote"):
        from incremental_assets.engine.spark import remote

        session = remote.connect_session(conf["spark.remote"], conf, across_processes)
        try:
            ensure_required_conf(session)
        except Exception as exc:
            if remote.server_gone(exc):
                raise remote.unreachable(conf["spark.remote"], exc) from None
            raise
        return session
    check_master(conf)
    plan = jars.plan(conf)
    if not plan.resolving:
        return _start_local(conf, plan, app_name)
    with jars.resolving_alone():
        # Another process may have filled the cache while this one waited.
        return _start_local(conf, jars.plan(conf), app_name)


def _start_local(conf: dict[str, str], plan: jars.JarPlan, app_name: str | None) -> SparkSession:
    running = SparkContext._active_spark_context is not None
    own = {k: v for k, v in conf.items() if k != "spark.jars.packages"}
    if plan.resolving:
        jars.announce(plan)
    try:
        session = _build(jars.placed(own, plan), app_name)
    except Exception as exc:
        if not plan.resolving:
            raise
        jars.fetch_with_maven(plan)
        # Read back as a later start reads the cache: the user's own jars (spark.jars: a
        # JDBC driver) first, which the fetched jars' list alone would replace.
        plan = jars.plan(conf)
        if plan.resolving:
            raise jars.unavailable(plan, "the jars Maven fetched could not be read back") from exc
        session = _build(jars.placed(own, plan), app_name)
    else:
        if plan.resolving:
            jars.record(plan, ",".join(_started_jars(session)))
    # The log level is spark.log.level (LOCAL_DEFAULTS), applied as the JVM starts.
    # getOrCreate may hand back a session started elsewhere, with its own settings.
    ensure_required_conf(session)
    if running:
        _warn_of_missing_connectors(session, plan)
    return session


def _started_jars(session: SparkSession) -> list[str]:
    """The jars the session's JVM started with, from its context's settings (those
    getOrCreate was given since are in the session's settings only, and changed nothing on
    the class path): ``spark.jars``, and ``spark.repl.local.jars``, where spark-submit keeps
    the packages it resolved beside the user's own jars (the user's ``spark.jars``, a JDBC
    driver's say, is set again as the session starts and replaces the merged list there)."""
    started = session.sparkContext.getConf()
    found = [started.get(key) or "" for key in ("spark.jars", "spark.repl.local.jars")]
    return [j for listed in found for j in listed.split(",") if j.strip()]


class ConnectorsMissingWarning(RuntimeWarning):
    """A session already running in this process lacks connectors the project needs."""


def _warn_of_missing_connectors(session: SparkSession, plan: jars.JarPlan) -> None:
    """Say so when the session ``getOrCreate`` handed back (its JVM started earlier in this
    process: a notebook's, a test's) has no jar of a connector the project asks for: its
    class path cannot change now, and the first path needing one would fail with a
    ``ClassNotFoundException`` far from here. Jars named by a folder or provided by the
    cluster (``INCREMENTAL_ASSETS_JARS``) are not listed, so not checked."""
    if plan.manifest is None:
        return
    listed = [
        *_started_jars(session),
        *(session.sparkContext.getConf().get("spark.driver.extraClassPath") or "").split(
            os.pathsep
        ),
    ]
    # jars.missing reads file names only: URIs and paths alike.
    lacking = jars.missing(plan.packages[1:], [j for j in listed if j.strip()])
    if lacking:
        warnings.warn(
            f"the Spark session already running in this process has no {', '.join(lacking)}"
            " (its class path was fixed when it started), so paths needing them will fail"
            " with ClassNotFoundException. Fix: start this process's first session with them"
            " (spark.jars.packages), or run the project in a process of its own",
            ConnectorsMissingWarning,
            stacklevel=3,
        )


def _build(conf: dict[str, str], app_name: str | None) -> SparkSession:
    # The driver JVM this starts maps the classes an earlier start loaded (or records them).
    archived, started = class_archive.with_archive(conf)
    try:
        session = _get_or_create(archived, app_name)
    except Exception:
        if archived == conf:
            raise
        # A JVM that cannot use the archive: without it (and without it from now on).
        class_archive.forget(archived)
        return _get_or_create(conf, app_name)
    if started is not None:
        started()
    return session


def _get_or_create(conf: dict[str, str], app_name: str | None) -> SparkSession:
    builder = SparkSession.builder
    if app_name:
        builder = builder.appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def local_session(app_name: str = "incremental-assets", **overrides: str) -> SparkSession:
    return start_session(spark_conf(overrides), app_name)


def ensure_required_conf(session: SparkSession) -> None:
    """Apply the required settings to a session (one the project started, or one made
    elsewhere and handed over), then read them back: checked, not assumed.

    Raises:
        SessionSettingError: the session still holds another value for one of them (a
            cluster or server that refuses the change); nothing has run on it.
    """
    # One read of the required settings (through Spark Connect, one round trip for all of
    # them, not every setting the session holds); only what differs is set, and read back.
    current = runtime_conf.get_many(session, REQUIRED_CONF)
    differing = [key for key in REQUIRED_CONF if not _same(current.get(key), REQUIRED_CONF[key])]
    for key in differing:
        # A session that refuses the change is reported from the read-back below.
        with contextlib.suppress(Exception):
            session.conf.set(key, REQUIRED_CONF[key])
    refuse_unapplied({**current, **runtime_conf.get_many(session, differing)})


def refuse_unapplied(current: Mapping[str, str | None]) -> None:
    """Raise SessionSettingError for the first required setting whose ``current`` value (as
    read back from a session) differs from :data:`REQUIRED_CONF`'s."""
    for key, wanted in REQUIRED_CONF.items():
        actual = current.get(key)
        if not _same(actual, wanted):
            raise SessionSettingError(key, actual, wanted, _WHY[key])


def _same(actual: str | None, wanted: str) -> bool:
    return actual is not None and actual.strip().lower() == wanted.lower()
