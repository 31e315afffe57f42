"""Builders shared by the tests: instants, real sources (Delta tables, Parquet folders,
landing files), table specs, reference results computed in plain Python, and a Dagster
project in a temporary folder. Fixtures live in ``conftest.py``; test modules import what
they need from here, never from each other."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.demo import run as demo_run
from incremental_assets.demo.simulator import INVOICE_DDL
from incremental_assets.engine import DeltaTarget, LoadRequest, run_load
from incremental_assets.engine.declared_layers import LayerResult, layer_inputs, refresh_layer
from incremental_assets.engine.faults import CRASH_ENV
from incremental_assets.specs import TableSpec, WarehouseSpec, load_project
from incremental_assets.specs.models import relative_day
from incremental_assets_tests.servers import INTERPRETED, QUICK_JIT

UTC = timezone.utc
PROJECT_ROOT = Path(__file__).resolve().parent.parent
"""The repository's root: README.md, tables.yaml and dagster.yaml are there."""


def at(day: int, hour: float = 0, minute: int = 0, second: int = 0) -> datetime:
    """An instant in January 2026 (UTC)."""
    return datetime(2026, 1, day, tzinfo=UTC) + timedelta(
        hours=hour, minutes=minute, seconds=second
    )


def table_of(schema: pa.Schema, rows: list[tuple]) -> pa.Table:
    """An Arrow table of ``rows`` (tuples in the order of ``schema``'s fields)."""
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema)


# --- orders: a table updated in place, the default source of make_spec ------------------

ORDERS = pa.schema(
    [
        ("order_id", pa.int64()),
        ("status", pa.string()),
        ("amount", pa.float64()),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)


def order_rows(rows: list[tuple[int, str, float, datetime]]) -> pa.Table:
    return table_of(ORDERS, rows)


# Spark settings for a run a test starts in a child process (a JVM of its own for one small
# load): two shuffle partitions and Delta snapshot tasks, as in the tests' own session
# (local[*] defaults to 8 of each), and the quick JIT compiler only: in a JVM that lives
# half a minute on 2 shared cores, the optimizing compiler's threads took the cores from
# the work (a kill test's child: 43-48 s with it, 26-27 s without it and with 2 partitions).
CHILD_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.driver.extraJavaOptions": QUICK_JIT,
    **INTERPRETED,
}


_STREAM_CHILD = """
import sys
from incremental_assets.engine.declared_layers import layer_inputs, stream_layer
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import load_project
project = load_project(sys.argv[1])
spark = local_session(**dict(arg.split("=", 1) for arg in sys.argv[3:]))
stream_layer(spark, layer_inputs(project, project.layer(sys.argv[2])))
"""


def stream_killed(tables: Path, layer: str, point: str = "after_commit"):
    """Run ``layer``'s streaming query in a child process (a local session of its own)
    that is killed with SIGKILL at the crash point ``point``; the finished process."""
    conf = [f"{k}={v}" for k, v in CHILD_SPARK_CONF.items()]
    env = {**os.environ, CRASH_ENV: point, "INCREMENTAL_ASSETS_DRIVER_MEMORY": "1g"}
    command = [sys.executable, "-c", _STREAM_CHILD, str(tables), layer, *conf]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def jobs_in(spark, group: str, action) -> tuple[object, int]:
    """What ``action`` returns, and how many Spark jobs it ran (under job group ``group``;
    a local session's SparkContext: classic only)."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    try:
        result = action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return result, len(context.statusTracker().getJobIdsForGroup(group))


def spark_section(conf: dict[str, str] = CHILD_SPARK_CONF) -> str:
    """A tables file's ``spark:`` section with ``conf`` (by default a child run's)."""
    settings = "".join(f"    {key}: {json.dumps(value)}\n" for key, value in conf.items())
    return f"spark:\n  conf:\n{settings}"


def hive_catalog_conf(folder: Path) -> dict[str, str]:
    """Spark settings for a catalog backed by a Hive metastore in ``folder``: embedded
    Derby (one process at a time) and the managed tables' warehouse beside it."""
    derby = f"jdbc:derby:;databaseName={folder / 'metastore_db'};create=true"
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(folder / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": derby,
        # Derby's log, written to the process's working folder unless told.
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={folder}",
    }


class DeltaSourceTable:
    """A mutable source table (like a database table) stored as Delta."""

    def __init__(self, path: Path):
        self.path = str(path)

    def upsert(self, rows: list[tuple[int, str, float, datetime]]) -> None:
        table = order_rows(rows)
        if not DeltaTable.is_deltatable(self.path):
            write_deltalake(self.path, table)
            return
        (
            DeltaTable(self.path)
            .merge(table, "t.order_id = s.order_id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )

    def append(self, table: pa.Table) -> None:
        write_deltalake(self.path, table, mode="append")

    # A delivery to a feed kept as Delta is one append commit, as ParquetFolder.drop is a
    # file: tests of feeds run on either.
    drop = append

    def replace(self, table: pa.Table) -> None:
        """The source's whole state becomes ``table`` (a snapshot source)."""
        write_deltalake(self.path, table, mode="overwrite", schema_mode="overwrite")


class ParquetFolder:
    """An append-only source: a folder that receives Parquet files."""

    def __init__(self, path: Path):
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)
        self._n = 0

    def drop(self, table: pa.Table) -> None:
        self._n += 1
        pq.write_table(table, self.path / f"part-{self._n:05d}.parquet")


def make_spec(source_path: str, **overrides: Any) -> TableSpec:
    """The ``orders`` upsert table on a Delta source; ``overrides`` replace top-level
    fields (a mapping is merged into the default mapping)."""
    raw: dict[str, Any] = {
        "name": "orders",
        "source": {"format": "delta", "path": source_path},
        "keys": ["order_id"],
        "watermark": {"column": "updated_at", "kind": "timestamp", "lookback": "0s"},
        "strategy": "upsert",
        "partitioning": {"granularity": "daily", "start": "2026-01-01"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return TableSpec.model_validate(raw)


def day_request(first: int, last: int | None = None, **kwargs: Any) -> LoadRequest:
    last = first if last is None else last
    return LoadRequest(at(first), at(last + 1), **kwargs)


def load(spark, spec, target, first: int, last: int | None = None, **kwargs: Any):
    """Run one load of days ``first..last`` (a range when ``last`` is given)."""
    backfill = kwargs.pop("backfill", last is not None and last != first)
    hook = kwargs.pop("hook", None)
    return run_load(
        spark, spec, target, day_request(first, last, backfill=backfill, **kwargs), hook=hook
    )


def staging_seen(
    target: DeltaTarget, phase: str, pattern: str
) -> tuple[Callable[[str], None], list[list[str]]]:
    """A ``load`` hook, and what it sees: at each ``phase`` of a run, the sorted names of
    the folders under ``target``'s staging root that match ``pattern`` (a glob)."""
    root = Path(target.path + "__staging")
    seen: list[list[str]] = []

    def look(now: str) -> None:
        if now == phase:
            seen.append(sorted(p.name for p in root.glob(pattern) if p.is_dir()))

    return look, seen


def target_rows(target: DeltaTarget, columns=("order_id", "status", "amount", "updated_at")):
    """The target's rows as sorted tuples of ``columns`` (system columns left out)."""
    table = DeltaTable(target.path).to_pyarrow_table(columns=list(columns))
    return sorted(tuple(r[c] for c in columns) for r in table.to_pylist())


def rows(target: DeltaTarget, *columns: str) -> list[tuple]:
    """The target's rows as sorted tuples of ``columns``."""
    return target_rows(target, columns)


# --- change feeds (CDC) and their plain-Python references --------------------------------

FEED = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("op", pa.string()),
        ("lsn", pa.int64()),
        ("changed_at", pa.timestamp("us", tz="UTC")),
    ]
)


def feed(*events: tuple) -> pa.Table:
    """Change events ``(id, name, op, lsn, changed_at)``."""
    return table_of(FEED, list(events))


def feed_spec(
    path: Path, strategy: Any, source_format: str = "parquet", **overrides: Any
) -> TableSpec:
    """A table over a folder of ``feed`` files (or a Delta table of them): key ``id``,
    ``lsn`` as an id watermark, partitions by ``changed_at``; ``overrides`` as
    ``make_spec``'s."""
    return make_spec(
        str(path),
        source={"format": source_format},
        keys=["id"],
        watermark={"column": "lsn", "kind": "id", "lookback": 0},
        partitioning={"column": "changed_at"},
        strategy=strategy,
        **overrides,
    )


def cdc_spec(path: Path, **strategy) -> TableSpec:
    return feed_spec(path, {"kind": "cdc", **strategy})


def cdc_history_spec(path: Path, **strategy) -> TableSpec:
    """An SCD2 history table over a CDC feed (``feed``)."""
    return feed_spec(path, {"kind": "scd2", "changes": "cdc", **strategy})


def history(
    seed: int, keys: int = 200, events: int = 900, names: tuple[str, ...] = ()
) -> list[tuple]:
    """Random changes with unique increasing sequence numbers: inserts, updates, deletes,
    re-inserts after delete; stamped over four days. With ``names`` the value is drawn
    from them (so an update may leave it unchanged), else unique per event."""
    rng = random.Random(seed)
    alive: dict[int, bool] = {}
    out = []
    for lsn in range(1, events + 1):
        key = rng.randint(1, keys)
        op = rng.choice(["U", "U", "U", "D"]) if alive.get(key) else "I"
        alive[key] = op != "D"
        stamp = at(1) + timedelta(seconds=int(lsn * 4 * 86400 / (events + 1)))
        value = rng.choice(names) if names else f"v{lsn}"
        out.append((key, value if op != "D" else None, op, lsn, stamp))
    return out


def reference(events: list[tuple], deletes: str) -> list[tuple]:
    """The expected CDC table, computed in plain Python from the full history."""
    last: dict[int, tuple] = {}
    for event in events:
        if event[0] not in last or event[3] > last[event[0]][3]:
            last[event[0]] = event
    out = []
    for key, (_, name, op, lsn, stamp) in sorted(last.items()):
        if deletes == "hard" and op == "D":
            continue
        if deletes == "hard":
            out.append((key, name, lsn))
        elif deletes == "soft":
            out.append((key, name, lsn, op == "D", stamp if op == "D" else None))
        else:  # upsert of a feed without deletes
            out.append((key, name, lsn))
    return out


def scd2_reference(events: list[tuple]) -> list[tuple]:
    """Versions per key from the full history: ordered by change time, a new version where
    the tracked value (name) changes or after a delete; a version keeps its newest event's
    untracked values (lsn); a delete closes the current version."""
    by_key: dict[int, dict[int, tuple]] = defaultdict(dict)
    for event in events:
        by_key[event[0]][event[3]] = event  # duplicates collapse on the sequence
    out = []
    for key, changes in by_key.items():
        current: dict | None = None
        closed = []
        for _, name, op, lsn, stamp in sorted(changes.values(), key=lambda e: (e[4], e[3])):
            if current and (op == "D" or current["name"] != name):
                closed.append({**current, "end": stamp})
                current = None
            if op == "D":
                continue
            if current is None:
                current = {"name": name, "start": stamp, "lsn": lsn, "end": None}
            current["lsn"] = lsn
        for v in [*closed, *([current] if current else [])]:
            out.append((key, v["name"], v["lsn"], v["start"], v["end"], v["end"] is None))
    return sorted(out)


def deliver(events: list[tuple], rng: random.Random) -> list[list[tuple]]:
    """Cut into random batches; duplicate some events; move some to later batches."""
    shuffled = list(events)
    for _ in range(len(events) // 10):
        i = rng.randrange(len(shuffled))
        shuffled.insert(min(len(shuffled), i + rng.randint(1, 200)), shuffled.pop(i))
    shuffled += rng.sample(events, len(events) // 20)  # duplicates, delivered again later
    cuts = sorted(rng.sample(range(1, len(shuffled)), 5))
    return [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(shuffled)], strict=True)]


# --- snapshots -----------------------------------------------------------------------------

PRODUCTS = pa.schema([("id", pa.int64()), ("name", pa.string()), ("price", pa.float64())])


def products(*items: tuple) -> pa.Table:
    """Products ``(id, name, price)``."""
    return table_of(PRODUCTS, list(items))


def snapshot_spec(path: str, **strategy) -> TableSpec:
    return make_spec(path, keys=["id"], watermark=None, strategy={"kind": "snapshot", **strategy})


# --- landing files: point-of-sale invoices as JSON lines ----------------------------------

NOW = datetime(2026, 1, 2, 12, tzinfo=UTC)
OLD = NOW - timedelta(hours=1)


def invoice(number: int, store: str = "STR7188", items: int = 2) -> dict:
    lines = [
        {
            "ItemCode": f"{400 + i}",
            "ItemDescription": f"item {i}",
            "ItemPrice": 10.0 * (i + 1),
            "ItemQty": 1,
            "TotalValue": 10.0 * (i + 1),
        }
        for i in range(items)
    ]
    total = sum(line["TotalValue"] for line in lines)
    return {
        "InvoiceNumber": f"INV{number}",
        "CreatedTime": 1767225600000 + number * 60_000,
        "StoreID": store,
        "PosID": "POS1",
        "CashierID": "C1",
        "CustomerType": "PRIME",
        "CustomerCardNo": "4629185211",
        "TotalAmount": total,
        "NumberOfItems": items,
        "PaymentMethod": "CARD",
        "TaxableAmount": total,
        "CGST": 0.0,
        "SGST": 0.0,
        "CESS": 0.0,
        "DeliveryType": "HOME-DELIVERY",
        "DeliveryAddress": {
            "AddressLine": "1 Main St",
            "City": "Pune",
            "ContactNumber": "9000000000",
            "PinCode": "411001",
            "State": "MH",
        },
        "InvoiceLineItems": lines,
    }


def drop(folder: Path, name: str, invoices: list[dict], modified: datetime = OLD) -> Path:
    """Write a JSON-lines file and set its modification time."""
    path = folder / name
    path.write_text("".join(json.dumps(i) + "\n" for i in invoices))
    stamp = modified.timestamp()
    os.utime(path, (stamp, stamp))
    return path


def landing_spec(folder: Path, **landing: Any) -> TableSpec:
    """The invoice landing table (bronze) on ``folder``; ``landing`` adds to its
    ``source.landing`` settings."""
    return TableSpec.model_validate(
        {
            "name": "invoices_bronze",
            "source": {
                "format": "json",
                "path": str(folder),
                "schema": INVOICE_DDL,
                "landing": {"settle": "30s", **landing},
            },
            "strategy": "append",
            "partitioning": {"granularity": "daily", "start": "2026-01-01"},
        }
    )


class InvoiceLayers:
    """The invoices' silver and gold as the project's tables.yaml declares them, after the
    landing table ``bronze``, with every table under ``warehouse``; ``silver()`` and
    ``gold()`` refresh one layer (engine/declared_layers) and return what it did."""

    def __init__(self, spark, warehouse: Path, bronze: TableSpec):
        declared = load_project(PROJECT_ROOT / "tables.yaml")
        self.spark = spark
        self.project = declared.model_copy(
            update={
                "warehouse": WarehouseSpec(root=str(warehouse)),
                "tables": [bronze],
                "layers": demo_run.invoice_layers(declared),
            }
        )
        self.bronze = DeltaTarget(bronze.name, self.project.target_path(bronze))
        self.silver_layer = self.project.layer("invoices_silver")
        self.gold_layer = self.project.layer("invoices_gold")
        self.silver_target = DeltaTarget(
            "invoices_silver", self.project.layer_path(self.silver_layer)
        )
        self.gold_target = DeltaTarget("invoices_gold", self.project.layer_path(self.gold_layer))

    def silver(self) -> LayerResult:
        return refresh_layer(self.spark, layer_inputs(self.project, self.silver_layer))

    def gold(self) -> LayerResult:
        return refresh_layer(self.spark, layer_inputs(self.project, self.gold_layer))

    def gold_rows(self) -> list[tuple]:
        """Gold's rows: (day, store, payment method, invoices, items, sales rounded)."""
        return comparable_gold(self.gold_target.to_spark(self.spark))

    def gold_from_scratch(self) -> list[tuple]:
        """Sales per day, store and payment method over silver as it is, computed here
        with plain Spark (not with the layer's code)."""
        silver = self.silver_target.to_spark(self.spark)
        daily = silver.groupBy(
            F.window("CreatedTime", "1 day")["start"].alias("window_start"),
            "StoreID",
            "PaymentMethod",
        ).agg(
            F.countDistinct("InvoiceNumber").alias("invoices"),
            F.sum("ItemQty").alias("items"),
            F.sum("TotalValue").alias("sales"),
        )
        return comparable_gold(daily)


def invoice_layers_yaml() -> str:
    """The ``layers`` section of the project's tables.yaml (the invoices' silver and gold),
    to append to a tables file whose bronze table is ``invoices_bronze``."""
    declared = yaml.safe_load((PROJECT_ROOT / "tables.yaml").read_text())["layers"]
    return yaml.safe_dump({"layers": invoices_chain(declared)}, sort_keys=False)


def invoices_chain(layers: list[dict]) -> list[dict]:
    """Of a tables file's ``layers`` section, those after ``invoices_bronze`` (and after
    those): not the streaming layer after the CSV invoices."""
    after, out = {"invoices_bronze"}, []
    for layer in layers:
        if layer["from"] in after:
            after.add(layer["name"])
            out.append(layer)
    return out


def comparable_gold(rows) -> list[tuple]:
    """Daily gold rows as sorted tuples, the day (UTC, formatted by Spark) first and sales
    rounded to 6 decimals (a sum of doubles depends on the order Spark adds them in)."""
    day = F.date_format("window_start", "yyyy-MM-dd").alias("day")
    columns = ["StoreID", "PaymentMethod", "invoices", "items", "sales"]
    return sorted(
        (r["day"], *[round(v, 6) if isinstance(v, float) else v for v in r[1:]])
        for r in rows.select(day, *columns).collect()
    )


def days(result: LayerResult) -> list[str]:
    """The days a daily aggregate layer's refresh recomputed."""
    return [w.date().isoformat() for w in result.windows]


def written(result: LayerResult) -> int:
    """Rows a refresh inserted or updated."""
    return result.rows_inserted + result.rows_updated


# --- a Dagster project in a folder ---------------------------------------------------------

ORDERS_YAML = """
warehouse:
  root: ./warehouse
tables:
  - name: orders
    source: {format: delta, path: ./source/orders}
    keys: [order_id]
    watermark: {column: updated_at, kind: timestamp, lookback: 1h}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
"""


# --- the invoices as CSV files, for a streaming layer -------------------------------

STREAMING_YAML = """
warehouse: {root: ./warehouse}
tables:
  - name: invoices
    source:
      format: csv
      path: ./landing/invoices
      schema: "InvoiceID STRING, CustomerID STRING, InvoiceDate TIMESTAMP, TotalAmount DOUBLE"
      options: {header: "true", maxFilesPerTrigger: "1"}   # a batch per file, in name order
      landing: {settle: 0s}
    strategy: append
    partitioning: {granularity: daily, start: 2026-01-01}
layers:
  - name: invoice_totals
    kind: aggregate
    from: invoices
    run: streaming
    group_by: [CustomerID]
    window: {column: InvoiceDate, size: 1h, watermark: 1h}
    aggregates:
      - {name: total_amount, function: sum, column: TotalAmount}
      - {name: invoices, function: count}
"""
STREAMING_COLUMNS = ["CustomerID", "window_start", "window_end", "total_amount", "invoices"]
Invoice = tuple[str, str, str, float]  # InvoiceID, CustomerID, InvoiceDate (UTC), TotalAmount


class InvoiceFiles:
    """The landing folder of STREAMING_YAML's ``invoices``: CSV files with a header, each
    written whole and stamped a second after the one before (Spark's file stream takes
    the oldest first, one per batch with maxFilesPerTrigger 1)."""

    def __init__(self, root: Path):
        self.folder = root / "landing" / "invoices"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.written: list[Invoice] = []
        self.written_files: list[str] = []
        self.started = int(datetime.now(UTC).timestamp())

    def drop(self, *invoices: Invoice) -> None:
        name = f"invoices-{len(self.written_files):03d}.csv"
        lines = ["InvoiceID,CustomerID,InvoiceDate,TotalAmount"]
        lines += [f"{i},{c},{t},{a}" for i, c, t, a in invoices]
        partial = self.folder / f".{name}.partial"  # hidden from Spark until renamed
        partial.write_text("\n".join(lines) + "\n")
        stamp = self.started + len(self.written_files)
        os.utime(partial, (stamp, stamp))
        partial.rename(self.folder / name)
        self.written_files.append(name)
        self.written.extend(invoices)


def hourly_totals(invoices: list[Invoice]) -> list[tuple]:
    """STREAMING_YAML's layer computed from scratch in plain Python: per customer and hour,
    the sum of TotalAmount and the count."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for _, customer, time, amount in invoices:
        start = datetime.fromisoformat(time).replace(minute=0, second=0, tzinfo=UTC)
        groups[(customer, start, start + timedelta(hours=1))].append(amount)
    return sorted((*key, sum(amounts), len(amounts)) for key, amounts in groups.items())


class Project:
    """A project folder with its ``tables.yaml`` (by default the ``orders`` table of
    ORDERS_YAML on a Delta source), its definitions and its first table's target."""

    def __init__(self, root: Path, yaml_text: str = ORDERS_YAML):
        root.mkdir(parents=True, exist_ok=True)
        (root / "tables.yaml").write_text(yaml_text)
        self.spec = load_project(root / "tables.yaml")
        self.defs = build_definitions(self.spec)
        self.source = DeltaSourceTable(root / "source" / "orders")
        self.target = self.defs.resources["warehouse"].target(self.spec, self.spec.tables[0])

    def materialize(self, instance, partition=None, partition_range=None, **kwargs):
        tags = {}
        if partition_range:
            tags = {
                "dagster/asset_partition_range_start": partition_range[0],
                "dagster/asset_partition_range_end": partition_range[1],
            }
        return dg.materialize(
            [self.defs.get_assets_def("orders")],
            partition_key=partition,
            instance=instance,
            resources=self.defs.resources,
            tags=tags,
            **kwargs,
        )


def staging_left(root: Path) -> list[str]:
    """What a table's staging root holds besides the empty file its emptying leaves (and
    that file's checksum): run folders and the files of runs."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_dir() or (p.stat().st_size and not p.name.endswith(".crc"))
    )


# --- the README's demo, run once per test session ---------------------------------------


@dataclass(frozen=True)
class FinishedDemo:
    """A finished run of the demo (``incremental_assets.demo.run.main``) in ``root``: its
    tables file, Dagster instance and data, the rounds it ran, its exit code and what it
    printed."""

    root: Path
    rounds: int
    code: int
    out: str

    def environment(self) -> dict[str, str]:
        """The environment in which Dagster (``dagster dev``, ``build_definitions``) uses
        the demo's instance and tables file."""
        return {
            **os.environ,
            "DAGSTER_HOME": str(self.root),
            "INCREMENTAL_ASSETS_TABLES": str(self.root / "tables.yaml"),
        }


def run_demo(root: Path, rounds: int, only: Sequence[str] = ()) -> FinishedDemo:
    """Run the demo in ``root`` as ``./dev demo`` does, with the project's tables.yaml,
    dagster.yaml and workspace.yaml (for ``dagster dev`` on it afterwards) copied there and
    its instance there; the working folder and the environment are restored afterwards.

    The folder stays where it is: the targets' commits record their sources by absolute
    path, so a copy elsewhere would read as switched sources.

    The copied tables.yaml has its relative starts (``today-4d``) written as the dates they
    are now: a test session can cross midnight UTC, and a start that moved with the calendar
    would leave the demo's first day outside the partitions the later tests read (the UI
    would show one of the two days filled)."""
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copy(PROJECT_ROOT / name, root / name)
    (root / "tables.yaml").write_text(
        re.sub(
            r"(start:\s*)(today(?:\s*-\s*\d+\s*d)?)\b",
            lambda match: f"{match[1]}{relative_day(match[2]):%Y-%m-%d}",
            (PROJECT_ROOT / "tables.yaml").read_text(),
        )
    )
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setenv("INCREMENTAL_ASSETS_TABLES", str(root / "tables.yaml"))
        patch.setenv("DAGSTER_HOME", str(root))  # main sets it too: restored after
        patch.chdir(root)
        code = demo_run.main(rounds=rounds, root=root, only=only)
    return FinishedDemo(root, rounds, code, out.getvalue())
