"""A warehouse on Azure Blob storage: Azurite (the emulator) serves the Blob API only, so
Spark reaches it through hadoop-azure's wasb driver (abfs needs the Data Lake Storage
endpoint, which Azurite lacks: docs/cluster.md). An upsert table loaded twice into
``az://<container>@<account>.blob.core.windows.net/...`` (Spark's ``wasbs://``, delta-rs's
``az://``, both in their emulator mode from the tables file's ``use_emulator``) equals a
full reload. The load runs in a subprocess (incremental_assets_tests/cluster/
azure_driver.py): the emulator modes reach the fixed address 127.0.0.1:10000, kept free
by a network namespace of the subprocess's own (``unshare -n``), where it starts Azurite."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from incremental_assets.engine import jars
from incremental_assets.engine.spark import class_archive, connectors
from incremental_assets_tests.object_stores import AzuriteServer
from incremental_assets_tests.postgres import skip_or_fail_on_ci
from incremental_assets_tests.servers import cache_jars


def _unavailable() -> str | None:
    missing = AzuriteServer.missing()
    if missing:
        return missing
    if not (shutil.which("unshare") and shutil.which("ip")):
        return "unshare and ip (util-linux, iproute2) are needed for a private network"
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -n is not permitted here (run as root): {probe.stderr.strip()}"
    return None


def _jar_report() -> str:
    """The cached jars that are not whole: a JVM given one fails only at the first use of
    one of its classes (a ClassNotFoundException seen once on CI)."""
    listed = {j for m in jars.cache_dir().glob("manifest-*.txt") for j in m.read_text().split()}
    broken = sorted(j for j in listed if not jars.usable(j))
    return f"cached jars not whole: {broken or 'none'} (of {len(listed)})"


def test_an_upsert_table_on_azure_blob_storage_through_wasb_equals_a_full_reload(tmp_path):
    why = _unavailable()
    if why:
        skip_or_fail_on_ci(why)
    # The driver's namespace has no network: its connector's jars are fetched here first.
    cache_jars(connectors.CONNECTORS["azure"].packages())
    driver = f"{sys.executable} -m incremental_assets_tests.cluster.azure_driver {tmp_path}"
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {driver}"],
        # One start with hadoop-azure's class path: a class archive written at its exit
        # would serve no other start (engine/spark/class_archive.py).
        env={**os.environ, class_archive.ARCHIVE_ENV: "off"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the driver failed ({done.returncode}):\n{done.stderr[-4000:]}\n{_jar_report()}"
    out = json.loads(lines[-1].removeprefix("RESULT "))

    assert out["runs"] == [[True, 0], [True, 1]]
    assert out["differences"] == [0, 0]
    assert out["rows"] == [[1, "paid"], [2, "placed"], [3, "placed"], [4, "placed"]]
    assert out["spark_path"].startswith("wasbs://lake@devstoreaccount1.blob.core.windows.net/")
    # The table and its staging root are blobs of the container; the staging root holds
    # only what its emptying leaves.
    assert "wh/orders/_delta_log/00000000000000000001.json" in out["blobs"]
    staged = [b for b in out["blobs"] if b.startswith("wh/orders__staging/")]
    assert staged, out["blobs"]
