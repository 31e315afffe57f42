"""A throwaway S3 server for the demo's warehouse (``./dev demo --s3``): moto's server (a
dev dependency, as in the tests) on a free port of 127.0.0.1, with one bucket, stopped
when the demo ends. Spark reaches it through S3A, delta-rs through its own client; both
take the endpoint from the warehouse's ``storage_options`` and credentials from the
standard AWS environment variables, set to moto's dummy ones when unset.

Example:
    >>> with local_s3() as (root, options):  # doctest: +SKIP
    ...     print(root)  # s3://demo-warehouse/warehouse
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from incremental_assets.engine.spark.connect_server import started_with_parent

BUCKET = "demo-warehouse"
REGION = "us-east-1"
# moto accepts any credentials; these are only set when the environment has none.
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo"}


class S3Unavailable(RuntimeError):
    """No local S3 server could be started (moto's server is not installed, or failed)."""


def moto_server() -> str:
    """The ``moto_server`` command beside this Python, else on ``PATH``."""
    beside = Path(sys.executable).parent / "moto_server"
    found = str(beside) if beside.exists() else shutil.which("moto_server")
    if found is None:
        raise S3Unavailable(
            "moto_server is not installed: install the dev extra (pip install -e '.[dev]', "
            "which ./dev does), or run the demo with --warehouse s3://YOUR-BUCKET/PREFIX "
            "and your own credentials"
        )
    return found


@contextmanager
def local_s3(log_dir: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """Start the server, create the bucket; yield the warehouse root and its
    ``storage_options``; stop the server (its objects go with it)."""
    command = moto_server()
    for name, value in DUMMY_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "moto.log"
    process = started_with_parent(  # a killed demo leaves no server behind
        [command, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        _wait_for(port, process, log)
        _create_bucket(endpoint)
        yield (
            f"s3://{BUCKET}/warehouse",
            {
                "endpoint": endpoint,
                "region": REGION,
                "allow_http": "true",
            },
        )
    finally:
        process.terminate()
        process.wait(timeout=10)


def _wait_for(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None:
                break
            time.sleep(0.2)
    process.kill()
    raise S3Unavailable(f"moto_server did not start on port {port}; its log: {log}")


def _create_bucket(endpoint: str) -> None:
    import boto3  # installed with moto

    boto3.client("s3", endpoint_url=endpoint, region_name=REGION).create_bucket(Bucket=BUCKET)
