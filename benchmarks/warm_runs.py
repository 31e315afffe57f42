"""Warm runs: what one day of a small table costs cold (a Dagster run that starts its own
Spark), warm (Spark already up in the process) and through a Spark Connect server; the
Spark jobs each run issues; and what the hourly late-rows checks of many tables cost, one
run per table against one run for all.

1. a project in a temporary folder: the demo's ``orders`` (a Delta source of
   ``--orders`` rows, upserted by ``order_id`` on ``updated_at``, daily partitions) and
   ``--tables`` small tables on Parquet folders for the checks;
2. **cold local**: ``dagster asset materialize`` of one day in a fresh process (what each
   run of the shipped Dagster set-up costs: Python, Dagster, Spark's start, the load);
3. **warm local**: in one process with Spark started once, ``dg.materialize`` of the next
   days: the run's seconds, its step's seconds, and its Spark jobs (Spark's status REST
   API); after each run, in the same session, the same day as a hand-written notebook
   loads it (its watermark from its own copy of the target, the rows past it, newest per
   key, one ``MERGE INTO``): what a user would otherwise run, and the floor under the
   aims below;
4. **Connect**: a Spark Connect server started once (``engine/spark/connect_server.py``),
   the same in-process runs (and notebook MERGEs) through it, and ``dagster asset
   materialize`` in a fresh process through it (``INCREMENTAL_ASSETS_SPARK_REMOTE``: what
   ``./dev dg launch`` costs with a server up), in the session the last process left and
   in a new one (as before sessions were kept across processes); the round trips a run
   makes to the server, and what they would cost on a network 30 ms away;
5. **late-rows checks**: every small table loaded once, then the checks of all of them in
   one run (as the automation runs them: one step, one Spark session), against a check
   run of its own per table (a fresh process each, as before they were batched);
   extrapolated to 500 tables an hour.

Warm and Connect runs each start with ``--warmup`` runs that are not counted (16): a
long-lived Dagster code server or Connect server is past its JVM's warm-up, and a fresh
server's first runs are not what a user who keeps one up pays.

Each measurement runs in its own child process (PySpark allows one kind of session per
process). Run from the repository root::

    .venv/bin/python benchmarks/warm_runs.py                 # about 16 minutes here
    .venv/bin/python benchmarks/warm_runs.py --tables 5      # quicker
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
START = datetime(2026, 1, 1, tzinfo=UTC)
AIMS = {
    "warm_step": 4.0,  # a local JVM, Spark's start apart: the step
    "connect_run": 3.0,  # with a Connect server: the run, in-process
    "connect_launch": 8.0,  # with a Connect server: a fresh process (dg launch)
}
# A round trip to a Spark Connect server across a network (a workspace in a cloud region
# from a laptop or another region): what each of a run's round trips would add.
RTT_MS = 30
REMOTE = "INCREMENTAL_ASSETS_SPARK_REMOTE"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def day(n: int) -> datetime:
    return START + timedelta(days=n - 1)


# --- the project -------------------------------------------------------------------------


def tables_yaml(root: Path, tables: int, ui_port: int) -> str:
    small = "".join(
        f"""
  - name: t{n:03d}
    source: {{format: parquet, path: ./source/t{n:03d}}}
    keys: [id]
    watermark: {{column: id, kind: id}}
    strategy: append
    partitioning: {{granularity: daily, start: {START:%Y-%m-%d}, column: at}}
"""
        for n in range(1, tables + 1)
    )
    return f"""warehouse:
  root: ./warehouse
spark:
  conf:
    spark.ui.enabled: "true"
    spark.ui.port: "{ui_port}"
tables:
  - name: orders
    source: {{format: delta, path: ./source/orders}}
    keys: [order_id]
    watermark: {{column: updated_at, kind: timestamp, lookback: 2h}}
    strategy: upsert
    partitioning: {{granularity: daily, start: {START:%Y-%m-%d}}}
{small}"""


def orders_day(n: int, orders: int) -> pa.Table:
    """Day 1: ``orders`` orders; later days: 2% of them updated and 1% new, all stamped
    inside the day (the demo's shape: a few hundred changed rows)."""
    if n == 1:
        ids = list(range(1, orders + 1))
        status = ["placed"] * orders
    else:
        changed = max(orders // 50, 1)
        start = orders + (n - 2) * (orders // 100) + 1
        ids = list(range(n * 7, n * 7 + changed)) + list(range(start, start + orders // 100))
        status = ["paid"] * changed + ["placed"] * (orders // 100)
    stamps = [day(n) + timedelta(seconds=(i * 37) % 86_000) for i in range(len(ids))]
    return pa.table(
        {
            "order_id": pa.array(ids, pa.int64()),
            "status": status,
            "amount": pa.array([float(i % 500) for i in ids]),
            "updated_at": pa.array(stamps, pa.timestamp("us", tz="UTC")),
        }
    )


def write_orders(root: Path, n: int, orders: int) -> None:
    from deltalake import DeltaTable, write_deltalake

    path = str(root / "source" / "orders")
    rows = orders_day(n, orders)
    if n == 1:
        write_deltalake(path, rows)
        return
    (
        DeltaTable(path)
        .merge(rows, "t.order_id = s.order_id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )


def write_small_tables(root: Path, tables: int) -> None:
    import pyarrow.parquet as pq

    for n in range(1, tables + 1):
        folder = root / "source" / f"t{n:03d}"
        folder.mkdir(parents=True)
        ids = list(range(1, 101))
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "value": [f"v{i}" for i in ids],
                "at": pa.array([day(1)] * 100, pa.timestamp("us", tz="UTC")),
            }
        )
        pq.write_table(table, folder / "part-1.parquet")


# --- the children ------------------------------------------------------------------------


QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def spark_jobs(ui_port: int) -> int:
    """The jobs the Spark application behind ``ui_port`` has run so far."""
    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    with urllib.request.urlopen(base, timeout=10) as r:
        app = json.load(r)[0]["id"]
    with urllib.request.urlopen(f"{base}/{app}/jobs", timeout=10) as r:
        return len(json.load(r))


NOTEBOOK_COLUMNS = ("order_id", "status", "amount", "updated_at")


def notebook_merge(spark, source: str, target: str) -> None:
    """The same day as a hand-written notebook loads it, in the same session: its watermark
    (the newest ``updated_at`` in its target), the source's rows past it, the newest per
    key, one ``MERGE INTO`` in SQL (what runs through Spark Connect as well). No lookback,
    metadata, checks, or cursor kept with the commit: the least a user would write."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    (cursor,) = spark.sql(f"SELECT max(updated_at) FROM delta.`{target}`").first()
    newest = Window.partitionBy("order_id").orderBy(F.col("updated_at").desc())
    changed = (
        spark.read.format("delta")
        .load(source)
        .where(F.col("updated_at") > F.lit(cursor))
        .withColumn("_n", F.row_number().over(newest))
        .where("_n = 1")
        .select(*NOTEBOOK_COLUMNS)
    )
    changed.createOrReplaceTempView("notebook_changes")
    spark.sql(
        f"MERGE INTO delta.`{target}` AS t USING notebook_changes AS s "
        "ON t.order_id = s.order_id "
        "WHEN MATCHED AND s.updated_at > t.updated_at THEN UPDATE SET * "
        "WHEN NOT MATCHED THEN INSERT *"
    ).collect()


# What the Spark Connect client sends the server: each call is one round trip (a query's
# result stream is one, however many batches it holds).
_ROUND_TRIPS = ("config", "_analyze", "_execute", "_execute_and_fetch_as_iterator")


def count_round_trips() -> collections.Counter:
    """Count, from now on, the round trips every Spark Connect client of this process
    makes, by kind (``config``: a setting read or written; ``_analyze``: a schema or plan
    asked for; the others: a query or command run)."""
    from pyspark.sql.connect.client.core import SparkConnectClient

    counted: collections.Counter = collections.Counter()
    for name in _ROUND_TRIPS:
        method = getattr(SparkConnectClient, name)

        def counting(self, *args, _method=method, _name=name, **kwargs):
            counted[_name] += 1
            return _method(self, *args, **kwargs)

        setattr(SparkConnectClient, name, counting)
    return counted


def child_runs(root: Path, days: list[int], orders: int, ui_port: int, warmup: int) -> dict:
    """In-process runs of ``orders`` for ``days`` with Spark started first; the first
    ``warmup`` are not counted (their steps are kept apart, ``warmup_steps``)."""
    import dagster as dg

    from incremental_assets.dagster_layer.build import build_definitions
    from incremental_assets.engine.spark_session import start_session
    from incremental_assets.specs import load_project

    project = load_project(root / "tables.yaml")
    defs = build_definitions(project)
    round_trips = count_round_trips() if os.environ.get(REMOTE) else None
    started = time.perf_counter()
    spark = start_session(dict(defs.resources["spark"].spark_config))
    spark_start = time.perf_counter() - started
    asset = defs.get_assets_def("orders")
    target = defs.resources["warehouse"].target(project, project.table("orders"))
    notebook = str(root / "notebook" / f"orders_{days[0]}")
    # The notebook's own copy of the target as the loader left it (its columns only).
    target.to_spark(spark).select(*NOTEBOOK_COLUMNS).write.format("delta").save(notebook)
    runs = []
    warmup_steps = []
    with dg.DagsterInstance.get() as instance:
        for index, n in enumerate(days):
            write_orders(root, n, orders)
            jobs_before = spark_jobs(ui_port)
            trips_before = sum(round_trips.values()) if round_trips is not None else 0
            started = time.perf_counter()
            result = dg.materialize(
                [asset],
                partition_key=f"{day(n):%Y-%m-%d}",
                instance=instance,
                resources=defs.resources,
                selection=[asset.key],
                run_config=QUIET,
            )
            wall = time.perf_counter() - started
            assert result.success
            events = {
                entry.dagster_event.event_type_value: entry.timestamp
                for entry in instance.all_logs(result.run_id)
                if entry.dagster_event is not None
            }
            step = events["STEP_SUCCESS"] - events["STEP_START"]
            (materialization,) = result.asset_materializations_for_node("orders")
            changed = materialization.metadata["rows_extracted"].value
            jobs = spark_jobs(ui_port) - jobs_before
            trips = sum(round_trips.values()) - trips_before if round_trips is not None else None
            started = time.perf_counter()
            notebook_merge(spark, str(root / "source" / "orders"), notebook)
            notebook_seconds = time.perf_counter() - started
            if index < warmup:
                warmup_steps.append(round(step, 2))
                continue
            runs.append(
                {
                    "day": n,
                    "wall": wall,
                    "step": step,
                    "jobs": jobs,
                    "round_trips": trips,
                    "rows": changed,
                    "notebook": notebook_seconds,
                    "notebook_jobs": spark_jobs(ui_port) - jobs_before - jobs,
                }
            )
    return {"spark_start": spark_start, "runs": runs, "warmup_steps": warmup_steps}


def child_checks(root: Path, tables: int, only: str | None) -> dict:
    """Load every small table once (unless ``only``), then run the late-rows checks: of
    all tables in one run, or of ``only`` in a run of its own."""
    import dagster as dg

    from incremental_assets.dagster_layer.build import build_definitions
    from incremental_assets.dagster_layer.late import LATE_ROWS
    from incremental_assets.engine.spark_session import start_session
    from incremental_assets.specs import load_project

    process_started = time.perf_counter()
    defs = build_definitions(load_project(root / "tables.yaml"))
    names = [only] if only else [f"t{n:03d}" for n in range(1, tables + 1)]
    out: dict = {}
    with dg.DagsterInstance.get() as instance:
        if not only:
            start_session(dict(defs.resources["spark"].spark_config))
            assets = [defs.get_assets_def(n) for n in names]
            started = time.perf_counter()
            loaded = dg.materialize(
                assets,
                partition_key=f"{day(1):%Y-%m-%d}",
                instance=instance,
                resources=defs.resources,
                selection=[a.key for a in assets],
                run_config=QUIET,
            )
            assert loaded.success
            out["load_all"] = time.perf_counter() - started
        keys = [dg.AssetCheckKey(dg.AssetKey(n), LATE_ROWS) for n in names]
        job = dg.define_asset_job("late", selection=dg.AssetSelection.checks(*keys))
        run_defs = dg.Definitions(
            assets=defs.assets, asset_checks=defs.asset_checks, jobs=[job], resources=defs.resources
        )
        started = time.perf_counter()
        result = run_defs.resolve_job_def("late").execute_in_process(
            instance=instance, run_config=QUIET
        )
        out["checks"] = time.perf_counter() - started
        evaluations = result.get_asset_check_evaluations()
        assert len(evaluations) == len(names) and all(e.passed for e in evaluations)
    out["process"] = time.perf_counter() - process_started
    return out


def run_child(root: Path, args: list[str], env: dict[str, str]) -> dict:
    """A child's results, with its process's seconds end to end (``wall``)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(root), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError((done.stdout + done.stderr)[-4000:])
    return {**json.loads(lines[-1].removeprefix("RESULT ")), "wall": time.perf_counter() - started}


def cli_run(root: Path, n: int, orders: int, env: dict[str, str]) -> float:
    """``dagster asset materialize`` of day ``n`` in a fresh process: its seconds."""
    write_orders(root, n, orders)
    command = [
        sys.executable, "-m", "dagster", "asset", "materialize",
        "-m", "incremental_assets.definitions",
        "--select", "orders", "--partition", f"{day(n):%Y-%m-%d}",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode:
        raise RuntimeError((done.stdout + done.stderr)[-4000:])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=1000, help="rows of day 1 (1000)")
    parser.add_argument("--tables", type=int, default=20, help="tables for the checks (20)")
    parser.add_argument(
        "--runs", type=int, default=6, help="warm runs each, local and Connect (6; >= 4)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=16,
        help="uncounted in-process runs before the counted ones, local and Connect alike "
        "(16): a long-lived code server or Connect server is past its JVM's warm-up",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--days", help=argparse.SUPPRESS)
    parser.add_argument("--only", help=argparse.SUPPRESS)
    parser.add_argument("--ui-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        root = Path(args.child)
        if args.mode == "runs":
            days = [int(d) for d in args.days.split(",")]
            result = child_runs(root, days, args.orders, args.ui_port, args.warmup)
        else:
            result = child_checks(root, args.tables, args.only)
        print("RESULT " + json.dumps(result))
        return

    from incremental_assets.engine.spark import connect_server
    from incremental_assets.engine.spark.settings import project_conf
    from incremental_assets.specs import load_project

    root = Path(tempfile.mkdtemp(prefix="warm-runs-"))
    try:
        ui_port = free_port()
        (root / "tables.yaml").write_text(tables_yaml(root, args.tables, ui_port))
        (root / "home").mkdir()
        shutil.copy(REPO / "dagster.yaml", root / "home" / "dagster.yaml")
        write_small_tables(root, args.tables)
        env = {
            **os.environ,
            "DAGSTER_HOME": str(root / "home"),
            "INCREMENTAL_ASSETS_TABLES": str(root / "tables.yaml"),
        }
        env.pop(REMOTE, None)
        common = [
            *("--orders", str(args.orders), "--tables", str(args.tables)),
            *("--warmup", str(args.warmup)),
        ]
        print(f"project in {root}: orders ({args.orders} rows), {args.tables} small tables")

        first = cli_run(root, 1, args.orders, env)
        cold = cli_run(root, 2, args.orders, env)
        print(f"cold local: first load {first:.1f}s, day 2 {cold:.1f}s")
        per_child = args.warmup + args.runs
        local_days = list(range(3, 3 + per_child))
        connect_days = [d + per_child for d in local_days]
        days = ",".join(map(str, local_days))
        local = run_child(
            root, [*common, "--mode", "runs", "--days", days, "--ui-port", str(ui_port)], env
        )
        print(f"warm local: {json.dumps(local)}")

        server_ui = free_port()
        conf = project_conf(load_project(root / "tables.yaml"))
        conf.update({"spark.ui.enabled": "true", "spark.ui.port": str(server_ui)})
        server = connect_server.start(conf, port=0, log=root / "connect.log")
        try:
            remote = {**env, REMOTE: server.url}
            connect = run_child(
                root,
                [
                    *common,
                    *("--mode", "runs", "--days", ",".join(map(str, connect_days))),
                    *("--ui-port", str(server_ui)),
                ],
                remote,
            )
            print(f"connect: {json.dumps(connect)}")
            # Launched runs alternate: one takes the session the last process left
            # (engine/spark/session_slots.py), one names a new session of its own (as
            # every launched run did before).
            # The first, not counted, leaves a session for the next (the in-process runs
            # above are not a Dagster run's process: they leave none).
            after = connect_days[-1] + 1
            cli_run(root, after, args.orders, remote)
            launches, fresh = [], []
            for n in range(after + 1, after + 5, 2):
                launches.append(cli_run(root, n, args.orders, remote))
                own = {**remote, REMOTE: f"{server.url}/;session_id={uuid.uuid4()}"}
                fresh.append(cli_run(root, n + 1, args.orders, own))
            print(f"connect launches: {launches}, in new sessions: {fresh}")
        finally:
            server.stop()

        batched = run_child(root, [*common, "--mode", "checks"], env)
        alone = [
            run_child(root, [*common, "--mode", "checks", "--only", name], env)
            for name in ("t001", "t002")
        ]
        print(f"checks: batched {json.dumps(batched)}, alone {json.dumps(alone)}")
        report(args, first, cold, local, connect, (launches, fresh), batched, alone)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(args, first, cold, local, connect, launches, batched, alone) -> None:
    # The first warm runs pay the session's first Delta reads and a JVM whose compiler has
    # not yet warmed (a long-lived Dagster code server or Connect server is past them): a
    # Connect server's first 16-24 runs here took 5-14 s, later ones 3.2-3.9 s. With
    # ``--warmup`` runs before them, every counted run is steady; without, the last three.
    steady = local["runs"] if args.warmup else local["runs"][-3:]
    csteady = connect["runs"] if args.warmup else connect["runs"][-3:]

    def avg(rows: list[dict], field: str) -> float:
        return sum(r[field] for r in rows) / len(rows)

    launch = sum(launches[0]) / len(launches[0])
    launch_new = sum(launches[1]) / len(launches[1])
    warm_step, warm_run = avg(steady, "step"), avg(steady, "wall")
    connect_run = avg(csteady, "wall")
    print(f"\nOne day of orders ({args.orders} rows on day 1; {steady[0]['rows']} changed a day)")
    print(
        f"warm-up runs, not counted (steps, s): local {' '.join(map(str, local['warmup_steps']))}"
        f"; Connect {' '.join(map(str, connect['warmup_steps']))}"
    )
    print(f"warm runs (steps, s): local {_steps(local)}; Connect {_steps(connect)}")
    print(
        f"notebook MERGE (s): local {_steps(local, 'notebook')}; "
        f"Connect {_steps(connect, 'notebook')}"
    )
    print(f"{'how':<44} {'seconds':>8} {'spark jobs':>11} {'aim':>8}")
    rows = [
        ("cold local: a fresh process (dagster CLI)", cold, None, None),
        ("  of which Spark's start (in a process)", local["spark_start"], None, None),
        ("warm local: the run, in-process", warm_run, avg(steady, "jobs"), None),
        ("warm local: its step", warm_step, None, AIMS["warm_step"]),
        ("Connect: the run, in-process", connect_run, avg(csteady, "jobs"), AIMS["connect_run"]),
        ("Connect: a fresh process (dagster CLI)", launch, None, AIMS["connect_launch"]),
        ("  the same in a new session (before)", launch_new, None, None),
        ("warm local: notebook MERGE of the same day", avg(steady, "notebook"),
         avg(steady, "notebook_jobs"), None),
        ("Connect: notebook MERGE of the same day", avg(csteady, "notebook"),
         avg(csteady, "notebook_jobs"), None),
    ]  # fmt: skip
    for name, seconds, jobs, aim in rows:
        jobs_text = f"{jobs:.0f}" if jobs is not None else ""
        aim_text = (f"<{aim:.0f}s " + ("met" if seconds < aim else "NOT met")) if aim else ""
        print(f"{name:<44} {seconds:>8.1f} {jobs_text:>11} {aim_text:>8}")
    trips = avg(csteady, "round_trips")
    print(
        f"Connect: round trips to the server a run: {trips:.0f} (on a network {RTT_MS} ms away, "
        f"as a remote workspace may be: {trips * RTT_MS / 1000:.1f} s of waiting a run)"
    )

    per_table = batched["checks"] / args.tables
    own_run = sum(a["wall"] for a in alone) / len(alone)
    spark_start = local["spark_start"]
    hourly_batched = spark_start + 500 * per_table
    hourly_alone = 500 * own_run
    print(f"\nLate-rows checks (measured on {args.tables} tables, nothing late; per hour for 500)")
    print(f"{'how':<44} {'s/table':>8} {'runs/h':>7} {'Spark starts/h':>15} {'s/h (500)':>10}")
    print(f"{'one run per table (before)':<44} {own_run:>8.1f} {500:>7} {500:>15} "
          f"{hourly_alone:>10.0f}")  # fmt: skip
    print(f"{'one run for all due tables (now)':<44} {per_table:>8.2f} {1:>7} {1:>15} "
          f"{hourly_batched:>10.0f}")  # fmt: skip
    print(f"ratio: {hourly_alone / hourly_batched:.0f}x fewer seconds an hour")


def _steps(measured: dict, field: str = "step") -> str:
    return " ".join(f"{run[field]:.1f}" for run in measured["runs"])


if __name__ == "__main__":
    main()
