"""Landing files: picking up new files beside many loaded ones, and gold's refresh of one
changed day against recomputing a whole year.

1. pick-up: a landing folder of JSON-lines invoice files (one invoice each). ``--loaded``
   files (default 10,000) are loaded first by the engine's own ``load_landing`` in batches
   of ``--seed-batch`` files (untimed: it builds bronze and its file index); then
   ``--new`` files (default 10) are dropped and one ``load_landing`` picks them up, timed,
   with the files it listed and the files it read (median of ``--repeats``, each time
   ``--new`` more files). The same pick-up beside ``--baseline``
   loaded files (default 100) is the baseline: the difference is what the loaded files
   cost.
2. gold: ``--days`` days (default 365) of invoices, one file per day with
   ``--invoices-per-day`` invoices (default 1,000), loaded to bronze, silver and gold.
   Silver and gold are the layers the project's tables.yaml declares. One day's file is
   then rewritten in place (new content) and loaded to bronze and silver (untimed), and
   gold's refresh is timed: it recomputes and replaces that day only. Against it, the
   same layer into a fresh gold table recomputes the whole year (the same code, every
   day). Each is the median of ``--repeats`` runs (a different day each time), and the
   incremental gold is checked equal to the full recompute.

Run from the repository root::

    .venv/bin/python benchmarks/landing.py                        # ~5 min on 2 cores
    .venv/bin/python benchmarks/landing.py --loaded 1000 --days 30  # smoke run
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from dagster_deltalake import S3Config
from deltalake import DeltaTable

from incremental_assets.dagster_layer.resources import DeltaWarehouse
from incremental_assets.definitions import PROJECT_ROOT
from incremental_assets.demo.run import invoice_layers
from incremental_assets.demo.simulator import INVOICE_DDL, random_invoice
from incremental_assets.engine.declared_layers import LayerResult, layer_inputs, refresh_layer
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.landing import load_landing, pending_files
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import ProjectSpec, TableSpec, WarehouseSpec, load_project

START = datetime(2026, 1, 1, tzinfo=timezone.utc)
STORES = ("STR7188", "STR1534", "STR2629", "STR4011")
SETTLED = (START - timedelta(days=1)).timestamp()


def spec_for(folder: Path | str, settle: str = "30s") -> TableSpec:
    """The invoice landing table (bronze) on ``folder``, as the demo's without refine."""
    return TableSpec.model_validate(
        {
            "name": "invoices_bronze",
            "source": {
                "format": "json",
                "path": str(folder),
                "schema": INVOICE_DDL,
                "landing": {"settle": settle},
            },
            "strategy": "append",
            "partitioning": {"granularity": "daily", "start": "2026-01-01"},
        }
    )


def invoice(rng: random.Random, number: int, day: int) -> dict:
    return random_invoice(rng, f"INV{number:09d}", START + timedelta(days=day), stores=STORES)


def write_file(path: Path, rows: list[dict], stamp: float = SETTLED) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.utime(path, (stamp, stamp))


class LocalFolder:
    """The landing folder on local disk."""

    def __init__(self, root: Path):
        self.path = root / "landing"
        self.spec = spec_for(self.path)
        self.storage: dict[str, str] = {}

    def write(self, name: str, rows: list[dict]) -> None:
        write_file(self.path / name, rows)

    def reads(self) -> int | None:
        return None  # Spark reads local files in place: files_loaded says which


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


class S3Server:
    """moto's S3 server (dev extra) in a child process on a free local port, over HTTP
    (in a thread of this process it would wait for the GIL that delta-rs's listing holds).
    Its request log (stderr) tells which objects were downloaded."""

    def __init__(self, root: Path):
        import boto3  # installed with moto

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.log = root / "moto.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        deadline = time.monotonic() + 60
        while not _accepts(port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"moto's S3 server did not start; see {self.log}")
            time.sleep(0.2)
        self.endpoint = f"http://127.0.0.1:{port}"
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        )

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

    def storage_options(self) -> dict[str, str]:
        """The warehouse resource's storage options for this server (plain http needs
        ``allow_http``, which dagster-deltalake's S3Config lacks)."""
        storage = S3Config(
            endpoint=self.endpoint,
            access_key_id="test",
            secret_access_key="test",
            region="us-east-1",
        )
        return DeltaWarehouse(storage=storage, options={"allow_http": "true"}).storage_options()

    def object_reads(self, bucket: str) -> int:
        """GET requests logged for the objects of ``bucket`` (listings not counted)."""
        plain = re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text())  # colours
        return len(re.findall(rf'"GET /{re.escape(bucket)}/[^ ?]+ HTTP', plain))


class S3Folder:
    """The landing folder in a bucket of an S3-compatible server (moto's); objects cannot
    be back-dated, so they settle at once."""

    def __init__(self, server: S3Server, bucket: str):
        server.client.create_bucket(Bucket=bucket)
        self.server, self.bucket = server, bucket
        self.spec = spec_for(f"s3://{bucket}/landing", settle="0s")
        self.storage = server.storage_options()

    def write(self, name: str, rows: list[dict]) -> None:
        body = "".join(json.dumps(r) + "\n" for r in rows).encode()
        self.server.client.put_object(Bucket=self.bucket, Key=f"landing/{name}", Body=body)

    def reads(self) -> int:
        return self.server.object_reads(self.bucket)


def pick_up(spark, root: Path, folder, loaded: int, new: int, batch: int, repeats: int) -> dict:
    """Seed ``loaded`` files (untimed, real loads in batches), then ``repeats`` times drop
    ``new`` files and time one load (the median is reported)."""
    target = DeltaTarget("invoices_bronze", str(root / "bronze"), folder.storage)
    spec = folder.spec
    rng = random.Random(loaded)
    seeded = 0
    seed_started = time.perf_counter()
    while seeded < loaded:
        size = min(batch, loaded - seeded)
        # Each batch in its own sub-folder written just before it is loaded, so a batch's
        # load reads only its files (the folder is listed whole each time, as in use).
        for n in range(seeded, seeded + size):
            folder.write(f"b{n // batch:03d}/pos-{n:06d}.json", [invoice(rng, n, 0)])
        report = load_landing(spark, spec, target)
        assert len(report.files_loaded) == size, report
        seeded += size
    seed_seconds = time.perf_counter() - seed_started
    timings, list_timings = [], []
    reads_before = folder.reads()
    for attempt in range(repeats):
        for n in range(new):
            name = f"pos-new-{attempt}-{n:03d}.json"
            folder.write(f"new/{name}", [invoice(rng, 10**8 + 1000 * attempt + n, 1)])
        started = time.perf_counter()
        pending, listing = pending_files(spec, target)
        list_timings.append(time.perf_counter() - started)
        started = time.perf_counter()
        report = load_landing(spark, spec, target)
        timings.append(time.perf_counter() - started)
        assert len(pending) == new and len(report.files_loaded) == new, report
        assert report.files_already_loaded == loaded + attempt * new
    reads = folder.reads()
    return {
        "loaded": loaded,
        "objects_read": None if reads is None else (reads - reads_before) / repeats,
        "seed_seconds": seed_seconds,
        "listed": len(listing.ready),
        "read": len(report.files_loaded),
        "list_seconds": statistics.median(list_timings),
        "seconds": statistics.median(timings),
        "rows": report.rows_read,
    }


def invoice_project(warehouse: Path, spec: TableSpec, gold_name: str | None = None) -> ProjectSpec:
    """The landing table ``spec`` with the invoices' silver and gold as the project's
    tables.yaml declares them, every table under ``warehouse`` (gold named ``gold_name``,
    for a fresh gold table beside the first)."""
    declared = load_project(PROJECT_ROOT / "tables.yaml")
    silver, gold = invoice_layers(declared)
    if gold_name:
        gold = gold.model_copy(update={"name": gold_name})
    return declared.model_copy(
        update={
            "warehouse": WarehouseSpec(root=str(warehouse)),
            "tables": [spec],
            "layers": [silver, gold],
        }
    )


def refresh(spark, project: ProjectSpec, index: int) -> LayerResult:
    """Refresh the project's layer ``index`` (0: silver, 1: gold)."""
    return refresh_layer(spark, layer_inputs(project, project.layers[index]))


def gold_refresh(spark, root: Path, days: int, per_day: int, repeats: int) -> dict:
    folder = root / "landing"
    spec = spec_for(folder)
    project = invoice_project(root, spec)
    bronze = DeltaTarget("invoices_bronze", project.target_path(spec))
    silver = DeltaTarget("invoices_silver", project.layer_path(project.layers[0]))
    gold = DeltaTarget("invoices_gold", project.layer_path(project.layers[1]))
    rng = random.Random(days)
    number = 0
    for day in range(days):
        rows = [invoice(rng, number + i, day) for i in range(per_day)]
        number += per_day
        write_file(folder / f"day-{day:03d}.json", rows)
    started = time.perf_counter()
    load_landing(spark, spec, bronze)
    refresh(spark, project, 0)
    first = refresh(spark, project, 1)
    build_seconds = time.perf_counter() - started
    assert len(first.windows) == days, first

    incremental, upstream = [], []
    for n in range(repeats):
        day = (days // (repeats + 1)) * (n + 1)
        # The day's file rewritten in place: the same invoices, new amounts, one more.
        rows = [invoice(rng, day * per_day + i, day) for i in range(per_day)]
        rows.append(invoice(rng, 10**8 + n, day))
        write_file(folder / f"day-{day:03d}.json", rows, SETTLED + 60 * (n + 1))
        started = time.perf_counter()
        load_landing(spark, spec, bronze)
        refresh(spark, project, 0)
        upstream.append(time.perf_counter() - started)
        started = time.perf_counter()
        step = refresh(spark, project, 1)
        incremental.append(time.perf_counter() - started)
        assert [w.date() for w in step.windows] == [(START + timedelta(days=day)).date()], step

    full = []
    for n in range(repeats):
        scratch = invoice_project(root, spec, gold_name=f"gold_full_{n}")
        started = time.perf_counter()
        step = refresh(spark, scratch, 1)
        full.append(time.perf_counter() - started)
        assert len(step.windows) == days
    same = _rows(spark, gold) == _rows(spark, DeltaTarget("g", str(root / "gold_full_0")))
    return {
        "days": days,
        "silver_lines": DeltaTable(silver.path).count(),
        "gold_rows": DeltaTable(gold.path).count(),
        "build_seconds": build_seconds,
        "upstream_seconds": statistics.median(upstream),
        "incremental_seconds": statistics.median(incremental),
        "full_seconds": statistics.median(full),
        "equal": same,
    }


def _rows(spark, target: DeltaTarget) -> list[tuple]:
    """Gold's rows, sales rounded to 6 decimals (a sum of doubles depends on the order
    Spark adds them in)."""
    return sorted(
        tuple(round(v, 6) if isinstance(v, float) else v for v in row)
        for row in target.to_spark(spark).collect()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loaded", type=int, default=10_000)
    parser.add_argument("--new", type=int, default=10)
    parser.add_argument(
        "--baseline", type=int, default=100, help="files loaded in the baseline pick-up"
    )
    parser.add_argument("--seed-batch", type=int, default=2_500)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--invoices-per-day", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", default=None, help="default: a temporary folder")
    parser.add_argument(
        "--store",
        choices=("local", "s3"),
        default="local",
        help="where the landing folder is: s3 runs the pick-up against moto's S3 server "
        "(dev extra) and skips the gold part",
    )
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="ia-bench-landing-", dir=args.data_dir))
    spark = local_session("incremental-assets-bench-landing")
    server = None
    if args.store == "s3":
        if importlib.util.find_spec("moto") is None:
            parser.error("--store s3 needs moto's S3 server: install the dev extra")
        server = S3Server(root)

    def folder(name: str):
        if server is None:
            return LocalFolder(root / name)
        return S3Folder(server, f"bench-{name}")

    gold = None
    try:
        # Start-up and JIT warm-up, not billed to the first measurement.
        pick_up(spark, root / "warm-up", folder("warm-up"), 20, args.new, 10, 2)
        base = pick_up(
            spark,
            root / "few",
            folder("few"),
            args.baseline,
            args.new,
            args.seed_batch,
            args.repeats,
        )
        many = pick_up(
            spark,
            root / "many",
            folder("many"),
            args.loaded,
            args.new,
            args.seed_batch,
            args.repeats,
        )
        if server is None:
            gold = gold_refresh(
                spark, root / "gold", args.days, args.invoices_per_day, args.repeats
            )
    finally:
        spark.stop()
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)

    where = "an S3 bucket (moto's server, local)" if server else "a local folder"
    print(
        f"\nPick-up of {args.new} new files (JSON lines, one invoice each) from {where}, "
        f"median of {args.repeats}"
    )
    print(
        "| files already loaded | files listed | files read | objects downloaded "
        "| list + diff (s) | load (s) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for r in (base, many):
        downloaded = "-" if r["objects_read"] is None else f"{r['objects_read']:.0f}"
        print(
            f"| {r['loaded']:,} | {r['listed']:,} | {r['read']} | {downloaded} | "
            f"{r['list_seconds']:.2f} | {r['seconds']:.2f} |"
        )
    print(
        f"(seeding {many['loaded']:,} files by real loads of {args.seed_batch:,}: "
        f"{many['seed_seconds']:.0f}s)"
    )
    if gold is None:
        return 0
    print(
        f"\nGold refresh, {gold['days']} days ({gold['silver_lines']:,} silver lines, "
        f"{gold['gold_rows']:,} gold rows), median of {args.repeats}"
    )
    print("| gold run | days recomputed | seconds |")
    print("|---|---:|---:|")
    print(f"| one changed day (incremental) | 1 | {gold['incremental_seconds']:.2f} |")
    print(f"| whole year (from scratch) | {gold['days']} | {gold['full_seconds']:.2f} |")
    ratio = gold["full_seconds"] / gold["incremental_seconds"]
    print(f"full / incremental: {ratio:.1f}x")
    print(
        f"(bronze + silver for the changed file: {gold['upstream_seconds']:.2f}s; first "
        f"build of the three layers: {gold['build_seconds']:.0f}s; incremental gold equal "
        f"to the full recompute: {gold['equal']})"
    )
    return 0 if gold["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
