"""The README's demo, run small: sources simulated, loaded through Dagster, proved equal
to a full reload."""

from __future__ import annotations

import os
import shutil

import pytest

from incremental_assets.demo import run
from incremental_assets.specs import load_project
from incremental_assets.specs.models import relative_day
from incremental_assets_tests.builders import PROJECT_ROOT

pytestmark = pytest.mark.slow


def test_demo_rounds_end_equal_to_a_full_reload(tmp_path, monkeypatch, capsys, spark):
    for name in ("tables.yaml", "dagster.yaml"):
        shutil.copy(PROJECT_ROOT / name, tmp_path / name)
    monkeypatch.setenv("INCREMENTAL_ASSETS_TABLES", str(tmp_path / "tables.yaml"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)

    code = run.main(rounds=2, root=tmp_path)

    out = capsys.readouterr().out
    assert code == 0, out
    verdicts = {line.split()[0]: line for line in out.splitlines() if "a full reload (" in line}
    assert set(verdicts) == {"orders", "events", "customers", "customers_history", "products"}
    assert all(" equal to a full reload" in line for line in verdicts.values()), verdicts
    # The demo's days are the last ones up to yesterday: the partitions start on the first.
    first, second = relative_day("today-4d"), relative_day("today-3d")
    assert "Round 2" in out
    assert f"Backfill of partitions {first:%Y-%m-%d}...{second:%Y-%m-%d}" in out
    project = load_project(tmp_path / "tables.yaml")
    assert {t.partitioning.start for t in project.tables} == {first}
    assert (tmp_path / "data" / "warehouse" / "orders" / "_delta_log").is_dir()
    assert os.listdir(tmp_path / "storage")  # the instance lives under DAGSTER_HOME
