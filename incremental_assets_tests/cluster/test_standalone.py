"""A standalone cluster (Master and 2 Workers, each worker with a private /tmp) runs a
driver on ``spark://127.0.0.1:PORT``: a Delta table on S3 is written, MERGEd and read back
through the executors; each executor sees its own worker's /tmp and runs the project's
Python; Parquet written to the driver's /tmp never reaches the driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from incremental_assets.engine.spark import class_archive
from incremental_assets_tests.servers import S3_CREDENTIALS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def driver_run(spark_cluster, s3, tmp_path_factory) -> dict:
    """One driver run on the cluster (a driver and its executors take a while to start):
    its results, and where each worker's /tmp is."""
    bucket = f"cluster-{uuid.uuid4().hex[:10]}"
    s3.create(bucket)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "incremental_assets_tests.cluster.cluster_driver",
            spark_cluster.url,
            s3.endpoint,
            bucket,
        ],
        # One start with this class path: a class archive recorded at its exit would serve
        # no other start, and writing one took ~35 s here (engine/spark/class_archive.py).
        env={
            **os.environ,
            **S3_CREDENTIALS,
            "PYSPARK_PYTHON": sys.executable,
            class_archive.ARCHIVE_ENV: "off",
        },
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-4000:]
    return {**json.loads(lines[-1].removeprefix("RESULT ")), "bucket": bucket}


def test_a_delta_table_on_s3_is_written_merged_and_read_back_on_the_cluster(driver_run, s3):
    assert driver_run["rows"] == [[1, "new"], [2, "shipped"], [3, "new"], [4, "new"]]
    assert driver_run["operations"] == ["WRITE", "MERGE"]
    # The executors needed Delta's and the S3 connector's jars: the driver shipped them.
    assert driver_run["jars_shipped"]
    keys = s3.keys(driver_run["bucket"])
    assert "orders/_delta_log/00000000000000000001.json" in keys
    assert any(k.endswith(".parquet") for k in keys)


def test_each_executor_sees_its_own_workers_tmp_and_runs_the_projects_python(driver_run):
    executors = {tuple(e) for e in driver_run["executors"]}

    assert {worker for worker, _ in executors} == {"worker-1", "worker-2"}
    assert {python for _, python in executors} == {sys.executable}


def test_a_folder_in_the_drivers_tmp_is_not_seen_by_the_executors(driver_run, spark_cluster):
    # The driver wrote to a folder in its /tmp and found nothing there to read back...
    assert "local_rows" not in driver_run, driver_run
    assert "Unable to infer schema for Parquet" in driver_run["local_error"]
    # ...because the executors wrote the files into their workers' own /tmp.
    relative = driver_run["local_dir"].removeprefix("/tmp/")
    written = [
        f for worker in spark_cluster.workers for f in (worker.tmp / relative).rglob("*.parquet")
    ]
    assert written
