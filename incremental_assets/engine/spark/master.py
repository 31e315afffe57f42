"""A standalone master the project names but nothing answers at: one line naming the
setting, in a second, instead of Spark's minute of retries ("All masters are unresponsive!
Giving up.") and a stack trace about a stopped SparkContext.

Only ``spark://`` masters are checked (one, or several for a master with standbys: one
answering is enough); ``local``, ``yarn`` and ``k8s://`` masters are left to Spark.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from incremental_assets.engine.errors import SparkMasterError

SETTING = "spark.master (tables file) / INCREMENTAL_ASSETS_SPARK_MASTER"
DEFAULT_PORT = 7077  # the standalone master's own default
_TIMEOUT = 5.0


def check_master(conf: Mapping[str, str]) -> None:
    """Raise SparkMasterError when ``conf``'s ``spark://`` master accepts no connection.

    Raises:
        SparkMasterError: naming the master and the setting; nothing was started.
    """
    master = conf.get("spark.master", "")
    if not master.startswith("spark://"):
        return
    addresses = [_address(part) for part in master[len("spark://") :].split(",") if part]
    problems = []
    for host, port in addresses:
        try:
            socket.create_connection((host, port), timeout=_TIMEOUT).close()
            return
        except OSError as exc:
            problems.append(f"{host}:{port}: {exc.strerror or exc}")
    raise SparkMasterError(
        f"the Spark master {master} ({SETTING}) cannot be reached"
        f" ({'; '.join(problems) or 'no address'}); nothing was started."
        f" Fix: start the master (spark-class org.apache.spark.deploy.master.Master),"
        f" or correct {SETTING}."
    )


def _address(part: str) -> tuple[str, int]:
    host, _, port = part.strip().rpartition(":")
    if not host:
        return part.strip(), DEFAULT_PORT
    return host.strip("[]"), int(port) if port.isdigit() else DEFAULT_PORT
