"""The project on the standalone cluster (Master and 2 Workers, each worker with a private
/tmp) with its warehouse on S3 (moto), both shared by the test session:

- the demo (every strategy, a landing folder, silver and gold) runs as
  ``incremental-assets demo --root DIR --warehouse s3://...`` on ``spark://...`` and ends
  equal to a full reload, with nothing in a local warehouse;
- a worker lost in the middle of a MERGE (its executor and Worker JVMs killed) leaves the
  run either completed, Spark having re-run the lost tasks, or failed with nothing
  committed; the re-run is exact; the worker is started again.

Applications ship no jars: Delta Lake's and the S3 connector's are on the driver's and the
executors' class path from a folder every worker reads (``INCREMENTAL_ASSETS_JARS=
provided``), as on a cluster image that has them."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from incremental_assets.demo.postgres_server import free_port
from incremental_assets.engine.jars import JARS_ENV
from incremental_assets.engine.spark import class_archive
from incremental_assets.engine.spark.settings import MASTER_ENV
from incremental_assets_tests.builders import PROJECT_ROOT
from incremental_assets_tests.servers import (
    INTERPRETED,
    S3_CREDENTIALS,
    cluster_app_conf,
    provided_jars_conf,
    s3_options,
)

pytestmark = pytest.mark.slow

TABLES = {"orders", "events", "customers", "customers_history", "products"}
LAYERS = {"invoices_bronze", "invoices_silver", "invoices_gold"}


@pytest.fixture
def cluster_env(spark, spark_cluster) -> dict[str, str]:
    """A driver's environment: the cluster's master, S3 credentials, the project's Python
    for Python tasks, and jars provided (``spark`` started first: it filled the cache the
    class path points at)."""
    return {
        **os.environ,
        **S3_CREDENTIALS,
        MASTER_ENV: spark_cluster.url,
        JARS_ENV: "provided",
        "PYSPARK_PYTHON": sys.executable,
        # Two starts with this class path (the demo, then the kill test's driver): a class
        # archive written at the first's exit (~35 s here) would save the second ~7 s.
        class_archive.ARCHIVE_ENV: "off",
    }


def spark_section() -> dict:
    # Interpreted on tens of rows (servers.INTERPRETED); test_standalone.py's loads on the
    # cluster keep code generation, the classes compiled on the executors.
    return {"conf": {**cluster_app_conf(), **provided_jars_conf(), **INTERPRETED}}


@pytest.fixture
def demo_root() -> Path:
    """A demo folder the workers can read: the executors write and read the simulated
    sources there, so it cannot be under /tmp (each worker has its own, as another machine
    has its own disk). Removed afterwards."""
    root = PROJECT_ROOT / f".cluster-demo-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    shutil.copy(PROJECT_ROOT / "dagster.yaml", root / "dagster.yaml")
    tables = yaml.safe_load((PROJECT_ROOT / "tables.yaml").read_text())
    (root / "tables.yaml").write_text(yaml.safe_dump({**tables, "spark": spark_section()}))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def completed_apps(cluster) -> dict[str, dict]:
    return {app["id"]: app for app in cluster.master_state()["completedapps"]}


def wait_for_new_app(cluster, before: dict) -> set[str]:
    """The applications completed since ``before`` (the master learns it within seconds
    of the driver's exit)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = completed_apps(cluster).keys() - before.keys()
        if new:
            return new
        time.sleep(0.5)
    return set()


def test_the_demo_on_the_cluster_with_an_s3_warehouse_ends_equal_to_a_full_reload(
    demo_root, cluster_env, spark_cluster, s3
):
    bucket = f"cluster-demo-{uuid.uuid4().hex[:8]}"
    s3.create(bucket)
    options = [f"--storage-option={k}={v}" for k, v in s3_options(s3.endpoint).items()]
    apps_before = completed_apps(spark_cluster)

    done = subprocess.run(
        [sys.executable, "-m", "incremental_assets.cli", "demo", "--rounds", "1",
         "--root", str(demo_root), "--warehouse", f"s3://{bucket}/wh", *options],
        env={**cluster_env, "INCREMENTAL_ASSETS_TABLES": str(demo_root / "tables.yaml")},
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip

    out = done.stdout
    assert done.returncode == 0, (out + done.stderr)[-5000:]
    verdicts = {line.split()[0]: line for line in out.splitlines() if "a full reload (" in line}
    assert set(verdicts) == TABLES
    assert all(" equal to a full reload" in line for line in verdicts.values()), verdicts
    gold = [line for line in out.splitlines() if "from-scratch aggregation" in line]
    assert len(gold) == 1 and " equal to a from-scratch" in gold[0], out
    assert "DIFFERENT" not in out
    logs = {k.split("/")[1] for k in s3.keys(bucket) if "/_delta_log/" in k}
    assert logs >= TABLES | LAYERS
    assert not (demo_root / "data" / "warehouse").exists()
    # It ran on the cluster: one application, with executors on both workers, that
    # fetched no jar.
    (app,) = wait_for_new_app(spark_cluster, apps_before)
    folders = [w.tmp / "work" / app for w in spark_cluster.workers]
    assert all(f.is_dir() for f in folders), folders
    assert [j for f in folders for j in f.rglob("*.jar")] == []


def test_a_worker_lost_during_a_merge_fails_cleanly_or_completes_and_rerun_is_exact(
    tmp_path, cluster_env, spark_cluster, s3
):
    bucket = f"cluster-kill-{uuid.uuid4().hex[:8]}"
    s3.create(bucket)
    tables = {
        "warehouse": {"root": f"s3://{bucket}/wh", "storage_options": s3_options(s3.endpoint)},
        "spark": spark_section(),
        "tables": [
            {
                "name": "orders",
                "source": {"format": "delta", "path": f"s3://{bucket}/source/orders"},
                "keys": ["order_id"],
                "watermark": {"column": "updated_at", "kind": "timestamp"},
                "strategy": "upsert",
                "partitioning": {"granularity": "daily", "start": "2026-01-01"},
            }
        ],
    }
    (tmp_path / "tables.yaml").write_text(yaml.safe_dump(tables))
    ui_port = free_port()
    driver = subprocess.Popen(
        [sys.executable, "-m", "incremental_assets_tests.cluster.load_driver",
         str(tmp_path / "tables.yaml"), str(ui_port)],
        env=cluster_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    errors: list[str] = []
    readers = [
        threading.Thread(target=lambda: [lines.put(x) for x in driver.stdout], daemon=True),
        threading.Thread(target=lambda: errors.extend(driver.stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        app = wait_for_line(lines, driver, "APP ", errors).split()[1]
        wait_for_line(lines, driver, "SEEDED", errors)
        # Worker 1 (127.0.0.2) is lost while its executor runs a task of the MERGE.
        merge = wait_for_running_job(ui_port, app, "MERGE", "127.0.0.2", driver, errors)
        executors = spark_cluster.kill_worker(1)
        driver.wait(timeout=900)
        for reader in readers:
            reader.join(timeout=30)
        output = []
        while not lines.empty():
            output.append(lines.get())
        results = [x for x in output if x.startswith("RESULT ")]
        assert driver.returncode == 0 and results, "".join(output + errors)[-5000:]
        result = json.loads(results[-1].removeprefix("RESULT "))
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if spark_cluster.workers[0].process.poll() is not None:
            spark_cluster.restart_worker(1)

    assert executors, f"worker-1 ran no executor when the MERGE ({merge}) was running"
    seed, disturbed, rerun = result["seed"], result["disturbed"], result["rerun"]
    assert seed["committed"], result
    # What happened, for the record (pytest -s shows it; docs/cluster.md reports it).
    sys.stderr.write(f"\nworker-1 lost during {merge!r}: {json.dumps(disturbed)}\n")
    assert disturbed["cluster"]["executors_removed"], disturbed  # the driver saw the loss
    if "error" in disturbed:  # nothing of the run committed: no version, no watermark
        assert disturbed["after"] == seed["after"], disturbed
    else:  # Spark re-ran the lost tasks and the run committed its window
        assert disturbed["committed"]
        assert disturbed["after"] == {
            "version": seed["after"]["version"] + 1,
            "cursor": result["source_cursor"],
        }
    assert "error" not in rerun, result
    assert rerun["after"]["cursor"] == result["source_cursor"], result
    assert result["differences"] == [0, 0], result
    assert spark_cluster.alive_workers() == 2


def wait_for_line(
    lines: queue.Queue, driver: subprocess.Popen, prefix: str, errors: list[str]
) -> str:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if driver.poll() is not None:
                raise AssertionError(
                    f"the driver exited ({driver.returncode}) before {prefix}: "
                    + "".join(errors)[-4000:]
                ) from None
            continue
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"no {prefix} from the driver in 600 s")


def wait_for_running_job(
    port: int, app: str, word: str, host: str, driver: subprocess.Popen, errors: list[str]
) -> str:
    """The description of a running job of ``app`` whose description holds ``word`` (Delta
    describes a MERGE's jobs "MERGE operation - ..."), from the driver's REST API, polled:
    at a moment the executor on ``host`` runs a task, or, when none comes within half a
    second of the first such job (tasks of a few thousand rows are short), then."""
    api = f"http://127.0.0.1:{port}/api/v1/applications/{app}"
    deadline, seen = time.monotonic() + 600, None
    while time.monotonic() < deadline and driver.poll() is None:
        running = poll_json(f"{api}/jobs?status=running")
        jobs = [j.get("description") or "" for j in running or []]
        merge = next((job for job in jobs if word in job), None)
        if merge:
            seen = seen or time.monotonic()
            executors = poll_json(f"{api}/executors") or []
            busy = [e["hostPort"] for e in executors if e["activeTasks"]]
            if any(b.startswith(f"{host}:") for b in busy):
                return f"{merge} (a task on {host})"
            if time.monotonic() - seen > 0.5:
                return f"{merge} (tasks on {', '.join(busy) or 'no executor'})"
        time.sleep(0.1)
    raise AssertionError(
        f"no running job with {word} seen (driver exit: {driver.poll()}): "
        + "".join(errors)[-4000:]
    )


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def poll_json(url: str):
    """``get_json``, or None when the driver's UI did not answer within its 5 s or closed
    the connection unanswered (a driver busy on cores it shares with other test runs: its
    UI server drops what it cannot serve): the caller polls again."""
    try:
        return get_json(url)
    except (TimeoutError, ConnectionResetError):  # RemoteDisconnected is a reset
        return None
    except urllib.error.URLError as error:
        if isinstance(error.reason, (TimeoutError, ConnectionResetError)):
            return None
        raise
