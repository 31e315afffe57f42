"""An S3-compatible server for tests and benchmarks: moto's ``moto_server`` (the dev
extra) in a subprocess on a free local port, over HTTP. Its request log tells which
objects were read."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from dagster_deltalake import S3Config

from incremental_assets.defs.resources import DeltaWarehouse

_BINARY = Path(sys.executable).parent / "moto_server"


class S3Server:
    def __init__(self, log: Path):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.log = log
        self.process = subprocess.Popen(
            [str(_BINARY), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            self.process.kill()
            raise RuntimeError(f"moto_server did not start; see {log}")
        self.endpoint = f"http://127.0.0.1:{self.port}"
        import boto3  # installed with moto

        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        )

    @staticmethod
    def available() -> bool:
        return _BINARY.exists()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

    def warehouse(self) -> DeltaWarehouse:
        """The warehouse resource a project on this server uses (plain http needs
        ``allow_http``, which dagster-deltalake's S3Config lacks)."""
        storage = S3Config(
            endpoint=self.endpoint,
            access_key_id="test",
            secret_access_key="test",
            region="us-east-1",
        )
        return DeltaWarehouse(storage=storage, options={"allow_http": "true"})

    def put(self, bucket: str, key: str, text: str) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=text.encode())

    def keys(self, bucket: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def object_reads(self, bucket: str, key: str | None = None) -> int:
        """GET requests the server logged for one object (or every object) of ``bucket``."""
        plain = re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text())  # werkzeug colours
        target = re.escape(key) if key else r"[^ ?]+"
        return len(re.findall(rf'"GET /{bucket}/{target} HTTP', plain))
