"""The README's demo, run small: sources simulated, loaded through Dagster, proved equal
to a full reload; its streaming layer equal to the hourly totals of the CSV invoices but
those behind the watermark, which its runs report dropped. The demo runs once per test
session (conftest.py ``finished_demo``, shared with the browser test); this test reads what
it printed and left."""

from __future__ import annotations

import csv
import os
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from incremental_assets.specs import load_project
from incremental_assets.specs.models import relative_day
from incremental_assets_tests.builders import run_demo

pytestmark = pytest.mark.slow


HOUR = timedelta(hours=1)


def test_demo_rounds_end_equal_to_a_full_reload(finished_demo, spark):
    root, out = finished_demo.root, finished_demo.out
    assert finished_demo.rounds == 2

    assert finished_demo.code == 0, out
    verdicts = {line.split()[0]: line for line in out.splitlines() if "a full reload (" in line}
    assert set(verdicts) == {"orders", "events", "customers", "customers_history", "products"}
    assert all(" equal to a full reload" in line for line in verdicts.values()), verdicts
    # The demo's days are the last ones up to yesterday: the partitions start on the first.
    first, second = relative_day("today-4d"), relative_day("today-3d")
    assert "Round 2" in out
    assert f"Backfill of partitions {first:%Y-%m-%d}...{second:%Y-%m-%d}" in out
    project = load_project(root / "tables.yaml")
    assert {t.partitioning.start for t in project.tables} == {first}
    assert (root / "data" / "warehouse" / "orders" / "_delta_log").is_dir()
    assert os.listdir(root / "storage")  # the instance lives under DAGSTER_HOME

    # The streaming layer: the hourly totals of the CSV files, computed here from the files
    # with Spark's rule for late rows, equal to the layer's table; the rows behind the
    # watermark (round 2's) reported dropped by its runs, and its check failing on them
    # without failing the demo.
    expected, dropped = hourly_totals_but_late(root / "data" / "source" / "invoice_headers")
    assert dropped >= 1
    table = spark.read.format("delta").load(str(root / "data/warehouse/invoice_totals_hourly"))
    bounds = [F.unix_timestamp(c).alias(c) for c in ("window_start", "window_end")]
    held = table.select("CustomerID", *bounds, "total_amount").collect()
    assert all(r["window_end"] - r["window_start"] == 3600 for r in held)
    assert {(r[0], r[1]): round(r[3], 6) for r in held} == expected
    assert len(held) == len(expected)
    streamed = [line for line in out.splitlines() if line.startswith("  invoice_totals_hourly")]
    assert "equal to the hourly totals of the" in streamed[0], out
    assert f"but the {dropped} written behind the watermark" in streamed[0], out
    assert streamed[1].endswith(
        f"late rows dropped: {dropped} reported by its runs (check no_late_rows_dropped), "
        f"{dropped} written behind the watermark: equal"
    ), out
    assert "late rows dropped (check no_late_rows_dropped fails, as expected)" in out


def hourly_totals_but_late(folder: Path) -> tuple[dict[tuple, float], int]:
    """(customer, hour's start in epoch seconds) -> total amount of the CSV invoice files in
    ``folder`` (one a round, named by day), without the rows behind the watermark the earlier
    files left (a row whose hour ends at or before their latest InvoiceDate minus 1 hour),
    and how many those are."""
    totals: dict[tuple, float] = defaultdict(float)
    latest, dropped = None, 0
    for path in sorted(folder.glob("invoices-*.csv")):
        with path.open() as f:
            rows = [
                (r["CustomerID"], datetime.fromisoformat(r["InvoiceDate"]).replace(tzinfo=UTC), r)
                for r in csv.DictReader(f)
            ]
        for customer, when, row in rows:
            hour = when.replace(minute=0, second=0)
            if latest is not None and hour + HOUR <= latest - HOUR:
                dropped += 1
            else:
                totals[(customer, int(hour.timestamp()))] += float(row["TotalAmount"])
        latest = max([when for _, when, _ in rows] + ([latest] if latest else []))
    return {k: round(v, 6) for k, v in totals.items()}, dropped


def test_the_demo_of_one_landing_table_runs_it_and_its_layers_alone(tmp_path):
    demo = run_demo(tmp_path, rounds=1, only=["invoice_headers"])

    assert demo.code == 0, demo.out
    assert "invoice CSV file dropped" in demo.out
    assert "invoice_totals_hourly equal to the hourly totals" in demo.out
    assert "invoice files dropped" not in demo.out  # invoices_bronze was not asked for
    assert "a full reload (" not in demo.out  # nor were the tables loaded from sources
