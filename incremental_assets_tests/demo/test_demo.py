"""The README's demo, run small: sources simulated, loaded through Dagster, proved equal
to a full reload. The demo runs once per test session (conftest.py ``finished_demo``,
shared with the browser test); this test reads what it printed and left."""

from __future__ import annotations

import os

import pytest

from incremental_assets.specs import load_project
from incremental_assets.specs.models import relative_day

pytestmark = pytest.mark.slow


def test_demo_rounds_end_equal_to_a_full_reload(finished_demo):
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
