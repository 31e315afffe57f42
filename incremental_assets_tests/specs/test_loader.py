"""Table specs from YAML: valid files load with resolved paths, invalid ones fail with a
SpecError that names the table, the field and how to fix it; the Dagster code location
validates with the repository's tables.yaml and fails on a broken one."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from incremental_assets.specs import SpecError, load_project
from incremental_assets.specs.durations import parse_duration
from incremental_assets_tests.builders import PROJECT_ROOT

ORDERS = """\
  - name: orders
    source: {format: delta, path: ./source/orders}
    keys: [order_id]
    watermark: {column: updated_at, kind: timestamp, lookback: 2h}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
"""

EVENTS = """\
  - name: events
    source: {format: parquet, path: ./source/events, timezone: Europe/Berlin}
    keys: [event_id]
    watermark: {column: event_id, kind: id, lookback: 1000}
    strategy: append
    partitioning: {granularity: hourly, start: 2026-01-01, column: event_time}
"""


def project(tables: str, warehouse: str = "warehouse: {root: ./warehouse}\n") -> str:
    return f"{warehouse}tables:\n{tables}"


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tables.yaml"
    path.write_text(text)
    return path


def spec_error(tmp_path: Path, text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_project(write(tmp_path, text))
    return info.value


def problem(err: SpecError, table: str | None, field: str) -> str:
    """The message of the problem reported for (table, field); fails when there is none."""
    messages = [m for t, f, m in err.problems if (t, f) == (table, field)]
    assert messages, f"no problem for table {table!r}, field {field!r} in {err.problems}"
    return messages[0]


# --- valid files ------------------------------------------------------------------------


def test_valid_file_loads_with_parsed_watermarks_and_partitioning(tmp_path):
    spec = load_project(write(tmp_path, project(ORDERS + EVENTS)))

    assert [t.name for t in spec.tables] == ["orders", "events"]
    orders, events = spec.table("orders"), spec.table("events")
    assert orders.watermark.lookback == timedelta(hours=2)
    assert orders.partitioning.start == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert orders.partition_column == "updated_at"
    assert orders.on_schema_change == "fail"
    assert events.watermark.kind == "id"
    assert events.watermark.lookback == 1000
    assert events.partition_column == "event_time"
    assert events.source.timezone == "Europe/Berlin"


def test_a_start_relative_to_today_is_midnight_utc_n_days_before(tmp_path):
    relative = ORDERS.replace("start: 2026-01-01", "start: today-4d")
    orders = load_project(write(tmp_path, project(relative))).table("orders")

    midnight = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    assert orders.partitioning.start == midnight - timedelta(days=4)
    for bad in ("today+1d", "yesterday", "today-4h"):
        err = spec_error(tmp_path / bad, project(ORDERS.replace("2026-01-01", bad)))
        message = problem(err, "orders", "partitioning.start")
        assert "'today' or 'today-Nd'" in message, message


def test_relative_paths_resolve_against_the_yaml_folder_not_the_cwd(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    tables = ORDERS.replace(
        "    strategy: upsert\n", "    strategy: upsert\n    target: {path: ../shared/orders}\n"
    )
    folder = tmp_path / "conf"

    spec = load_project(write(folder, project(tables + EVENTS)))

    conf = folder.resolve()
    assert spec.warehouse.root == str(conf / "warehouse")
    assert spec.table("orders").source.path == str(conf / "source" / "orders")
    assert spec.table("orders").target.path == str(tmp_path.resolve() / "shared" / "orders")
    assert spec.target_path(spec.table("orders")) == str(tmp_path.resolve() / "shared" / "orders")


def test_target_path_defaults_to_warehouse_root_and_table_name(tmp_path):
    spec = load_project(write(tmp_path, project(EVENTS)))

    events = spec.table("events")
    assert events.target.path is None
    assert spec.target_path(events) == str(tmp_path.resolve() / "warehouse" / "events")


def test_object_store_uris_are_left_alone(tmp_path):
    tables = ORDERS.replace("./source/orders", "s3://lake/raw/orders") + EVENTS.replace(
        "./source/events", "abfss://raw@account.dfs.core.windows.net/events"
    )
    spec = load_project(write(tmp_path, project(tables, "warehouse: {root: s3://lake/wh/}\n")))

    assert spec.table("orders").source.path == "s3://lake/raw/orders"
    assert spec.table("events").source.path == "abfss://raw@account.dfs.core.windows.net/events"
    assert spec.warehouse.root == "s3://lake/wh/"
    assert spec.target_path(spec.table("orders")) == "s3://lake/wh/orders"


# --- field problems ---------------------------------------------------------------------


def test_typo_in_field_names_table_field_and_suggestion(tmp_path):
    text = project(ORDERS.replace("column: updated_at", "colum: updated_at"))

    err = spec_error(tmp_path, text)

    message = problem(err, "orders", "watermark.colum")
    assert "unknown field" in message
    assert "did you mean 'column'?" in message
    # The required field the typo stands for is reported too.
    assert problem(err, "orders", "watermark.column") == "is required but missing"
    assert "table 'orders', field 'watermark.colum'" in str(err)
    assert str(write(tmp_path, text)) in str(err)


def test_typo_in_top_level_field_suggests_the_right_one(tmp_path):
    err = spec_error(tmp_path, project(ORDERS).replace("tables:", "tabels:"))

    assert "did you mean 'tables'?" in problem(err, None, "tabels")
    assert "top level, field 'tabels'" in str(err)


@pytest.mark.parametrize(
    ("remove", "field"),
    [
        ("    keys: [order_id]\n", "keys"),
        ("column: updated_at, ", "watermark.column"),
        ("    strategy: upsert\n", "strategy"),
    ],
)
def test_missing_required_field_names_table_and_field(tmp_path, remove, field):
    err = spec_error(tmp_path, project(ORDERS.replace(remove, "")))

    assert problem(err, "orders", field) == "is required but missing"
    assert f"table 'orders', field '{field}': is required but missing" in str(err)


def test_unknown_strategy_lists_allowed_values(tmp_path):
    err = spec_error(tmp_path, project(ORDERS.replace("strategy: upsert", "strategy: merge")))

    message = problem(err, "orders", "strategy")
    assert "'merge'" in message
    assert "'append'" in message
    assert "'upsert'" in message


def test_unknown_watermark_kind_lists_allowed_values(tmp_path):
    err = spec_error(tmp_path, project(ORDERS.replace("kind: timestamp", "kind: version")))

    message = problem(err, "orders", "watermark.kind")
    assert "'version'" in message
    assert "'timestamp'" in message
    assert "'id'" in message


def test_bad_lookback_duration_says_how_to_write_a_duration(tmp_path):
    err = spec_error(tmp_path, project(ORDERS.replace("lookback: 2h", "lookback: 2 hours")))

    assert [t for t, _, _ in err.problems] == ["orders"]
    text = str(err)
    assert "'2 hours' is not a duration" in text
    for example in ("'30s'", "'2h'", "'1d 6h'", "'PT2H'"):
        assert example in text


def test_bad_settle_lag_duration_names_the_field(tmp_path):
    text = project(ORDERS.replace("lookback: 2h", "settle_lag: soon"))

    message = problem(spec_error(tmp_path, text), "orders", "watermark.settle_lag")
    assert "'soon' is not a duration" in message
    assert "'15m'" in message


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("lookback: 2h", "lookback: 2 hours", "watermark.lookback"),
        ("kind: timestamp, lookback: 2h", "kind: id, lookback: 2h", "watermark.lookback"),
        ("kind: timestamp, lookback: 2h", "kind: id, settle_lag: 5m", "watermark.settle_lag"),
    ],
)
def test_watermark_setting_errors_name_the_setting_as_field(tmp_path, old, new, field):
    tables = ORDERS.replace(old, new).replace("2026-01-01}", "2026-01-01, column: created_at}")

    err = spec_error(tmp_path, project(tables))

    assert [f for _, f, _ in err.problems] == [field]


def test_id_watermark_refuses_duration_lookback(tmp_path):
    text = project(EVENTS.replace("lookback: 1000", "lookback: 2h"))

    err = spec_error(tmp_path, text)

    assert err.problems[0][:2] == ("events", "watermark.lookback")
    assert "'2h'" in str(err)
    assert "whole number of ids" in str(err)


@pytest.mark.parametrize("lookback", ["-5", "1.5", "true"])
def test_id_watermark_refuses_non_whole_or_negative_lookback(tmp_path, lookback):
    text = project(EVENTS.replace("lookback: 1000", f"lookback: {lookback}"))

    assert "whole number of ids" in str(spec_error(tmp_path, text))


def test_timestamp_watermark_refuses_negative_lookback(tmp_path):
    err = spec_error(tmp_path, project(ORDERS.replace("lookback: 2h", "lookback: -5")))

    assert err.problems[0][1] == "watermark.lookback"
    assert "-5" in str(err) and "negative" in str(err)


def test_settle_lag_on_id_watermark_is_refused(tmp_path):
    text = project(EVENTS.replace("lookback: 1000", "settle_lag: 5m"))

    err = spec_error(tmp_path, text)

    assert err.problems[0][:2] == ("events", "watermark.settle_lag")
    assert "applies to 'timestamp' watermarks only" in str(err)


def test_id_watermark_without_partition_column_is_refused(tmp_path):
    text = project(EVENTS.replace(", column: event_time}", "}"))

    err = spec_error(tmp_path, text)

    assert [t for t, _, _ in err.problems] == ["events"]
    assert "partitioning.column is required when watermark.kind is 'id'" in str(err)


def test_duplicate_table_names_are_refused(tmp_path):
    err = spec_error(tmp_path, project(ORDERS + ORDERS))

    assert "names must be unique" in problem(err, "orders", "name")


def test_duplicate_yaml_keys_are_refused_not_last_one_wins(tmp_path):
    tables = ORDERS.replace("    keys: [order_id]\n", "    keys: [order_id]\n    keys: [status]\n")

    err = spec_error(tmp_path, project(tables))

    message = problem(err, None, "yaml")
    assert "duplicate key 'keys'" in message
    assert "line 6" in message


def test_empty_tables_list_is_refused(tmp_path):
    err = spec_error(tmp_path, "warehouse: {root: ./warehouse}\ntables: []\n")

    assert "non-empty list" in problem(err, None, "tables")


def test_invalid_table_name_is_refused(tmp_path):
    err = spec_error(tmp_path, project(ORDERS.replace("name: orders", "name: my-table")))

    message = problem(err, "my-table", "name")
    assert "'my-table' is not a valid table name" in message
    assert "letters, digits and '_'" in message


def test_unknown_source_time_zone_is_refused(tmp_path):
    text = project(EVENTS.replace("Europe/Berlin", "Europe/Atlantis"))

    message = problem(spec_error(tmp_path, text), "events", "source.timezone")
    assert "unknown time zone 'Europe/Atlantis'" in message
    assert "IANA" in message


def test_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError) as info:
        load_project(tmp_path / "nope.yaml")

    assert info.value.problems == [(None, "file", "does not exist")]


def test_all_problems_in_all_tables_are_reported_at_once(tmp_path):
    tables = (
        ORDERS.replace("strategy: upsert", "strategy: merge")
        + EVENTS.replace("kind: id", "kind: serial").replace("Europe/Berlin", "Mars/Olympus")
        + ORDERS.replace("name: orders", "name: payments").replace("    keys: [order_id]\n", "")
    )

    err = spec_error(tmp_path, project(tables, warehouse="warehouse: {}\n"))

    assert {(t, f) for t, f, _ in err.problems} == {
        (None, "warehouse.root"),
        ("orders", "strategy"),
        ("events", "watermark.kind"),
        ("events", "source.timezone"),
        ("payments", "keys"),
    }
    text = str(err)
    for table in ("orders", "events", "payments"):
        assert f"table '{table}'" in text


# --- durations --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("15m", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("1d 6h", timedelta(days=1, hours=6)),
        ("1d6h30m", timedelta(days=1, hours=6, minutes=30)),
        ("1.5h", timedelta(minutes=90)),
        ("1w", timedelta(weeks=1)),
        (" 2H ", timedelta(hours=2)),
        ("PT2H", timedelta(hours=2)),
        ("P1DT2H30M15S", timedelta(days=1, hours=2, minutes=30, seconds=15)),
        ("0", timedelta(0)),
        (90, timedelta(seconds=90)),
        (1.5, timedelta(seconds=1.5)),
        (timedelta(minutes=5), timedelta(minutes=5)),
    ],
)
def test_parse_duration_accepts(value, expected):
    assert parse_duration(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "2 hours",
        "2",
        "h",
        "2x",
        "2h30",
        "-2h",
        "P",
        "PT",
        "PT1.5H",
        True,
        None,
        [2],
        -5,
        float("inf"),
        float("nan"),
    ],
)
def test_parse_duration_refuses_non_durations(value):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(value)


# --- the repository's project and the Dagster code location -----------------------------


def test_repository_tables_yaml_loads():
    spec = load_project(PROJECT_ROOT / "tables.yaml")

    assert [t.name for t in spec.tables] == [
        "orders",
        "events",
        "customers",
        "customers_history",
        "products",
        "invoices_bronze",
        "invoice_headers",
    ]
    assert spec.table("customers_history").history is not None
    assert spec.table("invoices_bronze").landing is not None
    assert spec.table("products").takes_snapshots
    assert spec.warehouse.root == str(PROJECT_ROOT.resolve() / "data" / "warehouse")


def validate_definitions(tmp_path: Path, tables: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k != "INCREMENTAL_ASSETS_TABLES"}
    env["DAGSTER_HOME"] = str(tmp_path / "dagster_home")
    (tmp_path / "dagster_home").mkdir(exist_ok=True)
    if tables is not None:
        env["INCREMENTAL_ASSETS_TABLES"] = str(tables)
    command = [sys.executable, "-m", "dagster", "definitions", "validate"]
    return subprocess.run(
        [*command, "-m", "incremental_assets.definitions"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_dagster_definitions_validate_passes_on_the_project(tmp_path):
    done = validate_definitions(tmp_path)

    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "All code locations passed validation" in output


@pytest.mark.slow
def test_dagster_definitions_validate_fails_on_broken_tables_yaml(tmp_path):
    broken = write(
        tmp_path / "conf", project(ORDERS.replace("column: updated_at", "colum: updated_at"))
    )

    done = validate_definitions(tmp_path, tables=broken)

    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "SpecError" in output
    assert "table 'orders', field 'watermark.colum'" in output
    assert "did you mean 'column'?" in output


def test_spark_section_sets_master_and_conf_of_the_spark_resource(tmp_path, monkeypatch):
    from incremental_assets.dagster_layer.build import build_definitions

    monkeypatch.delenv("INCREMENTAL_ASSETS_SPARK_MASTER", raising=False)
    text = project(ORDERS) + (
        "spark:\n  master: local[2]\n  conf:\n    spark.jars: /usr/share/java/postgresql.jar\n"
    )
    path = tmp_path / "tables.yaml"
    path.write_text(text)

    config = build_definitions(load_project(path)).resources["spark"].spark_config

    assert config["spark.master"] == "local[2]"
    assert config["spark.jars"] == "/usr/share/java/postgresql.jar"
    assert config["spark.sql.session.timeZone"] == "UTC"


def test_unknown_spark_setting_section_field_is_refused(tmp_path):
    err = spec_error(tmp_path, project(ORDERS) + "spark:\n  mastr: local[2]\n")

    assert err.problems[0][1] == "spark.mastr"
    assert "did you mean 'master'" in str(err)


def test_hybrid_watermark_needs_a_tiebreak_and_options_stay_with_hybrid(tmp_path):
    no_tiebreak = ORDERS.replace("kind: timestamp, lookback: 2h", "kind: hybrid")
    stray = ORDERS.replace("lookback: 2h", "lookback: 2h, max_rows: 10")

    assert "watermark.tiebreak is required" in str(spec_error(tmp_path, project(no_tiebreak)))
    assert "apply to kind 'hybrid' only" in str(spec_error(tmp_path, project(stray)))
    ok = ORDERS.replace("kind: timestamp, lookback: 2h", "kind: hybrid, tiebreak: id, max_rows: 5")
    spec = load_project(write(tmp_path / "ok", project(ok))).tables[0]
    assert (spec.watermark.tiebreak, spec.watermark.max_rows) == ("id", 5)
    assert spec.partition_column == "updated_at"


SNAPSHOT = """\
  - name: products
    source: {format: parquet, path: ./source/products}
    keys: [id]
    strategy: {kind: snapshot, deletes: soft, tracked: [price]}
    partitioning: {granularity: daily, start: 2026-01-01}
"""

HISTORY = """\
  - name: customers
    source: {format: parquet, path: ./source/customers}
    keys: [id]
    watermark: {column: lsn, kind: id}
    strategy: {kind: scd2, changes: {kind: cdc, encoding: debezium}, tracked: [city]}
    partitioning: {granularity: daily, start: 2026-01-01, column: changed_at}
"""


def test_snapshot_and_scd2_tables_load_with_their_order_columns(tmp_path):
    spec = load_project(write(tmp_path, project(SNAPSHOT + HISTORY)))
    products, customers = spec.tables

    assert products.takes_snapshots and products.watermark.column == "_ia_snapshot_at"
    assert products.strategy.tracked == ["price"]
    assert customers.history is not None and customers.feed.encoding == "debezium"
    assert customers.effective_column == "changed_at"
    assert customers.row_identity == ["id", "valid_from"]


@pytest.mark.parametrize(
    ("old", "new", "field", "says"),
    [
        ("kind: cdc, encoding", "kind: cdc, encodng", "strategy.changes.encodng", "encoding"),
        ("tracked: [city]", "trackd: [city]", "strategy.trackd", "did you mean 'tracked'"),
        ("encoding: debezium}", "deletes: soft}", "strategy", "remove changes.deletes"),
        ("changes: {kind: cdc", "changes: {kind: merge", "strategy.changes", "'snapshot'"),
    ],
)
def test_scd2_option_errors_name_the_nested_field(tmp_path, old, new, field, says):
    err = spec_error(tmp_path, project(HISTORY.replace(old, new)))

    assert says in problem(err, "customers", field)


def test_snapshot_table_with_a_watermark_is_refused_naming_the_watermark(tmp_path):
    text = SNAPSHOT.replace(
        "    keys: [id]\n", "    keys: [id]\n    watermark: {column: ts, kind: timestamp}\n"
    )

    err = spec_error(tmp_path, project(text))

    assert "remove watermark" in problem(err, "products", "watermark")


def test_quality_rules_need_unique_names_and_a_known_action(tmp_path):
    rules = """    quality:
      rules:
        - {name: positive, check: "amount > 0", action: quarantine}
        - {name: positive, check: "amount < 10", action: drop}
"""
    bad_action = spec_error(tmp_path, project(ORDERS + rules))
    twice = spec_error(tmp_path, project(ORDERS + rules.replace("action: drop", "action: warn")))

    assert "'drop'" in problem(bad_action, "orders", "quality.rules.action")
    assert "repeated: positive" in problem(twice, "orders", "quality.rules")


def test_max_lag_needs_a_time_watermark(tmp_path):
    err = spec_error(tmp_path, project(EVENTS + "    max_lag: 1d\n"))

    assert "needs a time watermark" in problem(err, "events", "max_lag")
