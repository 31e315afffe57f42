"""A driver on the standalone cluster that loads one upsert table twice, run as a
subprocess by test_cluster_demo.py (a classic SparkContext can exist only once in a
process, and the tests' own is local):

    python -m incremental_assets_tests.cluster.load_driver TABLES_YAML UI_PORT

The master comes from INCREMENTAL_ASSETS_SPARK_MASTER, the jars and settings from the
tables file's ``spark.conf``. It writes the source (a Delta table on S3, two days of
orders), loads day 1, prints ``SEEDED``, then loads day 2 (the MERGE the test disturbs),
then day 2 again (the re-run), and prints one JSON line of what happened: each run's
outcome, the target's Delta version and cursor after each, and how the target compares
with a full reload of the source."""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta

from incremental_assets.engine import DeltaTarget, LoadRequest, run_load
from incremental_assets.engine.reload import business_columns, full_reload_frame
from incremental_assets.engine.spark.settings import project_conf
from incremental_assets.engine.spark_session import start_session
from incremental_assets.engine.watermarks import format_value
from incremental_assets.specs import load_project

DAY_1 = datetime(2026, 1, 1, tzinfo=UTC)
ORDERS = 4000  # enough rows that the merge's tasks run on both executors


def source_rows() -> list[tuple]:
    """Day 1: ORDERS orders placed; day 2: half of them paid, ORDERS / 2 new ones."""
    day_2 = DAY_1 + timedelta(days=1)
    rows = [(i, "placed", float(i), DAY_1 + timedelta(seconds=i)) for i in range(ORDERS)]
    rows[: ORDERS // 2] = [
        (i, "paid", float(i), day_2 + timedelta(seconds=i)) for i in range(ORDERS // 2)
    ]
    rows += [
        (i, "placed", float(i), day_2 + timedelta(seconds=i))
        for i in range(ORDERS, ORDERS + ORDERS // 2)
    ]
    return rows


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def state(target) -> dict:
    if not target.exists():
        return {"version": None, "cursor": None}
    cursor = target.state("timestamp").cursor
    return {
        "version": target.open().version(),
        "cursor": format_value(cursor) if cursor is not None else None,
    }


def differences(spark, spec, target, storage) -> list[int]:
    """Rows only in the target, and rows only in a full reload of the source (on the
    bucket, hence ``storage``, which engine.reload.differences does not take)."""
    expected = business_columns(full_reload_frame(spark, spec, storage))
    actual = target.to_spark(spark).select(*expected.columns)
    return [actual.exceptAll(expected).count(), expected.exceptAll(actual).count()]


def losses(ui_port: str, app: str) -> dict:
    """What the driver saw of the lost worker (its REST API): executors removed, with
    Spark's reason, and task attempts that failed. A worker killed as the run ended may
    be noticed a moment later: waited for, up to 60 s."""
    api = f"http://127.0.0.1:{ui_port}/api/v1/applications/{app}"
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(f"{api}/allexecutors", timeout=10) as response:
            removed = [e["removeReason"] for e in json.load(response) if e.get("removeReason")]
        if removed or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    with urllib.request.urlopen(f"{api}/stages", timeout=10) as response:
        failed = sum(s.get("numFailedTasks", 0) for s in json.load(response))
    return {"executors_removed": removed, "failed_tasks": failed}


def main(tables: str, ui_port: str) -> dict:
    project = load_project(tables)
    spec = project.tables[0]
    target_path = project.target_path(spec)
    # The source is on the bucket too: delta-rs probes it with the same options.
    storage = project.warehouse.storage_options
    target = DeltaTarget(spec.name, target_path, storage)
    # The test watches this application's jobs through the driver's REST API.
    ui = {"spark.ui.enabled": "true", "spark.ui.port": ui_port}
    spark = start_session(project_conf(project, ui), "incremental-assets-kill-test")
    say(f"APP {spark.sparkContext.applicationId}")
    schema = "order_id BIGINT, status STRING, amount DOUBLE, updated_at TIMESTAMP"
    source = spark.createDataFrame(source_rows(), schema).repartition(2)
    source.write.format("delta").save(str(spec.source.path))

    def load(day: datetime, run_id: str) -> dict:
        request = LoadRequest(day, day + timedelta(days=1), run_id=run_id)
        try:
            result = run_load(spark, spec, target, request, source_storage=storage)
            outcome = {"committed": result.committed, "version": result.delta_version}
        except Exception as exc:  # what the run reports when the cluster fails it
            outcome = {"error": f"{type(exc).__name__}: {str(exc)[:800]}"}
        return {**outcome, "after": state(target)}

    out = {"seed": load(DAY_1, "seed")}
    say("SEEDED")
    out["disturbed"] = load(DAY_1 + timedelta(days=1), "disturbed")
    out["disturbed"]["cluster"] = losses(ui_port, spark.sparkContext.applicationId)
    out["rerun"] = load(DAY_1 + timedelta(days=1), "rerun")
    out["differences"] = differences(spark, spec, target, storage)
    out["source_cursor"] = format_value(max(r[3] for r in source_rows()))
    spark.stop()
    return out


if __name__ == "__main__":
    say("RESULT " + json.dumps(main(*sys.argv[1:3])))
