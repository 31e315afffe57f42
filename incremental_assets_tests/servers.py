"""Servers the cluster tests share. Each is started once per pytest session, when a test
first asks for it (session fixtures in conftest.py), and stopped at the end:

- moto's S3 server (:class:`object_stores.S3Server`) on a port reserved when the tests'
  Spark session starts, so that session's s3a settings are fixed at its start;
- a Spark standalone cluster from pyspark's own distribution (:class:`StandaloneCluster`):
  a Master and 2 Workers as separate JVMs on loopback addresses (127.0.0.1, .2, .3), 1 core
  and 1 GB each, each worker in its own mount namespace (``unshare -m``) with a private
  ``/tmp`` (a folder of its own bind-mounted there) holding its work folder: a path only
  the driver can see fails on the executors, as on machines of their own;
- a Spark Connect server (:mod:`incremental_assets.engine.spark.connect_server`, what
  ``./dev spark-server`` starts) with the tests' jars and s3a settings.

Object-store credentials reach every JVM through the environment (moto takes any).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from incremental_assets.demo.postgres_server import free_port
from incremental_assets.engine import jars
from incremental_assets.engine.spark import connect_server, connectors
from incremental_assets.engine.spark.connect_server import (
    ConnectServer,
    spark_home,
    started_with_parent,
)
from incremental_assets.engine.spark_session import spark_conf

# Seconds each shared server took to start in this test session, for the summary line
# conftest.py prints (the CI budget counts them).
STARTED: dict[str, float] = {}

# The test servers' JVMs run short jobs on 2 shared cores: the quick JIT compiler alone
# leaves the cores to the work instead of optimizing code that runs a few times.
QUICK_JIT = "-XX:TieredStopAtLevel=1"
# A JVM that runs a whole pytest session of them (the suite's own session, the Connect
# pass's server) keeps the optimizing compiler: with the quick one alone, engine/strategies,
# dagster_layer/test_assets.py, engine/test_quality.py and engine/load/test_run.py took
# 500 s on 2 workers (943 s of CPU) against 364 s and 395 s (681 s, 747 s). It runs with
# the parallel collector rather than G1 (which marks the old generation concurrently and
# pays heavier write barriers): the same modules took 341 s, 637 s of CPU (one run: the
# CPU, not the wall time, is the clearer signal).
SUITE_GC = "-XX:+UseParallelGC"

# The tests load tens of rows at a time: Spark's code generation (Java source for each
# query's operators and expressions, compiled by Janino, then by the JIT compiler like any
# other class) costs them more than it saves. Interpreted, engine/strategies' scd2 and cdc
# modules took 339 s with 2 workers against 376 s; a cold JVM's scd2 history test 113 s
# against 130 s (JVM CPU 163 s against 196 s; even interpreted, the JIT compiler took
# 111 s of the 163). Spark computes the same either way (its own tests run both).
# Production keeps code generation, and so do cluster/test_standalone.py (generated
# classes compiled on the executors) and engine/load/test_run.py's class cache test.
INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}

# moto accepts any credentials; S3A and delta-rs read these from the environment.
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
S3_REGION = "us-east-1"
# Each worker's private /tmp holds this file, naming the worker: what a task reads there
# tells which worker ran it, and that it sees its own /tmp.
WORKER_MARK = "/tmp/incremental-assets-worker"


def s3_options(endpoint: str) -> dict[str, str]:
    """The warehouse's ``storage_options`` for the moto server at ``endpoint`` (what a user
    writes in tables.yaml; delta-rs and the s3a settings both read them)."""
    return {"endpoint": endpoint, "region": S3_REGION, "allow_http": "true"}


def s3_spark_conf(endpoint: str) -> dict[str, str]:
    """Spark settings for s3a on the moto server: the S3 connector and its settings."""
    return connectors.with_connectors({}, [connectors.CONNECTORS["s3"]], s3_options(endpoint))


def cluster_unavailable() -> str | None:
    """Why a standalone cluster with private /tmp folders cannot start here, or None."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return "unshare and mount (util-linux) are needed for the workers' private /tmp"
    probe = ["unshare", "-m", "sh", "-c", "mount --bind /tmp /tmp"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        return "unshare -m with a bind mount needs root (CI runs as root)"
    return None


@dataclass
class Worker:
    process: subprocess.Popen
    tmp: Path  # what the worker (and its executors) see as /tmp


class StandaloneCluster:
    """A Master on 127.0.0.1 and ``workers`` Workers on 127.0.0.2, .3, ...; :attr:`url` is
    the master."""

    def __init__(self, root: Path, workers: int = 2, env: Mapping[str, str] | None = None):
        self.root = root
        self.port, self.ui_port = free_port(), free_port()
        self.processes: list[subprocess.Popen] = []
        base = {
            **os.environ,
            **(env or {}),
            # The daemons only coordinate; executors get their own heap (spark.executor.memory).
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_DAEMON_JAVA_OPTS": QUICK_JIT,
            "PYSPARK_PYTHON": sys.executable,
        }
        started = time.monotonic()
        self.master = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ],
            base,
        )
        self.workers: list[Worker] = []
        self._base = base
        for n in range(1, workers + 1):
            tmp = root / f"worker-{n}" / "tmp"
            tmp.mkdir(parents=True)
            (tmp / Path(WORKER_MARK).name).write_text(f"worker-{n}")
            self.workers.append(Worker(self._start_worker(n, tmp), tmp))
        try:
            self._wait_for_workers(workers)
        except Exception:
            self.stop()
            raise
        self.started_in = time.monotonic() - started

    def _start_worker(self, n: int, tmp: Path) -> subprocess.Popen:
        # A loopback address of its own, as a machine of its own: Spark reads shuffle
        # files of another executor on the "same host" straight from its disk.
        host = f"127.0.0.{n + 1}"
        worker = [
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            host,
            "--cores",
            "1",
            "--memory",
            "1g",
            "--work-dir",
            "/tmp/work",
            "--webui-port",
            "0",
            self.url,
        ]
        # A mount namespace of its own (private propagation, unshare's default): /tmp is
        # this worker's folder, for it and the executors it starts.
        prefix = ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /tmp && exec "$@"', str(tmp)]
        env = {**self._base, "SPARK_LOCAL_IP": host}
        return self._spawn(f"worker-{n}", worker, env, prefix)

    def kill_worker(self, n: int) -> list[int]:
        """SIGKILL worker ``n`` (from 1) and the executor JVMs it started, as when its
        machine is lost; returns the executors' process ids."""
        worker = self.workers[n - 1].process
        executors = children(worker.pid)
        for pid in executors:
            os.kill(pid, signal.SIGKILL)
        worker.kill()
        worker.wait()
        return executors

    def restart_worker(self, n: int, timeout: float = 120) -> None:
        """Start worker ``n`` again (after :meth:`kill_worker`), in a mount namespace of its
        own with the same private /tmp, and wait until the master counts every worker."""
        old = self.workers[n - 1]
        if old.process.poll() is None:
            raise RuntimeError(f"worker-{n} is still running")
        host = f"127.0.0.{n + 1}"
        before = {w["id"] for w in self.master_state()["workers"]}
        self.processes.remove(old.process)
        self.workers[n - 1] = Worker(self._start_worker(n, old.tmp), old.tmp)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.workers[n - 1].process.poll() is not None:
                raise RuntimeError(f"worker-{n} exited on restart; see {self.root}")
            workers = self.master_state()["workers"]
            if any(w["id"] not in before and w["host"] == host and w["state"] == "ALIVE"
                   for w in workers):  # fmt: skip
                return
            time.sleep(0.5)
        raise RuntimeError(f"worker-{n} did not register again in {timeout}s; see {self.root}")

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def alive_workers(self) -> int:
        return int(self.master_state().get("aliveworkers", 0))

    def master_state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        # Each executor downloaded the jars (700 MB); its logs beside them stay.
        for worker in self.workers:
            for jar in (worker.tmp / "work").glob("*/*/*.jar"):
                jar.unlink()

    def _spawn(
        self, name: str, args: list[str], env: dict[str, str], prefix: list[str] | None = None
    ) -> subprocess.Popen:
        log = (self.root / f"{name}.log").open("ab")
        command = [*(prefix or []), str(spark_home() / "bin" / "spark-class"), *args]
        process = started_with_parent(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.processes.append(process)
        return process

    def _wait_for_workers(self, count: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a Spark daemon exited early; see the logs in {self.root}")
            try:
                if self.alive_workers() >= count:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{count} workers did not register in {timeout}s; see {self.root}")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a Worker's executor JVMs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # Fields after the command name, which may hold spaces: state, ppid, ...
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def cache_jars(packages: tuple[str, ...]) -> None:
    """Have Delta Lake's jars and ``packages`` in the jar cache (engine/jars.py), fetched
    with Maven when they are not yet, without starting a JVM: for a driver that starts its
    session where the network is gone (a namespace of its own)."""
    plan = jars.plan({"spark.jars.packages": ",".join(packages)})
    if plan.resolving:
        jars.fetch_with_maven(plan)


def provided_jars_conf() -> dict[str, str]:
    """Delta Lake's and the S3 connector's jars on the class path of the driver and of
    every executor, as a cluster image with them installed in ``$SPARK_HOME/jars`` has
    them: those of the jars the tests' local session resolved into the cache
    (``engine/jars.py``, a folder every worker reads) that Spark does not ship itself. With
    ``INCREMENTAL_ASSETS_JARS=provided`` an application then ships no jar (~700 MB to each
    executor otherwise). Needs the tests' ``spark`` session started first."""
    packages = ",".join(connectors.CONNECTORS["s3"].packages())
    listed = jars.plan({"spark.jars.packages": packages}).conf.get("spark.jars", "")
    if not listed:
        raise RuntimeError(f"{packages} and Delta Lake are not in {jars.cache_dir()} yet")
    # A class path comes before Spark's own jars: an older copy of one of them (Delta's
    # jackson-databind 2.13 under Spark's 2.20) would break Spark itself.
    spark_has = {_artifact(p.name) for p in (spark_home() / "jars").glob("*.jar")}
    paths = [urlparse(j).path if "://" in j else j for j in listed.split(",")]
    # Ivy names a jar <group>_<artifact>-<version>.jar.
    own = [p for p in paths if _artifact(Path(p).name.split("_", 1)[-1]) not in spark_has]
    class_path = os.pathsep.join(own)
    return {"spark.driver.extraClassPath": class_path, "spark.executor.extraClassPath": class_path}


def _artifact(jar_name: str) -> str:
    """``jackson-databind`` of ``jackson-databind-2.20.0.jar``."""
    return re.sub(r"-\d[^-]*(-\d[^-]*)?\.jar$", "", jar_name)


def cluster_app_conf() -> dict[str, str]:
    """Settings of an application (a driver) on the tests' cluster: small heaps, a driver
    the executors reach on 127.0.0.1, two shuffle partitions, and tasks held until both
    executors are up, so each job uses both workers."""
    return {
        "spark.driver.memory": "1g",
        "spark.executor.memory": "768m",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": "2",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "180s",
        "spark.driver.extraJavaOptions": QUICK_JIT,
        "spark.executor.extraJavaOptions": QUICK_JIT,
    }


POSTGRES_JAR = "/usr/share/java/postgresql.jar"


def connect_conf(endpoint: str, serves_a_suite: bool = False) -> dict[str, str]:
    """The tests' Connect server: a local master of 2 threads, small heap, the engine's
    settings (Delta Lake, UTC) and s3a on the moto server at ``endpoint``.

    ``serves_a_suite``: the server runs every test of a pytest session (./dev test's
    Connect pass, minutes of work), so its JVM keeps the optimizing JIT compiler: with the
    quick one alone engine/strategies took 357 s through it (6.0 min of CPU), with both
    267 s (4.2 min); it also runs the parallel collector (SUITE_GC: the Connect pass 191 s,
    259 s of CPU, against 204 s, 284 s). A server for a few tests runs with the quick one
    (QUICK_JIT)."""
    return spark_conf(
        {
            "spark.master": "local[2]",
            "spark.driver.memory": "1g",
            "spark.sql.shuffle.partitions": "2",
            "spark.databricks.delta.snapshotPartitions": "2",
            **INTERPRETED,
            "spark.driver.extraJavaOptions": SUITE_GC if serves_a_suite else QUICK_JIT,
            **s3_spark_conf(endpoint),
            # JDBC sources through Connect: the driver is the server's (as jars are).
            **({"spark.jars": POSTGRES_JAR} if os.path.exists(POSTGRES_JAR) else {}),
        }
    )


def start_connect_server(root: Path, endpoint: str, serves_a_suite: bool = False) -> ConnectServer:
    conf = connect_conf(endpoint, serves_a_suite)
    return connect_server.start(conf, port=0, log=root / "connect.log")
