"""A Spark Connect server on this machine, with the project's jars (from the cache) and
settings: Delta Lake's SQL extension and catalog, the object-store connectors its paths
need, the s3a settings, UTC. Started with pyspark's own ``spark-submit`` and the server
class pyspark ships (``spark-connect`` jar); clients reach it at ``sc://HOST:PORT``.

    ./dev spark-server [--port 15002] [--host 127.0.0.1] [--tables tables.yaml] [--master M]

prints ``sc://HOST:PORT`` once the server accepts sessions, then serves in the foreground
until stopped (Ctrl-C). The tests start their server with :func:`start` (see
incremental_assets_tests/servers.py).

Delta publishes no Connect plugin for Spark 4.1, so through this server Delta's SQL runs
(``MERGE INTO``, ``DESCRIBE HISTORY``, ``OPTIMIZE``) but not the Python ``DeltaTable`` API.
Credentials for object stores come from the server's environment, as for a local session.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from incremental_assets.engine import jars
from incremental_assets.engine.errors import ConnectorSettingError, JarsUnavailableError

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002  # Spark Connect's own default

# A local session that only starts and stops: it resolves and caches the jars, once.
_FETCH = (
    "import json, sys\n"
    "from incremental_assets.engine.spark_session import start_session\n"
    "start_session(json.loads(sys.argv[1]), 'incremental-assets-jars').stop()\n"
)


@dataclass
class ConnectServer:
    """A running server (``process``) and where clients reach it."""

    process: subprocess.Popen
    host: str
    port: int
    started_in: float

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _stop_with_parent() -> None:
    """For ``Popen(preexec_fn=...)``: on Linux the child is sent SIGTERM when the process
    that started it ends, however it ends (a killed test run leaves no server behind).
    The setting survives the exec of spark-submit into the JVM."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def started_with_parent(command: list[str], **popen: Any) -> subprocess.Popen:
    """``command`` started (``popen``: Popen's other arguments) so that it stops when this
    process ends, however it ends: under util-linux's ``setpriv --pdeathsig`` where there
    is one, so that Popen needs no code of its own in the child. A ``preexec_fn`` makes
    Popen fork instead of vfork, which runs gRPC's fork handlers in the child; in a process
    holding Spark Connect clients they restart gRPC's poller there, which can abort the
    child before its exec (grpc/grpc#43055: the server then "exits with code -6")."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv:
        return subprocess.Popen([setpriv, "--pdeathsig", "TERM", "--", *command], **popen)
    return subprocess.Popen(command, preexec_fn=_stop_with_parent, **popen)


def spark_home() -> Path:
    """The Spark distribution pyspark runs: ``SPARK_HOME``, else pyspark's own folder."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).parent


def cached_jars(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with its jar settings from the cache (engine/jars.py), placed as a local
    session places them. Jars not yet cached are fetched once first, by a local session in
    a child process (Spark's resolver, or Maven when it cannot reach the repository)."""
    plan = jars.plan(dict(conf))
    if plan.resolving:
        # Fetch with a local master: only the jars matter, not where the server runs.
        fetch = {**conf, "spark.master": "local[1]"}
        done = subprocess.run([sys.executable, "-c", _FETCH, json.dumps(fetch)])
        plan = jars.plan(dict(conf))
        if done.returncode != 0 or plan.resolving:
            raise jars.unavailable(plan, "the local session that fetches them failed")
    own = {k: v for k, v in conf.items() if k != "spark.jars.packages"}
    return jars.placed(own, plan)


def command(conf: Mapping[str, str], host: str, port: int) -> list[str]:
    """The ``spark-submit`` command line of a server with ``conf`` (jars already placed)."""
    settings = {
        **conf,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
    }
    args = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS]
    args += ["--name", "incremental-assets Spark Connect server"]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    # Spark's placeholder for "no application jar": the server class ships with Spark.
    return [*args, "spark-internal"]


def start(
    conf: Mapping[str, str],
    port: int = DEFAULT_PORT,
    host: str = "127.0.0.1",
    log: Path | None = None,
    timeout: float = 300,
) -> ConnectServer:
    """Start a server with ``conf`` (a project's or :func:`spark_session.spark_conf`'s) on
    ``host:port`` (0: a free port) and return once it accepts connections. Its output goes
    to ``log`` (default: inherited). Python UDFs run in this interpreter's Python."""
    port = port or _free_port(host)
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    out = log.open("ab") if log else None
    started = time.monotonic()
    process = started_with_parent(
        command(cached_jars(conf), host, port),
        stdout=out,
        stderr=subprocess.STDOUT if out else None,
        env=env,
    )
    server = ConnectServer(process, host, port, 0.0)
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            where = f"; its output is in {log}" if log else ""
            raise RuntimeError(
                f"the Spark Connect server exited with code {process.returncode}{where}"
            )
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            time.sleep(0.5)
            continue
        server.started_in = time.monotonic() - started
        return server
    server.stop()
    raise RuntimeError(f"the Spark Connect server did not listen on {host}:{port} in {timeout}s")


def main(argv: Sequence[str] | None = None) -> int:
    from incremental_assets.specs import SpecError

    args = _parser().parse_args(argv)
    try:
        conf = _project_conf(args.tables)
        if args.master:
            conf["spark.master"] = args.master
        server = start(conf, args.port, args.host)
    except (SpecError, ConnectorSettingError, JarsUnavailableError, RuntimeError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sys.stdout.write(
        f"Spark Connect server ready in {server.started_in:.0f}s: {server.url}\n"
        f"  (a client: SparkSession.builder.remote('{server.url}').getOrCreate()); "
        "Ctrl-C stops it.\n"
    )
    sys.stdout.flush()
    try:
        return server.process.wait()
    except KeyboardInterrupt:
        server.stop()
        return 0


def _project_conf(tables: str | None) -> dict[str, str]:
    from incremental_assets.engine.spark.settings import project_conf
    from incremental_assets.engine.spark_session import spark_conf

    path = Path(tables or os.environ.get("INCREMENTAL_ASSETS_TABLES") or "tables.yaml")
    if tables is None and not path.is_file():
        return spark_conf()  # no project here: Delta Lake and the engine's settings
    from incremental_assets.specs import load_project

    return project_conf(load_project(path))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spark-server",
        description="Start a local Spark Connect server with the project's jars and "
        "settings (Delta Lake, object-store connectors); serves until stopped.",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: a free port")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)"
    )
    parser.add_argument(
        "--tables",
        help="the project's tables file (default: INCREMENTAL_ASSETS_TABLES, else "
        "./tables.yaml when present)",
    )
    parser.add_argument(
        "--master", help="Spark master of the server's own session (default: the project's)"
    )
    return parser


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
