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
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from incremental_assets.demo.postgres_server import free_port
from incremental_assets.engine.spark import connect_server, connectors
from incremental_assets.engine.spark.connect_server import (
    ConnectServer,
    spark_home,
    stop_with_parent,
)
from incremental_assets.engine.spark_session import spark_conf

# Seconds each shared server took to start in this test session, for the summary line
# conftest.py prints (the CI budget counts them).
STARTED: dict[str, float] = {}

# The test servers' JVMs run short jobs on 2 shared cores: the quick JIT compiler alone
# leaves the cores to the work instead of optimizing code that runs a few times.
QUICK_JIT = "-XX:TieredStopAtLevel=1"

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
        for n in range(1, workers + 1):
            tmp = root / f"worker-{n}" / "tmp"
            tmp.mkdir(parents=True)
            (tmp / Path(WORKER_MARK).name).write_text(f"worker-{n}")
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
            # A mount namespace of its own (private propagation, unshare's default): /tmp
            # is this worker's folder, for it and the executors it starts.
            prefix = ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /tmp && exec "$@"', str(tmp)]
            env = {**base, "SPARK_LOCAL_IP": host}
            self.workers.append(Worker(self._spawn(f"worker-{n}", worker, env, prefix), tmp))
        try:
            self._wait_for_workers(workers)
        except Exception:
            self.stop()
            raise
        self.started_in = time.monotonic() - started

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def alive_workers(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return int(json.load(r).get("aliveworkers", 0))

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
        log = (self.root / f"{name}.log").open("wb")
        command = [*(prefix or []), str(spark_home() / "bin" / "spark-class"), *args]
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=stop_with_parent
        )
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


POSTGRES_JAR = "/usr/share/java/postgresql.jar"


def connect_conf(endpoint: str) -> dict[str, str]:
    """The tests' Connect server: a local master of 2 threads, small heap, the engine's
    settings (Delta Lake, UTC) and s3a on the moto server at ``endpoint``."""
    return spark_conf(
        {
            "spark.master": "local[2]",
            "spark.driver.memory": "1g",
            "spark.sql.shuffle.partitions": "2",
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.driver.extraJavaOptions": QUICK_JIT,
            **s3_spark_conf(endpoint),
            # JDBC sources through Connect: the driver is the server's (as jars are).
            **({"spark.jars": POSTGRES_JAR} if os.path.exists(POSTGRES_JAR) else {}),
        }
    )


def start_connect_server(root: Path, endpoint: str) -> ConnectServer:
    return connect_server.start(connect_conf(endpoint), port=0, log=root / "connect.log")
