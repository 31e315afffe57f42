"""Day-2 operations: status read from the Delta log, rewinding a watermark (recorded with
who and why), explaining a run without writing, and the CLI that exposes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from incremental_assets import cli
from incremental_assets.engine import DeltaTarget, checks
from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake.store import app_id, tiebreak_app_id
from incremental_assets.engine.errors import OperationError
from incremental_assets.engine.explain import explain
from incremental_assets.engine.operations import rewind, table_status
from incremental_assets.engine.watermarks import to_transaction_version
from incremental_assets.specs import TableSpec
from incremental_assets_tests.builders import at, day_request, load, make_spec, target_rows

ALL_COLUMNS = ("order_id", "status", "amount", "updated_at", "_ia_row_hash")


def _two_days(source, targets, spark, spec):
    """Day 1: 40 orders; day 2: updates to some of them and 20 new orders."""
    source.upsert([(i, "placed", float(i), at(1, i % 24)) for i in range(1, 41)])
    for target in targets:
        load(spark, spec, target, 1)
    source.upsert([(i, "paid", float(i), at(2, 3)) for i in range(1, 11)])
    source.upsert([(i, "placed", float(i), at(2, 9)) for i in range(41, 61)])
    for target in targets:
        load(spark, spec, target, 2)


def test_rewind_then_rerun_yields_the_same_table_as_never_rewinding(spark, orders_source, tmp_path):
    spec = make_spec(orders_source.path, watermark={"lookback": "1h"})
    kept = DeltaTarget("orders", str(tmp_path / "kept"))
    rewound = DeltaTarget("orders", str(tmp_path / "rewound"))
    _two_days(orders_source, [kept, rewound], spark, spec)

    done = rewind(
        spec, rewound, "2026-01-01T12:00:00Z", spark=spark, by="alice", reason="shop restore"
    )
    again = load(spark, spec, rewound, 2)

    assert done.cursor_before == at(2, 9) and done.cursor_after == at(1, 12)
    assert again.cursor_before == at(1, 12) and again.cursor_after == at(2, 9)
    assert again.rows_extracted > 0 and (again.rows_inserted, again.rows_updated) == (0, 0)
    assert target_rows(rewound, ALL_COLUMNS) == target_rows(kept, ALL_COLUMNS)
    assert rewound.state("timestamp").cursor == kept.state("timestamp").cursor
    # The history says who rewound, why, and from where to where.
    commit = DeltaTable(rewound.path).history()[1]  # the one before the re-run's
    assert commit["version"] == done.version
    record = delta_commits.parse(commit)
    assert record["by"] == "alice"
    assert record["reason"] == "shop restore"
    assert record["cursor_before"] == "2026-01-02T09:00:00Z"
    assert record["cursor_after"] == "2026-01-01T12:00:00Z"
    assert "table" not in record  # not a load
    assert rewound.last_load(DeltaTable(rewound.path))["version"] == again.delta_version
    outcome = checks.watermark_monotonic(rewound, "timestamp")
    assert outcome.passed, outcome.description
    assert outcome.metadata["rewinds"] == 1


def test_rewind_loads_late_rows_and_reset_reloads_from_the_start(spark, orders_source, target):
    spec = make_spec(orders_source.path, watermark={"lookback": "1h"})
    _two_days(orders_source, [target], spark, spec)
    # A row of day 1 written after day 2's load, later than any lookback, by a MERGE that
    # also updates (a rewrite: without a change data feed no run reads it).
    orders_source.upsert([(99, "placed", 9.0, at(1, 12)), (41, "placed", 41.0, at(2, 9))])
    assert load(spark, spec, target, 2).rows_inserted == 0

    rewind(spec, target, "2026-01-01", spark=spark, by="bob", reason="late rows of Jan 1")
    status = table_status(spec, target, now=at(3))
    late = load(spark, spec, target, 2)

    assert status.cursor == at(1) and status.rewind is not None
    assert (status.rewind.by, status.rewind.cursor_after) == ("bob", "2026-01-01T00:00:00Z")
    assert late.rows_inserted == 1 and late.cursor_after == at(2, 9)
    assert table_status(spec, target).rewind is None  # the run came after it

    before = target_rows(target, ALL_COLUMNS)
    reset = rewind(spec, target, None, spark=spark, by="bob", reason="full reload")
    assert target.state("timestamp").cursor is None
    reloaded = load(spark, spec, target, 2)

    assert reset.cursor_after is None and "partitioning.start" in reset.next_run_reads
    assert reloaded.cursor_before is None and reloaded.rows_extracted == 61
    assert (reloaded.rows_inserted, reloaded.rows_updated) == (0, 0)
    assert target_rows(target, ALL_COLUMNS) == before
    assert checks.watermark_monotonic(target, "timestamp").passed


def _table_with_cursor(path: str, table: str, *versions: int, tiebreak: int | None = None):
    """A Delta table holding one row per load commit, each with its cursor (no Spark)."""
    for version in versions:
        transactions = [Transaction(app_id(table), version, 0)]
        if tiebreak is not None:
            transactions.append(Transaction(tiebreak_app_id(table), tiebreak, 0))
        write_deltalake(
            path,
            pa.table({"id": [version]}),
            mode="append",
            commit_properties=CommitProperties(
                custom_metadata={
                    "incremental_assets.table": table,
                    "incremental_assets.cursor_after": str(version),
                },
                app_transactions=transactions,
            ),
        )


def test_rewind_refuses_what_it_cannot_do_and_says_what_to_change(tmp_path, spark):
    ids = make_spec(
        "unused",
        name="events",
        watermark={"column": "id", "kind": "id", "lookback": 0},
        partitioning={"column": "ts"},
    )
    target = DeltaTarget("events", str(tmp_path / "events"))

    with pytest.raises(OperationError, match=r"has not been loaded yet.*materialize"):
        rewind(ids, target, "5", spark=spark, by="me", reason="why")
    _table_with_cursor(target.path, "events", 10, 20)
    with pytest.raises(OperationError, match=r"'abc' is not an integer.*kind 'id'"):
        rewind(ids, target, "abc", spark=spark, by="me", reason="why")
    with pytest.raises(OperationError, match="not before the current watermark 20"):
        rewind(ids, target, "25", spark=spark, by="me", reason="why")
    with pytest.raises(OperationError, match="needs a reason"):
        rewind(ids, target, "5", spark=spark, by="me", reason=" ")
    snapshot = make_spec("unused", strategy="snapshot", watermark=None)
    with pytest.raises(OperationError, match="snapshot table"):
        rewind(snapshot, target, "5", spark=spark, by="me", reason="why")
    landing = TableSpec.model_validate(
        {
            "name": "invoices",
            "source": {
                "format": "json",
                "path": str(tmp_path),
                "schema": "id BIGINT",
                "landing": {"settle": "30s"},
            },
            "strategy": "append",
            "partitioning": {"granularity": "daily", "start": "2026-01-01"},
        }
    )
    with pytest.raises(OperationError, match=r"landing table loads each file once"):
        rewind(landing, target, "5", spark=spark, by="me", reason="why")
    times = make_spec("unused")
    with pytest.raises(OperationError, match=r"'Jan 2' is not a timestamp.*ISO-8601"):
        rewind(times, target, "Jan 2", spark=spark, by="me", reason="why")
    assert DeltaTable(target.path).version() == 1  # nothing was written


def test_a_hybrid_rewind_sets_both_parts_of_the_cursor(tmp_path, spark):
    spec = make_spec(
        "unused", watermark={"kind": "hybrid", "tiebreak": "order_id", "lookback": "0s"}
    )
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    _table_with_cursor(target.path, "orders", to_transaction_version(at(3), "hybrid"), tiebreak=7)

    rewind(spec, target, "2026-01-02T00:00:00Z|1500", spark=spark, by="me", reason="why")

    assert target.state("hybrid").cursor == (at(2), 1500)
    rewind(spec, target, "2026-01-01", spark=spark, by="me", reason="why")
    assert target.state("hybrid").cursor == (at(1), -(2**63))  # every row at that instant


def test_watermark_check_still_fails_on_a_step_back_that_no_rewind_recorded(tmp_path):
    target = DeltaTarget("events", str(tmp_path / "events"))
    _table_with_cursor(target.path, "events", 10, 20, 15)

    outcome = checks.watermark_monotonic(target, "id")

    assert not outcome.passed and "moved backwards" in outcome.description


def test_explain_plans_the_run_without_writing(spark, orders_source, target):
    spec = make_spec(orders_source.path, watermark={"lookback": "1h"})
    orders_source.upsert([(i, "placed", 1.0, at(1, 1)) for i in range(1, 101)])
    load(spark, spec, target, 1)
    orders_source.upsert([(i, "placed", 2.0, at(2, 1)) for i in range(1001, 1101)])
    load(spark, spec, target, 2)
    orders_source.upsert([(i, "paid", 2.0, at(2, 5)) for i in range(1001, 1011)])
    version = DeltaTable(target.path).version()
    first_load = set(DeltaTable(target.path, version=0).file_uris())
    live = set(DeltaTable(target.path).file_uris())

    plan = explain(spark, spec, target, day_request(2, partition_label="2026-01-02"))

    assert DeltaTable(target.path).version() == version
    assert (plan.mode, plan.cursor_before, plan.cursor_after) == (
        "incremental",
        "2026-01-02T01:00:00Z",
        "2026-01-02T05:00:00Z",
    )
    assert "\"updated_at\" > '2026-01-02 00:00:00.000000+00:00'" in plan.predicate
    assert plan.key_range == {"order_id": ("1001", "1100")}
    # Only the second load's files hold keys 1001..1100; the first load's are left alone.
    assert plan.target_files_total == len(live) and plan.target_files
    touched = {f"{target.path}/{path}" for path in plan.target_files}
    assert touched and not touched & first_load
    result = load(spark, spec, target, 2)
    assert plan.rows == result.rows_extracted == 100
    rewritten = live - set(DeltaTable(target.path).file_uris())
    assert rewritten and rewritten <= touched
    # Loaded up to the source's high-water mark, without a lookback: the window is empty,
    # and the plan says no file is touched (it printed "0 of None" before).
    empty = explain(spark, make_spec(orders_source.path), target, day_request(2))
    assert (empty.rows, empty.target_files, empty.target_files_total) == (0, None, None)
    assert "the window is empty" in empty.note


@pytest.fixture
def project_file(tmp_path, orders_source, spark) -> Path:
    """A tables file with a loaded table (orders) and one never loaded (events)."""
    text = f"""
warehouse: {{root: {tmp_path / "warehouse"}}}
tables:
  - name: orders
    source: {{format: delta, path: {orders_source.path}}}
    keys: [order_id]
    watermark: {{column: updated_at, kind: timestamp, lookback: 1h}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
  - name: events
    source: {{format: parquet, path: {tmp_path / "events"}}}
    keys: [event_id]
    watermark: {{column: event_id, kind: id}}
    strategy: append
    partitioning: {{granularity: daily, start: 2026-01-01, column: event_time}}
"""
    path = tmp_path / "tables.yaml"
    path.write_text(text)
    orders_source.upsert([(i, "placed", 1.0, at(1, 5)) for i in range(1, 11)])
    spec = make_spec(orders_source.path, watermark={"lookback": "1h"})
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
    load(spark, spec, target, 1, run_id="0123456789abcdef", partition_label="2026-01-01")
    return path


def test_status_command_reads_the_delta_log_without_starting_spark(project_file):
    script = Path(sys.executable).parent / "incremental-assets"
    # No Java on PATH: the command would fail if it tried to start Spark.
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)
    started = time.perf_counter()
    text = subprocess.run(
        [script, "status", "--tables", project_file],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    as_json = subprocess.run(
        [script, "status", "--tables", project_file, "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    seconds = time.perf_counter() - started

    header, orders, events = text.splitlines()
    assert header.split()[:3] == ["table", "watermark", "lag"]
    assert orders.split()[:2] == ["orders", "2026-01-01T05:00:00Z"]
    assert "01234567  2026-01-01  incremental  10" in orders
    assert events.split()[:5] == ["events", "(not", "loaded", "yet)", "-"]
    # Columns line up under their headers.
    assert orders.index("2026-01-01T05") == header.index("watermark")
    parsed = {t["table"]: t for t in json.loads(as_json)}
    assert parsed["orders"]["watermark"] == "2026-01-01T05:00:00Z"
    assert parsed["orders"]["last_run"]["run_id"] == "0123456789abcdef"
    assert parsed["orders"]["last_run"]["rows_inserted"] == 10
    assert parsed["orders"]["delta_version"] == 0 and parsed["orders"]["rows"] == 10
    assert parsed["events"]["loaded"] is False and parsed["events"]["watermark"] is None
    assert seconds < 30


def test_status_piped_into_a_reader_that_stops_early_ends_without_a_traceback(project_file):
    script = Path(sys.executable).parent / "incremental-assets"
    child = subprocess.Popen(
        [script, "status", "--tables", project_file],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child.stdout.close()  # as `| head -0` does, before the command writes
    err = child.stderr.read().decode()
    child.wait(timeout=60)

    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert child.returncode == 0


def test_reconcile_refuses_a_table_without_windows_before_starting_spark(tmp_path, capsys):
    (tmp_path / "tables.yaml").write_text(
        f"""
warehouse: {{root: {tmp_path / "warehouse"}}}
tables:
  - name: products
    source: {{format: parquet, path: {tmp_path / "products"}}}
    keys: [product_id]
    strategy: {{kind: snapshot}}
    partitioning: {{granularity: daily, start: 2026-01-01}}
"""
    )
    # No source, no target, no Java: the refusal comes from the spec alone.
    code = cli.main(["reconcile", "products", "--from", "2026-01-01", "--tables",
                     str(tmp_path / "tables.yaml")])  # fmt: skip

    err = capsys.readouterr().err
    assert code == 1
    assert "cannot reconcile by partition: a snapshot table" in err
    assert "materialize the latest partition" in err


def test_rewind_and_explain_commands_name_what_to_change(project_file, capsys, monkeypatch, spark):
    # The test session's Spark, as is (a new builder would reset its settings).
    monkeypatch.setattr(
        "incremental_assets.engine.spark_session.local_session", lambda *a, **k: spark
    )

    def run(*args: str) -> tuple[int, str, str]:
        code = cli.main([*args, "--tables", str(project_file)])
        out, err = capsys.readouterr()
        return code, out, err

    assert run("rewind", "ordrs", "--to", "2026-01-01", "--reason", "x")[2] == (
        "error: no table named 'ordrs' (did you mean 'orders'?); tables are: orders, events\n"
    )
    code, _, err = run("rewind", "events", "--to", "5", "--reason", "x")
    assert code == 1 and "has not been loaded yet" in err
    code, _, err = run("rewind", "orders", "--to", "yesterday", "--reason", "x")
    assert code == 1 and "--to 'yesterday' is not a timestamp" in err
    code, out, _ = run("rewind", "orders", "--to", "2026-01-01T01:00", "--reason", "retry")
    assert code == 0 and "2026-01-01T05:00:00Z -> 2026-01-01T01:00:00Z" in out
    assert "reads rows with updated_at after 2026-01-01T00:00:00Z" in out
    commit = DeltaTable(str(project_file.parent / "warehouse" / "orders")).history(1)[0]
    assert delta_commits.parse(commit)["by"]  # the OS user
    code, _, err = run("explain", "orders", "--partition", "2026-02-30")
    assert code == 1 and "'2026-02-30' is not a partition of table 'orders'" in err
    code, out, _ = run("explain", "orders", "--partition", "2026-01-01", "--json")
    plan = json.loads(out)
    assert code == 0 and (plan["watermark_before"], plan["rows"]) == ("2026-01-01T01:00:00Z", 10)
    assert plan["target_files"] and len(plan["target_files"]) == plan["target_files_total"]
