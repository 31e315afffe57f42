"""Per-partition reconciliation: late rows beyond the lookback are found by partition, and a
backfill of just those partitions through Dagster repairs them."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from deltalake import DeltaTable

from incremental_assets import cli
from incremental_assets.engine import DeltaTarget, IncrementalLoadError
from incremental_assets.engine.reconcile import reconcile
from incremental_assets_tests.builders import ParquetFolder, Project, at, feed, load, make_spec


def _three_days(spark, project: Project):
    """Days 1-3 loaded by the engine; order 1 moved to day 3 by an update; then a row of
    day 1 written after day 3's load, older than any lookback, that a normal run misses
    (a rewrite of a source without change data feed)."""
    spec = project.spec.tables[0]
    source, target = project.source, project.target
    source.upsert([(i, "placed", 1.0, at(1, i)) for i in range(1, 11)])
    load(spark, spec, target, 1)
    source.upsert([(i, "placed", 1.0, at(2, i)) for i in range(11, 21)])
    load(spark, spec, target, 2)
    source.upsert([(i, "placed", 1.0, at(3, i - 20)) for i in range(21, 26)])
    source.upsert([(1, "paid", 1.0, at(3, 6))])
    load(spark, spec, target, 3)
    # In the same MERGE as an update: a rewrite, which the source's ledger reads only with
    # a change data feed, so no run reads it.
    source.upsert([(99, "placed", 9.0, at(1, 12)), (2, "placed", 1.0, at(1, 2))])
    missed = load(spark, spec, target, 3)
    assert (missed.rows_inserted, missed.rows_updated) == (0, 0)
    return spec


def test_reconcile_finds_the_partition_with_late_rows_and_a_backfill_repairs_it(
    spark, tmp_path, monkeypatch, capsys
):
    project = Project(tmp_path)
    spec = _three_days(spark, project)
    tables = str(tmp_path / "tables.yaml")
    monkeypatch.setattr(
        "incremental_assets.engine.spark_session.local_session", lambda *a, **k: spark
    )
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()

    def run(*args: str) -> tuple[int, str]:
        code = cli.main(["reconcile", "orders", *args, "--tables", tables])
        out, _ = capsys.readouterr()
        return code, out

    report = reconcile(spark, spec, project.target, at(1), at(4))
    code, text = run("--from", "2026-01-01", "--to", "2026-01-03")
    as_json = json.loads(run("--from", "2026-01-01", "--to", "2026-01-03", "--json")[1])
    repaired, backfill_text = run("--from", "2026-01-01", "--to", "2026-01-03", "--backfill")
    after, after_text = run("--from", "2026-01-01", "--to", "2026-01-03")
    project.source.upsert([(98, "placed", 9.0, at(2, 12)), (12, "placed", 1.0, at(2, 12))])
    code_json, text_json = run("--from", "2026-01-01", "--to", "2026-01-03", "--backfill", "--json")
    second = json.loads(text_json[text_json.index("{") :])  # Dagster may print before it

    # Order 1's newest version is on day 3 in both source and target; order 99 is missing.
    counts = [(p.partition, p.source_rows, p.target_rows) for p in report.partitions]
    assert counts == [("2026-01-01", 10, 9), ("2026-01-02", 10, 10), ("2026-01-03", 6, 6)]
    assert [p.partition for p in report.differing] == ["2026-01-01"]
    assert code == 1
    lines = text.splitlines()
    assert lines[1].split() == ["partition", "source", "rows", "target", "rows", "difference"]
    assert lines[2].split() == ["2026-01-01", "10", "9", "+1"]
    assert lines[-1] == "1 partition differs (a backfill repairs it): 2026-01-01"
    assert as_json["differing"] == ["2026-01-01"]
    assert as_json["partitions"][0]["difference"] == 1
    # The backfill ran just the differing partition, and the table now reconciles.
    assert repaired == 0, backfill_text
    assert "backfill 2026-01-01: run " in backfill_text and "succeeded" in backfill_text
    assert backfill_text.rstrip().endswith("no partition differs")
    assert after == 0 and after_text.rstrip().endswith("no partition differs")
    assert code_json == 0
    assert second["before"]["differing"] == ["2026-01-02"] and second["differing"] == []
    assert [(r["first"], r["last"], r["success"]) for r in second["backfill"]] == [
        ("2026-01-02", "2026-01-02", True)
    ]
    instance = dg.DagsterInstance.get()
    runs = instance.get_runs(dg.RunsFilter(tags={"incremental_assets/reconcile": "true"}))
    assert sorted(r.tags["dagster/asset_partition_range_start"] for r in runs) == [
        "2026-01-01",
        "2026-01-02",
    ]
    assert all(r.tags["incremental_assets/reload"] == "true" for r in runs)


def test_rows_deleted_in_the_source_of_an_upsert_are_reported_as_unrepairable(
    spark, tmp_path, monkeypatch, capsys
):
    project = Project(tmp_path)
    spec, source, target = project.spec.tables[0], project.source, project.target
    source.upsert([(i, "placed", 1.0, at(1, i)) for i in range(1, 11)])
    load(spark, spec, target, 1)
    source.upsert([(i, "placed", 1.0, at(2, i)) for i in range(11, 21)])
    load(spark, spec, target, 2)
    DeltaTable(source.path).delete("order_id IN (3, 4, 12)")  # gone: an upsert never sees it
    monkeypatch.setattr(
        "incremental_assets.engine.spark_session.local_session", lambda *a, **k: spark
    )
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    (tmp_path / "dagster_home").mkdir()

    def run(*args: str) -> tuple[int, str]:
        code = cli.main(["reconcile", "orders", "--from", "2026-01-01", "--to", "2026-01-02",
                         *args, "--tables", str(tmp_path / "tables.yaml")])  # fmt: skip
        return code, capsys.readouterr().out

    report = reconcile(spark, spec, target, at(1), at(3))
    code, text = run()
    strict, _ = run("--strict")
    backfill, backfill_text = run("--backfill")

    counts = [(p.partition, p.difference, p.gone_from_source) for p in report.partitions]
    assert counts == [("2026-01-01", -2, 2), ("2026-01-02", -1, 1)]
    assert report.repairable == [] and len(report.differing) == 2
    assert code == 0 and strict == 1  # differences no backfill repairs fail only --strict
    assert "no partition differs in a way a backfill repairs" in text
    assert "3 target rows in 2 partitions (2026-01-01, 2026-01-02)" in text
    assert "strategy cdc" in text and "snapshot" in text
    assert (
        backfill == 0 and "no partition a backfill can repair: nothing re-loaded" in backfill_text
    )
    assert dg.DagsterInstance.get().get_runs() == []  # nothing re-loaded

    # A late row in a partition that also lost rows: the backfill repairs what it can.
    source.upsert([(99, "placed", 9.0, at(1, 12))])
    code, text = run("--backfill")
    late = reconcile(spark, spec, target, at(1), at(3))

    assert code == 0, text
    assert "backfill 2026-01-01: run " in text and "succeeded" in text
    assert [(p.difference, p.gone_from_source, p.repairable) for p in late.partitions] == [
        (-2, 2, 0),
        (-1, 1, 0),
    ]


def test_reconcile_counts_the_newest_change_per_key_of_a_cdc_feed_by_hour(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "feed")
    spec = make_spec(
        str(folder.path),
        source={"format": "parquet"},
        keys=["id"],
        watermark={"column": "lsn", "kind": "id", "lookback": 0},
        partitioning={"column": "changed_at", "granularity": "hourly"},
        strategy={"kind": "cdc"},
    )
    target = DeltaTarget("feed", str(tmp_path / "target"))
    folder.drop(
        feed(
            (1, "a", "I", 1, at(1, 1)),
            (1, "a2", "U", 2, at(1, 2)),
            (2, "b", "I", 3, at(1, 3)),
            (3, "c", "I", 4, at(2, 3)),
            (2, None, "D", 5, at(2, 4)),  # deletes order 2: counted nowhere
        )
    )
    load(spark, spec, target, 1, 2)

    report = reconcile(spark, spec, target, at(1), at(3))

    counts = [
        (p.partition, p.source_rows, p.target_rows) for p in report.partitions if p.source_rows
    ]
    assert counts == [("2026-01-01-02:00", 1, 1), ("2026-01-02-03:00", 1, 1)]
    assert len(report.partitions) == 48 and not report.differing


def test_reconcile_refuses_tables_whose_partitions_are_not_windows_of_source_rows(tmp_path):
    snapshot = make_spec(str(tmp_path), keys=["id"], watermark=None, strategy="snapshot")
    history = make_spec(str(tmp_path), strategy="scd2")
    target = DeltaTarget("t", str(tmp_path / "t"))

    for spec, words in ((snapshot, "current state"), (history, "versions of keys")):
        with pytest.raises(IncrementalLoadError, match=words):
            reconcile(None, spec, target, at(1), at(2))  # type: ignore[arg-type]
