"""Declared layers against Spark Declarative Pipelines and a full recompute: one new day of
invoice files on top of a year already processed.

The data: ``--days`` days (365) of invoice CSV files in a landing folder (the issue's
shape: ``InvoiceID, CustomerID, InvoiceDate, TotalAmount``), ``--files-per-day`` files
(1) of ``--invoices-per-day`` invoices (1,000) each, from ``--customers`` customers
(100), about 1% refunds (a negative amount) that silver leaves out. Then one new day of
files. The same silver (the invoices without refunds, CustomerID upper-cased) and gold
(total amount and invoices per customer and 1-day window of InvoiceDate), three ways:

1. **this project**: a landing table over the folder (``engine.landing.load_landing``),
   a declared row layer (silver, keys ``InvoiceID``) and a declared aggregate layer (gold,
   ``window: 1d``), refreshed with ``engine.declared_layers.refresh_layer``: the engine
   API the Dagster assets call, in this process;
2. **SDP**: a pipeline of a streaming table (silver) and a materialized view (gold)
   (sdp_pipeline.py), run by ``spark-pipelines run`` through Spark Connect;
3. **full recompute**: what a user writes by hand: read every file, select, overwrite
   silver; aggregate, overwrite gold.

Same Spark for all: this process's local session (pyspark 4.1, Delta's extension and
catalog, the project's settings) serves Spark Connect as well (Spark's Connect plugin),
and ``spark-pipelines run`` sends the pipeline there, so the three run in one JVM, one
after the other, measured alike (benchmarks/spark_meter.py: Spark's status REST API),
after an untimed warm-up (the full recompute once, into a scratch folder).
The initial build of the year and the new day's refresh are measured apart: seconds,
Spark jobs, files read (CSV and Parquet, from Spark's SQL metrics), rows written (the
Delta commits of every table the contender wrote). The golds must be equal (exit status
1 otherwise).

Run from the repository root::

    .venv/bin/python benchmarks/layers_vs_sdp.py                        # a few minutes
    .venv/bin/python benchmarks/layers_vs_sdp.py --days 30 --invoices-per-day 100  # smoke
"""

from __future__ import annotations

import argparse
import random
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from itertools import pairwise
from pathlib import Path

from bench_report import table as bench_table
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sdp_pipeline import PipelineRun, run_pipeline, write_pipeline
from spark_meter import METER_CONF, Measure, Meter

from incremental_assets.engine.declared_layers import layer_inputs, refresh_layer
from incremental_assets.engine.delta_lake.store import DeltaTarget, operation_metrics
from incremental_assets.engine.landing import load_landing
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import ProjectSpec, load_project

START = datetime(2025, 1, 1, tzinfo=timezone.utc)
SCHEMA = "InvoiceID STRING, CustomerID STRING, InvoiceDate TIMESTAMP, TotalAmount DECIMAL(12,2)"
# Silver, said once: the three contenders render it in their own way.
WHERE = "TotalAmount > 0"
COLUMNS = ["InvoiceID", "upper(CustomerID) AS CustomerID", "InvoiceDate", "TotalAmount"]
GOLD_COLUMNS = ["CustomerID", "window_start", "window_end", "total_amount", "invoices"]
SDP_DATABASE = "sdp"

PROJECT = """\
warehouse: {{root: ./warehouse}}
tables:
  - name: invoices
    source:
      format: csv
      path: {landing}
      schema: "{schema}"
      options: {{header: "true"}}
      landing: {{settle: 0s}}
    strategy: append
    partitioning: {{granularity: daily, start: 2025-01-01}}
layers:
  - name: invoices_silver
    from: invoices
    select: SELECT {columns} FROM invoices WHERE {where}
    keys: [InvoiceID]
  - name: invoices_gold
    kind: aggregate
    from: invoices_silver
    group_by: [CustomerID]
    window: {{column: InvoiceDate, size: 1d}}
    aggregates:
      - {{name: total_amount, function: sum, column: TotalAmount}}
      - {{name: invoices, function: count}}
"""


@dataclass
class Step:
    """One contender's build or refresh: what the meter saw, the rows its Delta commits
    wrote (per table), and for SDP the pipeline run's own timings."""

    measure: Measure
    rows_written: dict[str, int] = field(default_factory=dict)
    operations: dict[str, list[str]] = field(default_factory=dict)
    pipeline: PipelineRun | None = None
    note: str = ""


@dataclass
class Contender:
    name: str
    folder: Path  # every Delta table it writes is under it
    build: Step | None = None
    refresh: Step | None = None
    gold: list[tuple] = field(default_factory=list)


# --- the data ----------------------------------------------------------------------------


def write_day(landing: Path, day: int, args: argparse.Namespace) -> None:
    """Day ``day``'s files: ``--files-per-day`` CSV files of ``--invoices-per-day``
    invoices, written aside and moved in whole (a reader never sees half a file)."""
    rng = random.Random(day)
    per_file = max(args.invoices_per_day // args.files_per_day, 1)
    first = START + timedelta(days=day)
    for f in range(args.files_per_day):
        lines = ["InvoiceID,CustomerID,InvoiceDate,TotalAmount"]
        for i in range(per_file):
            at = first + timedelta(seconds=rng.randrange(86_400))
            amount = Decimal(rng.randrange(100, 50_000)) / 100
            if rng.random() < 0.01:
                amount = -amount  # a refund: silver leaves it out
            customer = f"c{rng.randrange(args.customers):05d}"
            lines.append(f"INV{day:04d}{f:03d}{i:06d},{customer},{at:%Y-%m-%d %H:%M:%S},{amount}")
        name = f"invoices-{first:%Y-%m-%d}-{f:03d}.csv"
        partial = landing / f".{name}.partial"  # hidden from Spark and the landing table
        partial.write_text("\n".join(lines) + "\n")
        partial.rename(landing / name)


# --- the contenders ------------------------------------------------------------------------


def project_for(root: Path, landing: Path) -> ProjectSpec:
    text = PROJECT.format(landing=landing, schema=SCHEMA, columns=", ".join(COLUMNS), where=WHERE)
    (root / "tables.yaml").write_text(text)
    return load_project(root / "tables.yaml")


def this_project(spark: SparkSession, project: ProjectSpec, meter: Meter) -> str:
    """Bronze, silver and gold, each from what is new upstream (each a phase of the
    meter's)."""
    spec = project.table("invoices")
    bronze = DeltaTarget(spec.name, project.target_path(spec))
    meter.mark("bronze")
    landed = load_landing(spark, spec, bronze)
    meter.mark("silver")
    silver = refresh_layer(spark, layer_inputs(project, project.layer("invoices_silver")))
    meter.mark("gold")
    gold = refresh_layer(spark, layer_inputs(project, project.layer("invoices_gold")))
    meter.mark("end")
    return (
        f"files loaded {len(landed.files_loaded)}; silver rows in {silver.rows_in:,} "
        f"({silver.changes_from}); gold windows recomputed {len(gold.windows)}, "
        f"groups {gold.groups_recomputed:,}"
    )


def phases(measure: Measure) -> str:
    """Seconds and Spark jobs of each marked phase."""
    marks = measure.marks
    jobs = measure.by_phase()
    return ", ".join(
        f"{name} {after - at:.1f}s ({len(jobs.get(name, []))} jobs)"
        for (name, at), (_, after) in pairwise(marks)
    )


def silver_of(invoices: DataFrame) -> DataFrame:
    return invoices.where(WHERE).selectExpr(*COLUMNS)


def gold_of(silver: DataFrame) -> DataFrame:
    return (
        silver.groupBy("CustomerID", F.window("InvoiceDate", "1 day").alias("w"))
        .agg(F.sum("TotalAmount").alias("total_amount"), F.count(F.lit(1)).alias("invoices"))
        .selectExpr("CustomerID", "w.start AS window_start", "w.end AS window_end",
                    "total_amount", "invoices")
    )  # fmt: skip


def full_recompute(spark: SparkSession, landing: Path, out: Path) -> None:
    """Every file read again, silver and gold overwritten."""
    invoices = spark.read.format("csv").option("header", "true").schema(SCHEMA).load(str(landing))
    silver_path, gold_path = str(out / "invoices_silver"), str(out / "invoices_gold")
    silver_of(invoices).write.format("delta").mode("overwrite").save(silver_path)
    silver = spark.read.format("delta").load(silver_path)
    gold_of(silver).write.format("delta").mode("overwrite").save(gold_path)


# --- measuring -----------------------------------------------------------------------------


def delta_tables(folder: Path) -> list[Path]:
    return sorted(p.parent for p in folder.rglob("_delta_log") if p.is_dir())


def versions(spark: SparkSession, folder: Path) -> dict[Path, int]:
    return {t: _version(spark, t) for t in delta_tables(folder)}


def _version(spark: SparkSession, table: Path) -> int:
    return spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").first()["version"]


def written(spark: SparkSession, folder: Path, before: dict[Path, int], step: Step) -> None:
    """Rows and operations of every Delta commit under ``folder`` after ``before``."""
    for table in delta_tables(folder):
        since = before.get(table, -1)
        commits = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").where(f"version > {since}")
        rows, operations = 0, []
        for commit in commits.orderBy("version").collect():
            metrics = operation_metrics(commit.asDict())
            rows += int(metrics.get("num_output_rows", 0) or 0)
            operations.append(commit["operation"])
        if operations:
            step.rows_written[table.name] = rows
            step.operations[table.name] = operations


def measured(spark: SparkSession, meter: Meter, contender: Contender, work) -> Step:
    before = versions(spark, contender.folder)
    with meter.measure() as m:
        result = work()
    step = Step(m)
    if isinstance(result, PipelineRun):
        step.pipeline = result
    elif result:
        step.note = result
    written(spark, contender.folder, before, step)
    return step


def gold_rows(frame: DataFrame) -> list[tuple]:
    return sorted(tuple(r) for r in frame.select(*GOLD_COLUMNS).collect())


# --- the report ----------------------------------------------------------------------------


def _seconds(step: Step) -> str:
    if step.pipeline is None:
        return f"{step.measure.seconds:.1f}"
    p = step.pipeline
    return f"{p.run_seconds:.1f} (command {p.seconds:.1f})"


def table(contenders: list[Contender], which: str) -> list[str]:
    lines = [
        "| contender | seconds | task CPU s | Spark jobs | CSV files read | Parquet files "
        "read (MB) | rows written (Delta commits) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in contenders:
        step: Step = getattr(c, which)
        m = step.measure
        rows = "; ".join(
            f"{name} {n:,} ({', '.join(step.operations[name])})"
            for name, n in step.rows_written.items()
        )
        lines.append(
            f"| {c.name} | {_seconds(step)} | {m.cpu_seconds:.1f} | {len(m.jobs)} | "
            f"{m.csv_files_read:,} | {m.files_read:,} ({m.bytes_read / 1e6:,.1f}) | {rows} |"
        )
    return lines


def report(contenders: list[Contender], args: argparse.Namespace, equal: bool) -> str:
    rows = args.days * args.invoices_per_day
    out = [
        f"{args.days} days x {args.files_per_day} file(s) x {args.invoices_per_day:,} "
        f"invoices ({rows:,} invoices, {args.customers:,} customers), then 1 new day",
        "",
        f"Initial build ({args.days} days):",
        *table(contenders, "build"),
        "",
        "New day (the refresh):",
        *table(contenders, "refresh"),
        "",
    ]
    for c in contenders:
        for which in ("build", "refresh"):
            step: Step = getattr(c, which)
            if step.note:
                out.append(f"{c.name}, {which}: {step.note}")
            if step.measure.marks:
                out.append(f"{c.name}, {which}: {phases(step.measure)}")
            if step.pipeline:
                flows = ", ".join(f"{k} {v:.1f}s" for k, v in step.pipeline.flow_seconds.items())
                out.append(f"{c.name}, {which}: flows {flows}")
    out.append(f"gold rows: {len(contenders[0].gold):,}; every contender's gold equal: {equal}")
    if args.jobs:
        out += ["", f"{contenders[0].name}, new day: its Spark jobs", jobs(contenders[0])]
    return "\n".join(out)


def jobs(contender: Contender) -> str:
    """The refresh's Spark jobs one by one: phase, seconds, files and MB read, what."""
    assert contender.refresh is not None
    return bench_table(
        ["phase", "job", "s", "CSV files", "Parquet files", "MB read", "rows read", "what"],
        [
            [
                j.phase,
                str(j.id),
                f"{j.seconds:.2f}",
                str(j.csv_files_read),
                str(j.files_read),
                f"{(j.bytes_read + j.csv_bytes_read) / 1e6:,.1f}",
                f"{j.input_records:,}",
                j.label[:90],
            ]
            for j in contender.refresh.measure.jobs
        ],
    )


# --- main ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--files-per-day", type=int, default=1)
    parser.add_argument("--invoices-per-day", type=int, default=1000)
    parser.add_argument("--customers", type=int, default=100)
    parser.add_argument("--data-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the data folder")
    parser.add_argument(
        "--jobs", action="store_true", help="list this project's Spark jobs of the new day"
    )
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="ia-bench-sdp-", dir=args.data_dir))
    landing = root / "landing"
    landing.mkdir()
    port = free_port()
    spark = local_session(
        "incremental-assets-bench-layers-vs-sdp",
        **METER_CONF,
        # The same Spark serves Spark Connect, for spark-pipelines.
        **{
            "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.sql.warehouse.dir": str(root / "spark-warehouse"),
        },
    )
    meter = Meter(spark)
    try:
        mine = Contender("this project", root / "project")
        sdp = Contender("SDP", root / "sdp")
        full = Contender("full recompute", root / "full")
        contenders = [mine, sdp, full]
        mine.folder.mkdir()
        project = project_for(mine.folder, landing)
        spark.sql(
            f"CREATE DATABASE {SDP_DATABASE} LOCATION '{(sdp.folder / 'warehouse').as_uri()}'"
        )
        spec = write_pipeline(sdp.folder, landing, SCHEMA, WHERE, COLUMNS, SDP_DATABASE)
        remote = f"sc://127.0.0.1:{port}"
        work = {
            mine.name: lambda: this_project(spark, project, meter),
            sdp.name: lambda: run_pipeline(spec, remote),
            full.name: lambda: full_recompute(spark, landing, full.folder),
        }

        for day in range(args.days):
            write_day(landing, day, args)
        # The JVM's first CSV read, Delta write and aggregation, billed to no contender.
        print("warm-up (untimed) ...", file=sys.stderr)
        full_recompute(spark, landing, root / "warm-up")
        shutil.rmtree(root / "warm-up")
        for c in contenders:
            print(f"initial build: {c.name} ...", file=sys.stderr)
            c.build = measured(spark, meter, c, work[c.name])
        write_day(landing, args.days, args)
        for c in contenders:
            print(f"new day: {c.name} ...", file=sys.stderr)
            c.refresh = measured(spark, meter, c, work[c.name])

        gold = project.layer_path(project.layer("invoices_gold"))
        mine.gold = gold_rows(spark.read.format("delta").load(gold))
        sdp.gold = gold_rows(spark.table(f"{SDP_DATABASE}.invoices_gold"))
        full.gold = gold_rows(spark.read.format("delta").load(str(full.folder / "invoices_gold")))
        equal = mine.gold == sdp.gold == full.gold
        days = {r[1] for r in mine.gold}
        assert len(days) == args.days + 1, f"gold holds {len(days)} days"
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    print(report(contenders, args, equal))
    if args.keep:
        print(f"data kept in {root}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
