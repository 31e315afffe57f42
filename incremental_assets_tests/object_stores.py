"""Object-store servers for the tests, each in a subprocess on a free local port, over
HTTP: moto's S3 server (``moto_server``, from the dev extra) and Azurite, Microsoft's
Azure Storage emulator (``azurite-blob``, from npm: ``npm install -g azurite``). Their
request logs tell which objects were read."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from dagster_deltalake import AzureConfig, S3Config

from incremental_assets.dagster_layer.resources import DeltaWarehouse
from incremental_assets.engine.spark.connect_server import started_with_parent

_MOTO = Path(sys.executable).parent / "moto_server"
# Azurite's fixed development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Server:
    name = ""
    scheme = ""

    def __init__(self, command: list[str], port: int, log: Path, request_log: Path):
        self.port, self.log, self.request_log = port, log, request_log
        self.process = started_with_parent(  # a killed test run leaves no server behind
            command, stdout=subprocess.DEVNULL, stderr=log.open("w")
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.2)
        self.process.kill()
        raise RuntimeError(f"{command[0]} did not start; see {log}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            # Azurite has been seen to outlive a TERM by more than 10 s under load (CI,
            # 2026-12-03): the test's work was done, so the server is killed, not waited for.
            self.process.kill()
            self.process.wait(timeout=10)

    def folder(self, bucket: str, prefix: str) -> str:
        return f"{self.scheme}://{bucket}/{prefix}"

    def _count(self, pattern: str) -> int:
        plain = re.sub(r"\x1b\[[0-9;]*m", "", self.request_log.read_text())  # colours
        return len(re.findall(pattern, plain))


class S3Server(_Server):
    name, scheme = "s3", "s3"

    def __init__(self, root: Path, port: int | None = None):
        # ``port``: one reserved earlier, e.g. when Spark's s3a settings were fixed at start.
        port = port or _free_port()
        log = root / "moto.log"  # werkzeug logs each request to stderr
        super().__init__([str(_MOTO), "-H", "127.0.0.1", "-p", str(port)], port, log, log)
        self.endpoint = f"http://127.0.0.1:{port}"
        import boto3  # installed with moto

        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        )

    @staticmethod
    def missing() -> str | None:
        if _MOTO.exists():
            return None
        return "moto_server is missing: install the dev extra (pip install -e '.[dev]')"

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

    def settings(self) -> tuple[dict[str, str], dict[str, str]]:
        """What a user writes under ``warehouse.storage_options``, and the secrets they set
        in the environment instead."""
        options = {"endpoint": self.endpoint, "region": "us-east-1", "allow_http": "true"}
        return options, {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}

    def create(self, bucket: str) -> None:
        self.client.create_bucket(Bucket=bucket)

    def put(self, bucket: str, key: str, text: str) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=text.encode())

    def get(self, bucket: str, key: str) -> str:
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read().decode()

    def keys(self, bucket: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def object_reads(self, bucket: str, key: str | None = None) -> int:
        """GET requests the server logged for one object (or every object) of ``bucket``."""
        target = re.escape(key) if key else r"[^ ?]+"
        return self._count(rf'"GET /{bucket}/{target} HTTP')


class AzuriteServer(_Server):
    name, scheme = "azure", "az"

    def __init__(self, root: Path, port: int | None = None):
        # ``port``: 10000 for clients in the emulator's mode (its fixed address).
        port = port or _free_port()
        requests = root / "azurite-debug.log"
        command = [
            str(shutil.which("azurite-blob")),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(root / "azurite"),
            "--skipApiVersionCheck",
            "--debug",
            str(requests),
        ]
        super().__init__(command, port, root / "azurite.log", requests)
        from azure.storage.blob import BlobServiceClient

        self.client = BlobServiceClient.from_connection_string(
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"
        )

    @staticmethod
    def missing() -> str | None:
        if shutil.which("azurite-blob"):
            return None
        return "azurite-blob is missing: npm install -g azurite (Azure Storage emulator)"

    def warehouse(self) -> DeltaWarehouse:
        """The warehouse resource for Azurite: the emulator's account at its endpoint
        (the endpoint and plain http are delta-rs options AzureConfig lacks)."""
        storage = AzureConfig(account_name=AZURITE_ACCOUNT, account_key=AZURITE_KEY)
        options = {
            "azure_storage_endpoint": f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}",
            "allow_http": "true",
        }
        return DeltaWarehouse(storage=storage, options=options)

    def settings(self) -> tuple[dict[str, str], dict[str, str]]:
        options = {
            "account_name": AZURITE_ACCOUNT,
            "azure_storage_endpoint": f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}",
            "allow_http": "true",
        }
        return options, {"AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY}

    def create(self, bucket: str) -> None:
        self.client.create_container(bucket)

    def put(self, bucket: str, key: str, text: str) -> None:
        self.client.get_blob_client(bucket, key).upload_blob(text.encode(), overwrite=True)

    def get(self, bucket: str, key: str) -> str:
        return self.client.get_blob_client(bucket, key).download_blob().readall().decode()

    def keys(self, bucket: str) -> list[str]:
        return sorted(b.name for b in self.client.get_container_client(bucket).list_blobs())

    def object_reads(self, bucket: str, key: str | None = None) -> int:
        target = re.escape(key) if key else r"[^ ?]+"
        url = rf"http://127\.0\.0\.1/{AZURITE_ACCOUNT}/{bucket}/{target}"
        return self._count(rf"RequestMethod=GET RequestURL={url} ")


SERVERS = {"s3": S3Server, "azure": AzuriteServer}
