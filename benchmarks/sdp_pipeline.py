"""The invoices' silver and gold as a Spark Declarative Pipelines pipeline: a streaming
table over the landing folder (silver) and a materialized view (gold), in a pipeline
folder of its own, run by ``spark-pipelines run`` against a Spark Connect server.

Three things this needs in Spark 4.1 with Delta, found running it (what a user meets):

- ``spark-pipelines`` runs its client with ``PYSPARK_PYTHON`` (default: the first
  ``python3`` on PATH), which must have pyspark: the project's ``.venv/bin/python`` here;
- the tables need a catalog that outlives one run: Spark's default session catalog lives
  as long as its Spark, and ``spark-pipelines run`` alone (``--remote local``) starts a
  Spark per run, so a second run no longer finds the first run's tables (the location is
  taken). Here both runs go to one long-lived Connect server (``--remote sc://...``); a
  user would configure a persistent catalog (a Hive metastore, Unity Catalog);
- no ``format="delta"`` on the datasets: on a refresh SDP sets the table's properties
  again, ``provider`` among them, and Delta refuses to alter that reserved property
  (``DELTA_CANNOT_CHANGE_PROVIDER``), so the second run of a streaming table fails. Delta
  is made the default format of the pipeline's session instead
  (``spark.sql.sources.default: delta`` in the pipeline's ``configuration``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from incremental_assets.engine.spark.connect_server import spark_home

SPEC = """\
name: invoices
storage: {storage}
database: {database}
configuration:
  spark.sql.sources.default: delta
libraries:
  - glob:
      include: transformations/**
"""

DEFINITIONS = '''\
"""Silver: the invoices as they land (a streaming table: each run reads the new files
only). Gold: total amount and invoices per customer and day (a materialized view)."""

from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

spark = SparkSession.active()


@dp.table
def invoices_silver():
    invoices = (
        spark.readStream.format("csv")
        .option("header", "true")
        .schema({schema!r})
        .load({landing!r})
    )
    return invoices.where({where!r}).selectExpr(*{columns!r})


@dp.materialized_view
def invoices_gold():
    day = F.window("InvoiceDate", "1 day")
    return (
        spark.read.table("invoices_silver")
        .groupBy("CustomerID", day.alias("w"))
        .agg(
            F.sum("TotalAmount").alias("total_amount"),
            F.count(F.lit(1)).alias("invoices"),
        )
        .selectExpr(
            "CustomerID", "w.start AS window_start", "w.end AS window_end",
            "total_amount", "invoices",
        )
    )
'''


@dataclass
class PipelineRun:
    """One ``spark-pipelines run``: the command's wall seconds, the run's own (from its
    "Starting run..." line to "Run is COMPLETED."), each flow's (RUNNING to COMPLETED),
    and its output."""

    seconds: float
    run_seconds: float
    flow_seconds: dict[str, float] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)


def write_pipeline(
    folder: Path, landing: Path, schema: str, where: str, columns: list[str], database: str
) -> Path:
    """The pipeline folder (spec and definitions); returns the spec's path."""
    (folder / "transformations").mkdir(parents=True, exist_ok=True)
    spec = folder / "pipeline.yml"
    spec.write_text(SPEC.format(storage=(folder / "storage").as_uri(), database=database))
    (folder / "transformations" / "invoices.py").write_text(
        DEFINITIONS.format(schema=schema, landing=str(landing), where=where, columns=columns)
    )
    return spec


def run_pipeline(spec: Path, remote: str) -> PipelineRun:
    """``spark-pipelines run --spec SPEC --remote REMOTE``, each output line stamped as it
    arrives (the CLI prints its events with whole seconds only).

    Raises:
        RuntimeError: the run failed; the message holds the end of its output.
    """
    python = Path(sys.executable)
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "PYSPARK_PYTHON": str(python),  # else python3 from PATH, without pyspark
        "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",  # the lines arrive when they happen
    }
    command = [str(python.parent / "spark-pipelines"), "run", "--spec", str(spec)]
    started = time.perf_counter()
    process = subprocess.Popen(
        [*command, "--remote", remote],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    stamped: list[tuple[float, str]] = []
    assert process.stdout is not None
    for line in process.stdout:
        stamped.append((time.perf_counter() - started, line.rstrip()))
    code = process.wait()
    seconds = time.perf_counter() - started
    output = [line for _, line in stamped]
    if code != 0 or not any("Run is COMPLETED" in line for line in output):
        tail = "\n".join(output[-30:])
        raise RuntimeError(f"spark-pipelines run failed (exit status {code}):\n{tail}")
    return PipelineRun(
        seconds=seconds,
        run_seconds=_at(stamped, "Run is COMPLETED") - _at(stamped, "Starting run..."),
        flow_seconds=_flows(stamped),
        output=output,
    )


def _at(stamped: list[tuple[float, str]], text: str) -> float:
    return next(at for at, line in stamped if text in line)


def _flows(stamped: list[tuple[float, str]]) -> dict[str, float]:
    """Each flow's seconds from its ``is RUNNING`` line to its ``has COMPLETED`` line."""
    running: dict[str, float] = {}
    out: dict[str, float] = {}
    for at, line in stamped:
        if " Flow " not in line:
            continue
        name = line.split(" Flow ", 1)[1].split()[0].rsplit(".", 1)[-1]
        if line.endswith("is RUNNING."):
            running[name] = at
        elif line.endswith("has COMPLETED.") and name in running:
            out[name] = at - running[name]
    return out
