"""Limits on what a spec can cost: YAML whose aliases expand, or whose values nest, past a
limit is refused fast with one line naming the file and the line; settings that are lists
or mappings are refused, not turned into text; durations, dates, column lists and numbers
are checked for range and repeats, naming the table and the field."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import pytest

from incremental_assets.dagster_layer.component import IncrementalTables
from incremental_assets.dagster_layer.partitions import partitions_for
from incremental_assets.engine.watermarks import EARLIEST_BOUND, ID_MIN, format_value, shift_back
from incremental_assets.specs import SpecError, load_project
from incremental_assets.specs.yaml_limits import MAX_DEPTH
from incremental_assets_tests.builders import at, load, make_spec, target_rows

UTC = timezone.utc
ORDERS = """\
warehouse: {root: ./warehouse}
tables:
  - name: orders
    source:
      format: csv
      path: ./source/orders
      schema: "order_id BIGINT, updated_at TIMESTAMP"
      options: {header: 'true'}
    keys: [order_id]
    watermark: {column: updated_at, kind: timestamp, lookback: 2h}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
"""
SHOP = """\
connections:
  shop: {url: 'jdbc:postgresql://db:5432/shop', max_retries: 3, retry_delay: 10s}
warehouse: {root: ./warehouse}
tables:
  - name: orders
    source: {format: jdbc, connection: shop, table: public.orders}
    keys: [order_id]
    watermark: {column: updated_at, kind: hybrid, tiebreak: order_id}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
"""


def spec_error(tmp_path: Path, text: str) -> SpecError:
    path = tmp_path / "tables.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as raised:
        load_project(path)
    return raised.value


def problem(err: SpecError, table: str | None, field: str) -> str:
    messages = [m for t, f, m in err.problems if (t, f) == (table, field)]
    assert messages, f"no problem for table {table!r}, field {field!r} in {err.problems}"
    return messages[0]


def alias_bomb(levels: int, indent: str) -> str:
    """Mapping entries x0..x<levels>, each a list of nine aliases of the one before:
    9**levels values in a few lines."""
    lines = [f"{indent}x0: &x0 [a, a, a, a, a, a, a, a, a]"]
    for n in range(1, levels + 1):
        lines.append(f"{indent}x{n}: &x{n} [{', '.join([f'*x{n - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


# --- YAML: aliases and nesting ------------------------------------------------------------


def test_an_alias_bomb_under_source_options_is_refused_fast_naming_its_line(tmp_path):
    bomb = alias_bomb(9, " " * 8)  # 9**9 values: over 120 s and 2.8 GB when it was read
    text = ORDERS.replace("      options: {header: 'true'}\n", "      options:\n" + bomb)

    started = time.monotonic()
    err = spec_error(tmp_path, text)
    elapsed = time.monotonic() - started

    assert elapsed < 2, f"took {elapsed:.1f} s"
    assert len(err.problems) == 1
    message = problem(err, None, "yaml")
    assert "\n" not in message
    assert str(tmp_path / "tables.yaml") in message
    assert "more than 200,000 values once its aliases are expanded" in message
    # The alias that crossed the limit: x5's second *x4 (the spec and x0..x4 hold about
    # 75,000 values, and each *x4 66,430 more).
    line = 1 + text.splitlines().index("        x5: &x5 [" + ", ".join(["*x4"] * 9) + "]")
    assert f"line {line}, column 23:" in message


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    text = ORDERS.replace("{header: 'true'}", "{header: &loop [*loop]}")

    message = problem(spec_error(tmp_path, text), None, "yaml")

    assert "line 8, column" in message
    assert "a value that contains itself" in message


def test_nesting_past_the_depth_limit_is_refused_with_its_line_not_a_recursion_error(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    text = ORDERS.replace("{header: 'true'}", f"{{header: {deep}}}")

    started = time.monotonic()
    err = spec_error(tmp_path, text)

    assert time.monotonic() - started < 10  # PyYAML's scanner looks ahead; ~1 s here
    message = problem(err, None, "yaml")
    assert "line 8, column" in message
    assert f"nested more than {MAX_DEPTH} levels deep" in message


def test_block_nesting_up_to_the_limit_reads_and_one_level_more_is_refused(tmp_path):
    def options(levels: int) -> str:
        """source.options holding ``levels`` mappings, one inside the other."""
        keys = [f"{' ' * (8 + 2 * n)}k{n}:" for n in range(levels)]
        return "      options:\n" + "\n".join(keys) + " v\n"

    def with_options(levels: int) -> str:
        return ORDERS.replace("      options: {header: 'true'}\n", options(levels))

    # Five nodes enclose an option's value (the document, tables, the table, source and
    # options), so the innermost value of n nested options sits 4 + n deep.
    within = spec_error(tmp_path, with_options(MAX_DEPTH - 5))
    assert [f for _, f, _ in within.problems] == ["source.options"]  # read, then refused
    too_deep = spec_error(tmp_path, with_options(MAX_DEPTH - 4))

    message = problem(too_deep, None, "yaml")
    assert f"line {8 + MAX_DEPTH - 4}," in message
    assert f"nested more than {MAX_DEPTH} levels deep" in message


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tables.yaml").write_text(text)
    return folder / "tables.yaml"


def test_aliases_shared_by_tables_within_the_limit_load_as_written_out(tmp_path):
    shared = """\
warehouse: {root: ./warehouse}
tables:
  - name: orders
    source: &csv
      format: csv
      path: ./source/orders
      schema: "order_id BIGINT, updated_at TIMESTAMP"
      options: &options {header: 'true', sep: ';'}
    keys: &keys [order_id]
    watermark: &wm {column: updated_at, kind: timestamp, lookback: 2h}
    strategy: upsert
    partitioning: &days {granularity: daily, start: 2026-01-01}
  - name: returns
    source: {format: csv, path: ./source/returns, schema: "order_id BIGINT", options: *options}
    keys: *keys
    watermark: *wm
    strategy: upsert
    partitioning: *days
"""
    project = load_project(write(tmp_path, shared))

    orders, returns = project.tables
    assert returns.source.options == orders.source.options == {"header": "true", "sep": ";"}
    assert (returns.keys, returns.watermark, returns.partitioning) == (
        orders.keys,
        orders.watermark,
        orders.partitioning,
    )


def test_a_setting_that_is_a_list_or_mapping_is_refused_not_turned_into_text(tmp_path):
    text = ORDERS.replace("{header: 'true'}", "{header: 'true', sep: [';', ',']}") + (
        "spark:\n  conf: {spark.sql.shuffle.partitions: {n: 4}, spark.ui.enabled: }\n"
    )

    err = spec_error(tmp_path, text)

    options = problem(err, "orders", "source.options")
    assert "'sep' has a list" in options
    assert "[';', ',']" not in str(err)
    conf = problem(err, None, "spark.conf")
    assert "'spark.sql.shuffle.partitions' has a mapping" in conf


def test_an_empty_setting_is_refused_not_sent_as_the_text_none(tmp_path):
    text = ORDERS.replace("{header: 'true'}", "{header: }")

    assert "'header' has no value" in problem(
        spec_error(tmp_path, text), "orders", "source.options"
    )


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("keys: [order_id]", "keys: {order_id: 1}", "keys"),
        ("keys: [order_id]", "keys: order_id", "keys"),
        ("strategy: upsert", "strategy: {kind: snapshot, tracked: {a: 1}}", "strategy.tracked"),
    ],
)
def test_a_mapping_or_text_where_a_list_is_expected_is_refused_naming_the_field(
    tmp_path, old, new, field
):
    text = ORDERS.replace(old, new)
    if "snapshot" in new:
        text = text.replace(
            "    watermark: {column: updated_at, kind: timestamp, lookback: 2h}\n", ""
        )

    assert "valid list" in problem(spec_error(tmp_path, text), "orders", field)


# --- components: dg parses defs.yaml, the limits apply before its templates render ------


def shared_bomb(levels: int) -> list:
    """What dg's parser gives for an alias bomb: lists shared, 9**levels values in all."""
    value: list = ["a"] * 9
    for _ in range(levels):
        value = [value] * 9
    return value


def test_an_alias_bomb_in_a_components_attributes_is_refused_before_it_renders(tmp_path):
    table = {
        "name": "orders",
        "source": {"format": "csv", "path": "src", "options": {"x": shared_bomb(8)}},
        "keys": ["order_id"],
        "watermark": {"column": "updated_at", "kind": "timestamp"},
        "strategy": "upsert",
        "partitioning": {"granularity": "daily", "start": "2026-01-01"},
    }

    started = time.monotonic()
    with pytest.raises(SpecError) as raised:
        IncrementalTables.from_attributes_dict(attributes={"tables": [table]})

    assert time.monotonic() - started < 2
    message = problem(raised.value, None, "yaml")
    assert "attributes.tables.0.source.options.x" in message
    assert "more than 200,000 values" in message


def test_a_component_nested_past_the_limit_is_refused_before_it_renders():
    value: object = "v"
    for _ in range(500):
        value = {"k": value}

    with pytest.raises(SpecError) as raised:
        IncrementalTables.from_attributes_dict(attributes={"spark": {"conf": value}})

    assert "nested more than 64 levels deep" in problem(raised.value, None, "yaml")


def test_a_defs_yaml_alias_bomb_fails_the_code_location_naming_the_file_and_line(
    tmp_path, monkeypatch
):
    # dg's own parser walks each alias again (9**5 values here: a few seconds); rendering
    # the templates of that many values took minutes.
    package = tmp_path / "bombed_project"
    (package / "defs" / "sales").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    defs_yaml = package / "defs" / "sales" / "defs.yaml"
    defs_yaml.write_text(
        "type: incremental_assets.IncrementalTables\n"
        "attributes:\n"
        "  warehouse: {root: wh}\n"
        "  tables:\n"
        "    - name: sales\n"
        "      source:\n"
        "        format: parquet\n"
        "        path: src\n"
        "        options:\n" + alias_bomb(5, " " * 10) + "      keys: [id]\n"
        "      watermark: {column: ts, kind: timestamp}\n"
        "      strategy: upsert\n"
        "      partitioning: {granularity: daily, start: 2026-01-01}\n"
    )
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "bombed_project"\nversion = "0.1.0"\n\n'
        '[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "bombed_project"\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    started = time.monotonic()
    try:
        with pytest.raises(Exception) as raised:
            dg.load_from_defs_folder(project_root=tmp_path)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "bombed_project"]:
            del sys.modules[name]

    assert time.monotonic() - started < 60
    cause = raised.value if isinstance(raised.value, SpecError) else raised.value.__cause__
    assert isinstance(cause, SpecError), repr(raised.value)
    message = problem(cause, None, "yaml")
    assert f"{defs_yaml}, line 15, column 11:" in message  # x5, whose aliases cross it
    assert "more than 200,000 values" in message


# --- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("lookback: 2h", "lookback: 99999999d", "watermark.lookback"),
        ("lookback: 2h", "lookback: P99999999999D", "watermark.lookback"),
        ("lookback: 2h", "lookback: 1.0e+300", "watermark.lookback"),
        ("lookback: 2h", f"lookback: {'9' * 400}d", "watermark.lookback"),
        ("lookback: 2h", "lookback: 3651d", "watermark.lookback"),
        ("lookback: 2h", "lookback: 2h, settle_lag: 10000w", "watermark.settle_lag"),
        ("strategy: upsert", "strategy: upsert\n    max_lag: 87601h", "max_lag"),
    ],
)
def test_a_duration_past_ten_years_is_refused_naming_the_field(tmp_path, old, new, field):
    message = problem(spec_error(tmp_path, ORDERS.replace(old, new)), "orders", field)

    assert "is too long: a duration is at most 3650d (ten years)" in message


def test_a_landing_settle_past_ten_years_is_refused(tmp_path):
    text = ORDERS.replace(
        "      options: {header: 'true'}\n", "      landing: {settle: 99999999d}\n"
    )
    text = text.replace("    keys: [order_id]\n", "").replace(
        "    watermark: {column: updated_at, kind: timestamp, lookback: 2h}\n", ""
    )
    text = text.replace("strategy: upsert", "strategy: append")

    message = problem(spec_error(tmp_path, text), "orders", "source.landing.settle")
    assert "at most 3650d" in message


def test_the_longest_lookback_loads_and_its_second_run_reads_the_lookback(
    spark, tmp_path, orders_source, target
):
    # 99999999d used to be accepted and the second run died in OverflowError.
    spec = make_spec(orders_source.path, watermark={"lookback": "3650d"})
    orders_source.upsert([(1, "new", 10.0, at(1, 10)), (2, "new", 20.0, at(1, 11))])
    load(spark, spec, target, 1)
    orders_source.upsert([(1, "paid", 11.0, at(2, 9)), (3, "new", 30.0, at(2, 10))])

    second = load(spark, spec, target, 2)

    assert target_rows(target) == [
        (1, "paid", 11.0, at(2, 9)),
        (2, "new", 20.0, at(1, 11)),
        (3, "new", 30.0, at(2, 10)),
    ]
    assert format_value(at(1, 11) - timedelta(days=3650)) in second.window


def test_a_cursor_near_the_year_1_minus_a_lookback_stops_at_the_earliest_bound():
    near = datetime(1, 1, 3, 6, tzinfo=UTC)

    assert shift_back(near, timedelta(days=3650)) == EARLIEST_BOUND
    assert shift_back((near, 7), timedelta(days=3650)) == (EARLIEST_BOUND, ID_MIN)
    # Never above the cursor itself: a bound above it would skip rows.
    first = datetime(1, 1, 1, 5, tzinfo=UTC)
    assert shift_back(first, timedelta(hours=2)) == first
    assert shift_back(ID_MIN + 5, 1000) == ID_MIN
    assert shift_back(at(3), timedelta(hours=2)) == at(2, 22)


def test_an_id_lookback_must_fit_a_64_bit_integer(tmp_path):
    def ids(lookback: int) -> str:
        return ORDERS.replace(
            "{column: updated_at, kind: timestamp, lookback: 2h}",
            f"{{column: order_id, kind: id, lookback: {lookback}}}",
        ).replace("start: 2026-01-01}", "start: 2026-01-01, column: updated_at}")

    message = problem(spec_error(tmp_path, ids(2**63)), "orders", "watermark.lookback")

    assert "an id lookback is at most 9223372036854775807" in message
    spec = load_project(write(tmp_path / "ok", ids(2**63 - 1))).tables[0]
    assert spec.watermark.lookback == 2**63 - 1


# --- dates -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "start",
    [
        "0001-01-01",
        "1899-12-31",
        "'0001-01-01T00:00:00+05:00'",
        "today-99999999999d",
        "today-50000d",
    ],
)
def test_a_partition_start_before_1900_is_refused_naming_the_field(tmp_path, start):
    text = ORDERS.replace("start: 2026-01-01", f"start: {start}")

    message = problem(spec_error(tmp_path, text), "orders", "partitioning.start")

    assert "before 1900-01-01, the earliest start" in message


@pytest.mark.parametrize(
    ("granularity", "first_key"), [("daily", "1900-01-01"), ("hourly", "1900-01-01-00:00")]
)
def test_dagster_partitions_start_at_the_earliest_start(tmp_path, granularity, first_key):
    # `start: 0001-01-01` was formatted '1-01-01', which Dagster could not read back: the
    # whole code location failed to load.
    text = ORDERS.replace("daily, start: 2026-01-01", f"{granularity}, start: 1900-01-01")
    spec = load_project(write(tmp_path, text)).tables[0]

    partitions = partitions_for(spec)

    assert partitions.get_first_partition_key() == first_key
    assert partitions.get_last_partition_key() is not None


# --- column lists ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "field", "says"),
    [
        ("keys: [order_id]", "keys: [order_id, order_id]", "keys", "'order_id' is listed twice"),
        (
            "keys: [order_id]",
            "keys: [order_id, ORDER_ID]",
            "keys",
            "'ORDER_ID' is listed twice (as 'order_id': Spark ignores case)",
        ),
        (
            "strategy: upsert",
            "strategy: upsert\n    target: {partition_by: [region, day, region]}",
            "target.partition_by",
            "'region' is listed twice",
        ),
        (
            "strategy: upsert",
            "strategy: {kind: scd2, tracked: [status, amount, status]}",
            "strategy.tracked",
            "'status' is listed twice",
        ),
    ],
)
def test_a_column_listed_twice_is_refused_naming_the_column(tmp_path, old, new, field, says):
    message = problem(spec_error(tmp_path, ORDERS.replace(old, new)), "orders", field)

    assert says in message
    assert "name each column once" in message


def test_snapshot_tracked_columns_listed_twice_are_refused(tmp_path):
    text = ORDERS.replace(
        "strategy: upsert", "strategy: {kind: snapshot, tracked: [status, status]}"
    ).replace("    watermark: {column: updated_at, kind: timestamp, lookback: 2h}\n", "")

    message = problem(spec_error(tmp_path, text), "orders", "strategy.tracked")

    assert "'status' is listed twice" in message


# --- numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "field", "says"),
    [
        (
            "tiebreak: order_id}",
            f"tiebreak: order_id, max_rows: {2**31}}}",
            "watermark.max_rows",
            "less than or equal to 2147483647",
        ),
        (
            "table: public.orders}",
            "table: public.orders, fetch_size: 10000000}",
            "source.fetch_size",
            "less than or equal to 1000000",
        ),
        (
            "table: public.orders}",
            "table: public.orders, slices: {column: order_id, count: 100000}}",
            "source.slices.count",
            "less than or equal to 256",
        ),
        (
            "start: 2026-01-01}",
            "start: 2026-01-01, end_offset: 1000000000}",
            "partitioning.end_offset",
            "less than or equal to 366",
        ),
    ],
)
def test_a_number_out_of_range_is_refused_naming_the_field(tmp_path, old, new, field, says):
    assert says in problem(spec_error(tmp_path, SHOP.replace(old, new)), "orders", field)


@pytest.mark.parametrize("size", ["lots", "-1", "16 parsecs", "true", "[16MiB]", "16MiB a run"])
def test_a_one_pass_size_that_is_not_a_size_is_refused_naming_the_field(tmp_path, size):
    text = ORDERS.replace("partitioning:", f"target: {{one_pass_below: {size}}}\n    partitioning:")

    message = problem(spec_error(tmp_path, text), "orders", "target.one_pass_below")

    assert "is not a size" in message
    assert "e.g. 16MiB, 64MB or 0 (off)" in message


@pytest.mark.parametrize(("size", "bytes_"), [("0", 0), ("64MiB", 64 * 2**20), ("8 MB", 8_000_000)])
def test_a_one_pass_size_reads_with_its_unit(tmp_path, size, bytes_):
    text = ORDERS.replace("partitioning:", f"target: {{one_pass_below: {size}}}\n    partitioning:")

    assert load_project(write(tmp_path, text)).tables[0].target.one_pass_below == bytes_


@pytest.mark.parametrize(
    "size", ["huge", "0", "512KiB", "2GiB", "-1", "true", "[64MiB]", "32MiB per file"]
)
def test_a_file_size_outside_1mib_to_1gib_is_refused_naming_the_field(tmp_path, size):
    text = ORDERS.replace("partitioning:", f"target: {{file_size: {size}}}\n    partitioning:")

    message = problem(spec_error(tmp_path, text), "orders", "target.file_size")

    assert "is not a file size between 1MiB and 1GiB" in message
    assert "e.g. 128MiB (the default), 32MiB or 512MB" in message


@pytest.mark.parametrize(
    ("size", "bytes_"), [("32MiB", 32 * 2**20), ("512 MB", 512_000_000), ("1GiB", 2**30)]
)
def test_a_file_size_reads_with_its_unit_and_is_unset_by_default(tmp_path, size, bytes_):
    text = ORDERS.replace("partitioning:", f"target: {{file_size: {size}}}\n    partitioning:")

    assert load_project(write(tmp_path, text)).tables[0].target.file_size == bytes_
    assert load_project(write(tmp_path, ORDERS)).tables[0].target.file_size is None


@pytest.mark.parametrize(
    ("retries", "says"),
    [
        ("max_retries: 1000", "less than or equal to 20"),
        ("max_retries: 14", "the last of 14 retries would wait about 46 hours"),
        ("max_retries: 2, retry_delay: 1d", "the last of 2 retries would wait about 72 hours"),
        ("max_retries: 20, retry_delay: 3650d", "lower max_retries or retry_delay"),
    ],
)
def test_retries_that_would_wait_past_a_day_are_refused_naming_the_connection(
    tmp_path, retries, says
):
    text = SHOP.replace("max_retries: 3, retry_delay: 10s", retries)

    message = problem(spec_error(tmp_path, text), None, "connections.shop.max_retries")

    assert says in message


def test_the_settings_within_the_limits_still_load(tmp_path):
    text = SHOP.replace("max_retries: 3, retry_delay: 10s", "max_retries: 13, retry_delay: 10s")
    text = text.replace("tiebreak: order_id}", f"tiebreak: order_id, max_rows: {2**31 - 1}}}")
    text = text.replace(
        "table: public.orders}",
        "table: public.orders, fetch_size: 1000000, slices: {column: order_id, count: 256}}",
    )
    text = text.replace("start: 2026-01-01}", "start: 1900-01-01, end_offset: 366}")

    project = load_project(write(tmp_path, text))

    orders = project.tables[0]
    assert project.connections["shop"].max_retries == 13
    assert (orders.watermark.max_rows, orders.source.fetch_size) == (2**31 - 1, 1_000_000)
    assert orders.partitioning.end_offset == 366
    assert orders.partitioning.start == datetime(1900, 1, 1, tzinfo=UTC)


def test_yaml_errors_are_one_line_naming_the_file_and_line(tmp_path):
    err = spec_error(tmp_path, ORDERS.replace("keys: [order_id]", "keys: [order_id"))

    message = problem(err, None, "yaml")
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'tables.yaml'}, line 10, column ")


@pytest.mark.parametrize("count", ["0", "1", "-4", "10001", "many", "true", "2.5", "[8]"])
def test_a_compaction_threshold_below_two_files_or_not_a_count_is_refused_naming_the_field(
    tmp_path, count
):
    text = ORDERS.replace("partitioning:", f"target: {{compact_after: {count}}}\n    partitioning:")

    message = problem(spec_error(tmp_path, text), "orders", "target.compact_after")

    assert "is not a count of small files between 2 and 10000: e.g. 8" in message


def test_a_compaction_threshold_reads_as_a_count_of_files(tmp_path):
    text = ORDERS.replace("partitioning:", "target: {compact_after: 8}\n    partitioning:")
    unset = load_project(write(tmp_path / "unset", ORDERS)).tables[0].target

    assert load_project(write(tmp_path, text)).tables[0].target.compact_after == 8
    assert unset.compact_after is None


@pytest.mark.parametrize("share", ["0", "1", "1.5", "-0.1", "2%", "true", ".nan", "[0.02]"])
def test_a_purge_share_outside_zero_to_one_or_not_a_number_is_refused_naming_the_field(
    tmp_path, share
):
    text = ORDERS.replace("partitioning:", f"target: {{purge_after: {share}}}\n    partitioning:")

    message = problem(spec_error(tmp_path, text), "orders", "target.purge_after")

    assert "is not a share of the table's rows between 0 and 1: e.g. 0.02" in message


def test_a_purge_share_reads_as_a_fraction_of_the_rows(tmp_path):
    text = ORDERS.replace("partitioning:", "target: {purge_after: 0.05}\n    partitioning:")
    unset = load_project(write(tmp_path / "unset", ORDERS)).tables[0].target

    assert load_project(write(tmp_path, text)).tables[0].target.purge_after == 0.05
    assert unset.purge_after is None
