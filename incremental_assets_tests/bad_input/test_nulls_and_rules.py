"""No row lost on a null tie-break; a quality rule that is NULL for every row fails a
check; a rule that runs too long is cancelled, fails the run naming it, and frees the
table's pool slot."""

from __future__ import annotations

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from incremental_assets.dagster_layer.assets import pool_name
from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.errors import NullValuesError, RuleTimeoutError
from incremental_assets.engine.quality import QualityReport, rules_not_null_check
from incremental_assets_tests.builders import (
    ORDERS_YAML,
    ParquetFolder,
    Project,
    at,
    load,
    make_spec,
    order_rows,
    rows,
)

# --- a hybrid watermark's null tie-break -----------------------------------------------

EVENTS = pa.schema(
    [
        ("id", pa.int64()),
        ("v", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("seq", pa.int64()),
    ]
)


def events(*items: tuple) -> pa.Table:
    """Rows ``(id, ts, seq)``, each with the value ``v<id>``."""
    return pa.Table.from_pylist(
        [{"id": i, "v": f"v{i}", "ts": ts, "seq": seq} for i, ts, seq in items], EVENTS
    )


def hybrid_spec(folder: ParquetFolder):
    return make_spec(
        str(folder.path),
        source={"format": "parquet"},
        keys=["id"],
        watermark={"column": "ts", "kind": "hybrid", "tiebreak": "seq"},
    )


def reference(*batches: pa.Table) -> list[tuple]:
    """The target of an upsert by ``id`` of every row: per key the newest by (ts, seq)."""
    newest: dict[int, dict] = {}
    for row in (r for batch in batches for r in batch.to_pylist()):
        held = newest.get(row["id"])
        if held is None or (row["ts"], row["seq"]) > (held["ts"], held["seq"]):
            newest[row["id"]] = row
    return sorted((r["id"], r["v"]) for r in newest.values())


def test_a_null_tiebreak_at_the_boundary_instant_is_refused_then_loaded_once(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "src")
    spec = hybrid_spec(folder)
    target = DeltaTarget("t", str(tmp_path / "target"))
    burst = events(*[(i, at(1, 12), i) for i in range(1, 5)])
    folder.drop(burst)
    first = load(spark, spec, target, 1)
    assert first.cursor_after == (at(1, 12), 4)
    assert rows(target, "id", "v") == reference(burst)
    version = DeltaTable(target.path).version()

    # A row of the cursor's own instant without a seq, and a later row: a run that loads
    # (12:00, 4] onwards would skip the first for ever.
    folder.drop(events((5, at(1, 12), None), (6, at(1, 13), 6)))
    with pytest.raises(NullValuesError) as refused:
        load(spark, spec, target, 1)

    message = str(refused.value)
    assert "(seq: 1)" in message
    assert "Rows without 'seq': id=5 at ts=2026-01-01T12:00:00Z." in message
    assert "Nothing was committed" in message and "give these rows a 'seq'" in message
    assert DeltaTable(target.path).version() == version
    assert rows(target, "id", "v") == reference(burst)
    assert target.state("hybrid").cursor == (at(1, 12), 4)

    # The source gives the row its seq (the file is written again): loaded, once.
    fixed = events((5, at(1, 12), 5), (6, at(1, 13), 6))
    pq.write_table(fixed, folder.path / "part-00002.parquet")
    second = load(spark, spec, target, 1)
    assert second.rows_inserted == 2 and second.cursor_after == (at(1, 13), 6)
    assert rows(target, "id", "v") == reference(burst, fixed)
    third = load(spark, spec, target, 1)
    assert third.rows_inserted == third.rows_updated == 0
    assert rows(target, "id", "v") == reference(burst, fixed)


def test_a_null_tiebreak_on_the_newest_row_is_refused_by_name_not_a_type_error(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "src")
    folder.drop(events((1, at(1, 12), 1), (2, at(1, 13), None), (3, at(1, 13), None)))
    target = DeltaTarget("t", str(tmp_path / "target"))

    with pytest.raises(NullValuesError) as refused:
        load(spark, hybrid_spec(folder), target, 1)

    assert refused.value.counts == {"seq": 2}
    assert "id=2 at ts=2026-01-01T13:00:00Z; id=3 at ts=2026-01-01T13:00:00Z." in refused.value.rows
    assert not DeltaTable.is_deltatable(target.path)

    fixed = events((1, at(1, 12), 1), (2, at(1, 13), 2), (3, at(1, 13), 3))
    pq.write_table(fixed, folder.path / "part-00001.parquet")
    result = load(spark, hybrid_spec(folder), target, 1)
    assert result.cursor_after == (at(1, 13), 3)
    assert rows(target, "id", "v") == reference(fixed)


# --- a rule that is NULL for every row ----------------------------------------------------

NULL_RULES_YAML = (
    ORDERS_YAML
    + """    quality:
      rules:
        - {name: nothing, check: "NULL", action: quarantine}
        - {name: amount_positive, check: "amount > 0", action: warn}
        - {name: known_status, check: "status IN ('placed', 'paid')", action: warn}
"""
)


def test_a_rule_null_for_every_row_fails_its_check_naming_the_rule(tmp_path, spark):
    project = Project(tmp_path, NULL_RULES_YAML)
    # Every amount is missing, so 'amount_positive' judges no row either.
    project.source.upsert([(1, "placed", None, at(1, 5)), (2, "lost", None, at(1, 6))])

    with dg.instance_for_test() as instance:
        result = project.materialize(instance, "2026-01-01", raise_on_error=False)

    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    check = checks["quality_rules_not_null"]
    assert not check.passed
    assert "rules 'nothing', 'amount_positive' were NULL for all 2 rows" in check.description
    assert "known_status" not in check.description
    metadata = {k: v.value for k, v in check.metadata.items()}
    assert metadata == {
        "rows_checked": 2,
        "rows_null_nothing": 2,
        "rows_null_amount_positive": 2,
        "rows_null_known_status": 0,
    }
    event = result.asset_materializations_for_node("orders")[-1]
    assert event.metadata["rows_null_nothing"].value == 2
    assert event.metadata["rows_quarantined"].value == 2  # every row, by the NULL rule
    blocking = {s.name: s.blocking for s in project.defs.get_assets_def("orders").check_specs}
    assert blocking["quality_rules_not_null"]


def test_a_rule_null_for_some_rows_or_a_run_without_rows_passes_the_check():
    some = QualityReport(rows_checked=3, nulls={"amount_positive": 2, "nothing": 0})
    assert rules_not_null_check(some).passed
    assert rules_not_null_check(QualityReport()).passed
    every = QualityReport(rows_checked=3, nulls={"amount_positive": 3})
    outcome = rules_not_null_check(every)
    assert not outcome.passed and "'amount_positive' was NULL for all 3 rows" in (
        outcome.description
    )


# --- a rule under a time limit ------------------------------------------------------------

# Backtracks about C(24, 8) ways on 'a' * 24 + 'b' before failing: seconds per row.
SLOW = {"name": "slow_pattern", "check": "status RLIKE '(.*a){8}$'", "action": "warn"}
QUICK = {"name": "amount_positive", "check": "amount > 0", "action": "warn"}


def slow_rows(source, count: int = 12) -> None:
    """``count`` rows whose status makes SLOW backtrack (about 0.5 s a row here; at 24
    characters it was 0.1 s, and a fast machine checked all 12 inside the 1 s limit), one
    file each: Spark stops a cancelled task between files, so what the test leaves running
    ends within a row."""
    for i in range(count):
        source.append(order_rows([(i, "a" * 30 + "b", 1.0, at(1, 1, i))]))


def test_a_rule_past_its_time_limit_is_cancelled_and_the_run_fails_naming_it(
    spark, orders_source, target
):
    slow_rows(orders_source)
    spec = make_spec(orders_source.path, quality={"rules": [QUICK, SLOW], "rule_timeout": "1s"})

    with pytest.raises(RuleTimeoutError) as stopped:
        load(spark, spec, target, 1)

    message = str(stopped.value)
    assert "ran past quality.rule_timeout (1s) and was cancelled" in message
    # Every rule is named, those matching patterns first.
    assert "Its rules: 'slow_pattern' (status RLIKE '(.*a){8}$'); 'amount_positive'" in message
    assert stopped.value.rules == ["slow_pattern", "amount_positive"]
    assert "Nothing was committed" in message and "nested" in message
    assert not DeltaTable.is_deltatable(target.path)
    assert spark.getTags() == set()  # the run's tag is gone

    # The session is free for the next run: with the rule corrected, the table loads.
    fixed = make_spec(
        orders_source.path,
        quality={"rules": [QUICK, {**SLOW, "check": "status RLIKE 'a{8}b$'"}]},
    )
    result = load(spark, fixed, target, 1)
    assert result.rows_inserted == 12
    assert result.quality.failures == {"amount_positive": 0, "slow_pattern": 0}


SLOW_YAML = (
    ORDERS_YAML
    + """    quality:
      rule_timeout: 1s
      rules:
        - {name: slow_pattern, check: "status RLIKE '(.*a){8}$'", action: quarantine}
"""
)


def test_a_run_stopped_by_the_rule_time_limit_fails_and_frees_the_tables_pool_slot(tmp_path, spark):
    project = Project(tmp_path, SLOW_YAML)
    slow_rows(project.source)
    pool = pool_name(project.spec.tables[0])
    overrides = {"concurrency": {"pools": {"default_limit": 1}}}

    with dg.instance_for_test(overrides=overrides) as instance:
        result = project.materialize(instance, "2026-01-01", raise_on_error=False)
        failure = next(e for e in result.all_events if e.is_step_failure)
        info = instance.event_log_storage.get_concurrency_info(pool)

    assert not result.success
    text = failure.step_failure_data.error.to_string()
    assert "quality.rule_timeout (1s)" in text and "'slow_pattern'" in text
    # The step ran holding the pool's only slot, and the failed run gave it back.
    assert (info.slot_count, info.claimed_slots, info.pending_steps) == (1, [], [])
    assert not DeltaTable.is_deltatable(project.target.path)
