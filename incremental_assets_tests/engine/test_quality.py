"""Data-quality rules (warn, quarantine, fail), the quarantine table and its replay."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from incremental_assets.engine import IncrementalLoadError
from incremental_assets.engine.load import merge_plan_of
from incremental_assets.engine.quarantine import Quarantine, replay
from incremental_assets_tests.builders import at, load, make_spec, target_rows

RULES = [
    {"name": "amount_positive", "check": "amount > 0", "action": "quarantine"},
    {"name": "known_status", "check": "status IN ('placed', 'paid')", "action": "warn"},
]


def quality_spec(path: str, rules=RULES, min_score: float = 0.0):
    return make_spec(path, quality={"rules": rules, "min_score": min_score})


def quarantined(target) -> list[tuple]:
    table = DeltaTable(f"{target.path}__quarantine").to_pyarrow_table()
    return sorted(
        (r["order_id"], tuple(r["_ia_failed_rules"]), r["_ia_run_id"]) for r in table.to_pylist()
    )


def test_warn_keeps_quarantine_diverts_and_both_are_counted(spark, orders_source, target):
    orders_source.upsert(
        [
            (1, "placed", 10.0, at(1, 1)),
            (2, "placed", -5.0, at(1, 2)),  # quarantined
            (3, "lost", 7.0, at(1, 3)),  # warned, kept
            (4, "lost", None, at(1, 4)),  # null check fails too: quarantined, and warned
        ]
    )

    result = load(spark, quality_spec(orders_source.path), target, 1, run_id="run-1")

    assert [r[0] for r in target_rows(target)] == [1, 3]
    assert quarantined(target) == [
        (2, ("amount_positive",), "run-1"),
        (4, ("amount_positive", "known_status"), "run-1"),
    ]
    report = result.quality
    assert report.failures == {"amount_positive": 2, "known_status": 2}
    assert (report.rows_checked, report.rows_failing_any, report.rows_quarantined) == (4, 3, 2)
    assert report.score == 0.25
    # Diverted rows are counted as quarantined, not as duplicates of the batch.
    assert (result.rows_staged, result.duplicates_in_batch) == (2, 0)
    # Quarantined rows never hold the watermark back.
    assert result.cursor_after == at(1, 4)


def test_fail_rule_fails_the_run_and_commits_nothing(spark, orders_source, target):
    rules = [*RULES, {"name": "no_huge", "check": "amount < 1000", "action": "fail"}]
    spec = quality_spec(orders_source.path, rules)
    orders_source.upsert([(1, "placed", 10.0, at(1, 1)), (2, "placed", -1.0, at(1, 2))])
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()
    orders_source.upsert([(3, "placed", 5000.0, at(1, 5)), (4, "placed", -2.0, at(1, 6))])

    with pytest.raises(IncrementalLoadError, match="no_huge: 1 rows"):
        load(spark, spec, target, 1)

    assert DeltaTable(target.path).version() == version
    assert [r[0] for r in quarantined(target)] == [2]  # row 4's quarantine was not written


def test_rerun_of_a_window_quarantines_each_row_once(spark, orders_source, target):
    spec = quality_spec(orders_source.path)
    orders_source.upsert([(1, "placed", 10.0, at(1, 1)), (2, "placed", -5.0, at(1, 2))])
    load(spark, spec, target, 1)

    load(spark, spec, target, 1, backfill=True)

    assert [r[0] for r in quarantined(target)] == [2]


def test_replay_after_fixing_the_rule_merges_fixed_rows_exactly_once(spark, orders_source, target):
    spec = quality_spec(orders_source.path)
    orders_source.upsert(
        [(1, "placed", 10.0, at(1, 1)), (2, "placed", 0.0, at(1, 2)), (3, "paid", -3.0, at(1, 3))]
    )
    load(spark, spec, target, 1)
    # Zero amounts are fine after all: the rule is corrected; -3 still fails.
    fixed = quality_spec(orders_source.path, [{**RULES[0], "check": "amount >= 0"}, RULES[1]])

    first = replay(spark, fixed, target, merge_plan_of(fixed))
    second = replay(spark, fixed, target, merge_plan_of(fixed))

    assert (first.examined, first.replayed, first.still_failing) == (2, 1, 1)
    assert first.rows_inserted == 1
    assert (second.replayed, second.rows_inserted) == (0, 0)
    assert first.committed and not second.committed
    assert target_rows(target) == [(1, "placed", 10.0, at(1, 1)), (2, "placed", 0.0, at(1, 2))]
    assert [r[0] for r in quarantined(target)] == [3]
    assert Quarantine(target).rows() == 1
    # The watermark did not move.
    assert target.state("timestamp").cursor == at(1, 3)


def test_replay_never_overwrites_a_newer_version_loaded_since(spark, orders_source, target):
    spec = quality_spec(orders_source.path)
    orders_source.upsert([(1, "placed", -1.0, at(1, 1))])
    load(spark, spec, target, 1)
    orders_source.upsert([(1, "paid", 20.0, at(1, 5))])
    load(spark, spec, target, 1)
    fixed = quality_spec(orders_source.path, [RULES[1]])

    replay(spark, fixed, target, merge_plan_of(fixed))

    assert target_rows(target) == [(1, "paid", 20.0, at(1, 5))]


def test_rule_that_is_not_valid_sql_names_the_rule_and_the_columns(spark, orders_source, target):
    spec = quality_spec(orders_source.path, [{"name": "typo", "check": "amout > 0"}])
    orders_source.upsert([(1, "placed", 10.0, at(1, 1))])

    with pytest.raises(IncrementalLoadError, match="quality rule 'typo'") as info:
        load(spark, spec, target, 1)

    assert "order_id" in str(info.value)
    assert not target.exists()


def test_quarantine_is_refused_for_snapshot_tables(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="'quarantine' is not available for snapshot"):
        make_spec(
            str(tmp_path),
            watermark=None,
            strategy="snapshot",
            quality={"rules": [RULES[0]]},
        )


def test_replay_quarantine_command_merges_rows_a_corrected_rule_passes(
    spark, orders_source, tmp_path, capsys, monkeypatch
):
    from incremental_assets import cli
    from incremental_assets.engine import DeltaTarget

    monkeypatch.setattr(
        "incremental_assets.engine.spark_session.local_session", lambda *a, **k: spark
    )
    text = f"""
warehouse: {{root: {tmp_path / "warehouse"}}}
tables:
  - name: orders
    source: {{format: delta, path: {orders_source.path}}}
    keys: [order_id]
    watermark: {{column: updated_at, kind: timestamp}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
    quality:
      rules:
        - {{name: amount_positive, check: "amount > 0", action: quarantine}}
"""
    tables = tmp_path / "tables.yaml"
    tables.write_text(text)
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
    orders_source.upsert([(1, "placed", 10.0, at(1, 1)), (2, "placed", 0.0, at(1, 2))])
    load(spark, quality_spec(orders_source.path, [RULES[0]]), target, 1)
    tables.write_text(text.replace('"amount > 0"', '"amount >= 0"'))

    code = cli.main(["replay-quarantine", "orders", "--tables", str(tables)])

    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 quarantined rows examined, 1 pass the rules now and were merged" in out
    assert "Delta version" in out
    assert cli.main(["replay-quarantine", "orders", "--tables", str(tables)]) == 0
    assert "0 pass the rules now" in (again := capsys.readouterr().out)
    assert "nothing committed" in again and "Delta version" not in again
    assert [r[0] for r in target_rows(target)] == [1, 2]


def test_a_replayed_hard_delete_is_tombstoned_so_an_older_change_stays_deleted(spark, tmp_path):
    from incremental_assets.engine import DeltaTarget
    from incremental_assets_tests.builders import ParquetFolder, feed, feed_spec, rows

    folder = ParquetFolder(tmp_path / "feed")
    target = DeltaTarget("t", str(tmp_path / "target"))
    held = [{"name": "small_lsn", "check": "lsn < 100", "action": "quarantine"}]
    spec = feed_spec(folder.path, {"kind": "cdc"}, quality={"rules": held})
    folder.drop(feed((1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(1, 1))))
    load(spark, spec, target, 1)
    folder.drop(feed((1, None, "D", 150, at(2, 1))))  # the delete is quarantined
    load(spark, spec, target, 2)
    assert rows(target, "id", "name") == [(1, "a"), (2, "b")]
    fixed = feed_spec(folder.path, {"kind": "cdc"})

    replayed = replay(spark, fixed, target, merge_plan_of(fixed))
    again = load(spark, fixed, target, 1, backfill=True)  # day 1's insert of id 1 re-read

    assert (replayed.replayed, replayed.committed) == (1, True)
    assert again.rows_inserted == 0
    assert rows(target, "id", "name") == [(2, "b")]
    tombstones = DeltaTable(f"{target.path}__tombstones").to_pyarrow_table()
    assert tombstones.select(["id", "lsn"]).to_pylist() == [{"id": 1, "lsn": 150}]
