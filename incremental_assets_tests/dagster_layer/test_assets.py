"""The Dagster layer: assets built from YAML, materialized on a real (temporary) instance."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.specs import load_project
from incremental_assets_tests.builders import (
    ORDERS_YAML,
    Project,
    at,
    target_rows,
)


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture
def project(tmp_path, spark) -> Project:
    return Project(tmp_path)


def metadata_of(result, name="orders") -> dict:
    event = result.asset_materializations_for_node(name)[-1]
    return {k: v.value for k, v in event.metadata.items()}


def test_materialization_reports_counts_watermarks_version_and_phase_times(project, instance):
    project.source.upsert([(1, "placed", 1.0, at(1, 5)), (2, "placed", 2.0, at(1, 6))])
    project.materialize(instance, "2026-01-01")
    project.source.upsert([(2, "paid", 2.0, at(2, 1)), (3, "placed", 3.0, at(2, 2))])

    result = project.materialize(instance, "2026-01-02")

    meta = metadata_of(result)
    assert meta["rows_extracted"] == 2
    assert (meta["rows_inserted"], meta["rows_updated"], meta["rows_unchanged"]) == (1, 1, 0)
    assert meta["watermark_before"] == "2026-01-01T06:00:00Z"
    assert meta["watermark_after"] == "2026-01-02T02:00:00Z"
    assert meta["delta_version"] == DeltaTable(project.target.path).version() == 1
    assert meta["dagster/row_count"] == 3
    # The catalog's columns: the target's, read from its Delta log, with the spec's roles.
    columns = {c.name: c for c in meta["dagster/column_schema"].columns}
    delta_fields = {f.name: f for f in DeltaTable(project.target.path).schema().fields}
    assert list(columns) == list(delta_fields)
    assert (columns["order_id"].type, columns["order_id"].description) == ("long", "key")
    assert columns["updated_at"].description == "watermark (timestamp)"
    assert columns["updated_at"].type == delta_fields["updated_at"].type.type
    assert meta["mode"] == "incremental"
    # A path target's name is the one Spark SQL gives it; the location is its URI.
    assert meta["dagster/table_name"] == f"delta.`{project.target.path}`"
    assert meta["dagster/uri"] == project.target.path
    for phase in ("probe", "extract", "commit", "total"):
        assert meta[f"seconds_{phase}"] >= 0
    assert meta["lag_seconds"] > 0
    # The suite's session turns code generation off itself (servers.INTERPRETED): the run
    # keeps the session's choice and says it ran interpreted (engine/load/interpreted.py).
    assert meta["spark_interpreted"] is True
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks == {
        "keys_unique": True,
        "keys_not_null": True,
        "watermark_never_moves_backwards": True,
        "counts_match_table": True,
        "rows_reconciled": True,
        "schema_matches_spec": True,
        "watermark_in_range": True,
    }


def test_a_load_that_compacts_reports_it_and_its_checks_judge_the_loads_commit(
    tmp_path, spark, instance
):
    # target.compact_after: 2. The second day's new orders make a second small file (no
    # lookback: no row of the first file is read again): the run compacts the two after its
    # commit, says so, and its checks still pass (they judge the load's own commit).
    yaml_text = ORDERS_YAML.replace("lookback: 1h", "lookback: 0s").rstrip()
    project = Project(tmp_path, yaml_text + "\n    target: {compact_after: 2}\n")
    project.source.upsert([(1, "placed", 1.0, at(1, 5)), (2, "placed", 2.0, at(1, 6))])
    first = metadata_of(project.materialize(instance, "2026-01-01"))
    project.source.upsert([(3, "placed", 3.0, at(2, 2)), (4, "placed", 4.0, at(2, 3))])

    result = project.materialize(instance, "2026-01-02")

    assert (first["small_files"], first["files_compacted"]) == (0, 0)
    meta = metadata_of(result)
    assert (meta["small_files"], meta["files_compacted"], meta["files_compacted_into"]) == (2, 2, 1)
    assert meta["compaction_version"] == meta["delta_version"] + 1
    assert DeltaTable(project.target.path).version() == meta["compaction_version"]
    assert len(DeltaTable(project.target.path).file_uris()) == 1
    assert meta["seconds_compact"] >= 0
    assert all(c.passed for c in result.get_asset_check_evaluations())
    assert meta["dagster/row_count"] == 4


def test_a_load_that_purges_deletion_vectors_reports_it_and_its_checks_judge_the_loads_commit(
    tmp_path, spark, instance
):
    # target.purge_after: 0.2 on a table with deletion vectors. The second day updates one
    # of the first day's two orders: its vector marks 1 of the log's 3 rows deleted, so the
    # run purges after its commit, says so, and its checks judge the load's own commit.
    yaml_text = ORDERS_YAML.replace("lookback: 1h", "lookback: 0s").rstrip()
    target = "    target: {deletion_vectors: true, purge_after: 0.2}\n"
    project = Project(tmp_path, yaml_text + "\n" + target)
    project.source.upsert([(1, "placed", 1.0, at(1, 5)), (2, "placed", 2.0, at(1, 6))])
    first = metadata_of(project.materialize(instance, "2026-01-01"))
    project.source.upsert([(1, "paid", 1.5, at(2, 2))])

    result = project.materialize(instance, "2026-01-02")

    assert (first["deleted_share"], first["files_purged"]) == (0.0, 0)
    meta = metadata_of(result)
    assert meta["rows_updated"] == 1
    assert meta["deleted_share"] == round(1 / 3, 6)
    assert meta["files_purged"] >= 1
    assert meta["purge_version"] == meta["delta_version"] + 1
    assert DeltaTable(project.target.path).version() == meta["purge_version"]
    assert all(c.passed for c in result.get_asset_check_evaluations())
    assert meta["dagster/row_count"] == 2


def test_backfill_of_a_range_is_one_run_and_equals_partition_by_partition(
    tmp_path, spark, instance
):
    rows = [(i, "s", float(i), at(1 + i % 4, i % 24)) for i in range(1, 120)]
    ranged = Project(tmp_path / "ranged")
    single = Project(tmp_path / "single")
    for p in (ranged, single):
        p.source.upsert(rows)

    result = ranged.materialize(instance, partition_range=("2026-01-01", "2026-01-04"))
    for day in ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"):
        single.materialize(instance, day)

    assert result.success
    materialized = {e.partition for e in result.get_asset_materialization_events()}
    assert materialized == {"2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"}
    assert metadata_of(result)["rows_inserted"] == 119
    assert target_rows(ranged.target) == target_rows(single.target)

    rerun = ranged.materialize(instance, partition_range=("2026-01-01", "2026-01-04"))
    assert metadata_of(rerun)["committed"] is False
    assert target_rows(ranged.target) == target_rows(single.target)


def test_bad_source_fails_the_run_with_the_fix_and_commits_nothing(project, instance):
    project.source.upsert([(1, "placed", 1.0, at(1, 5))])
    project.materialize(instance, "2026-01-01")
    version = DeltaTable(project.target.path).version()
    bad_yaml = ORDERS_YAML.replace("column: updated_at", "column: modified_at")
    broken = Project(Path(project.spec.warehouse.root).parent, bad_yaml)

    result = broken.materialize(instance, "2026-01-02", raise_on_error=False)

    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.step_failure_data.error.message
    assert "modified_at" in message and "watermark.column" in message
    assert DeltaTable(project.target.path).version() == version


def test_duplicate_keys_in_target_fail_the_blocking_check(project, instance):
    project.source.upsert([(1, "placed", 1.0, at(1, 5))])
    project.materialize(instance, "2026-01-01")
    # Someone writes to the table behind the loader's back.
    table = DeltaTable(project.target.path)
    write_deltalake(project.target.path, table.to_pyarrow_table(), mode="append")

    result = project.materialize(instance, "2026-01-01", raise_on_error=False)

    check = next(c for c in result.get_asset_check_evaluations() if c.check_name == "keys_unique")
    assert not check.passed
    assert check.metadata["duplicate_keys"].value == 1


def test_watermark_check_fails_when_log_shows_cursor_moving_backwards(project, instance):
    project.source.upsert([(1, "placed", 1.0, at(1, 5))])
    project.materialize(instance, "2026-01-01")
    # A foreign commit that claims an older cursor.
    table = DeltaTable(project.target.path)
    table.create_write_transaction(
        actions=[],
        mode="append",
        schema=table.schema(),
        commit_properties=CommitProperties(
            custom_metadata={
                "incremental_assets.table": "orders",
                "incremental_assets.cursor_after": "2025-12-31T00:00:00Z",
            }
        ),
    )

    result = project.materialize(instance, "2026-01-01", raise_on_error=False)

    check = next(
        c
        for c in result.get_asset_check_evaluations()
        if c.check_name == "watermark_never_moves_backwards"
    )
    assert not check.passed


def test_each_table_gets_daily_or_hourly_partitions_and_an_automation_condition(tmp_path):
    hourly = ORDERS_YAML.replace("granularity: daily", "granularity: hourly").replace(
        "start: 2026-01-01", "start: 2026-01-01 06:00"
    )
    (tmp_path / "tables.yaml").write_text(hourly)
    defs = build_definitions(load_project(tmp_path / "tables.yaml"))

    asset = defs.get_assets_def("orders")
    partitions = asset.partitions_def
    assert isinstance(partitions, dg.HourlyPartitionsDefinition)
    assert partitions.get_first_partition_key() == "2026-01-01-06:00"
    assert "on_cron(0 * * * *, UTC)" in str(asset.automation_conditions_by_key[asset.key])
    # One automation style: no per-table schedule; one sensor evaluates every condition.
    assert [s.name for s in defs.schedules] == ["maintain_tables_schedule"]
    automation = defs.resolve_sensor_def("incremental_assets_automation")
    assert isinstance(automation, dg.AutomationConditionSensorDefinition)
    assert {c.name for c in asset.check_specs} == {
        "keys_unique",
        "keys_not_null",
        "watermark_never_moves_backwards",
        "counts_match_table",
        "rows_reconciled",
        "schema_matches_spec",
        "watermark_in_range",
    }
    assert asset.metadata_by_key[asset.key]["keys"] == "order_id"


def test_a_catalog_target_is_shown_by_its_catalog_name(tmp_path):
    named = ORDERS_YAML.replace(
        "strategy: upsert", "strategy: upsert\n    target: {table: sales.orders}"
    )
    (tmp_path / "tables.yaml").write_text(named)
    defs = build_definitions(load_project(tmp_path / "tables.yaml"))

    metadata = defs.get_assets_def("orders").metadata_by_key[dg.AssetKey("orders")]
    assert metadata["dagster/table_name"] == "sales.orders"
    assert metadata["dagster/uri"] == str(tmp_path / "warehouse" / "orders")


HISTORY_YAML = """
warehouse:
  root: ./warehouse
tables:
  - name: orders
    source: {format: delta, path: ./source/orders}
    keys: [order_id]
    watermark: {column: updated_at, kind: timestamp}
    strategy: {kind: scd2, tracked: [status]}
    partitioning: {granularity: daily, start: 2026-01-01}
"""


def test_scd2_table_reports_versions_and_checks_keys_with_valid_from(tmp_path, spark, instance):
    project = Project(tmp_path, HISTORY_YAML)
    project.source.upsert([(1, "placed", 1.0, at(1, 5)), (2, "placed", 2.0, at(1, 6))])
    project.materialize(instance, "2026-01-01")
    project.source.upsert([(1, "paid", 1.0, at(2, 1)), (2, "placed", 2.5, at(2, 2))])

    result = project.materialize(instance, "2026-01-02")

    meta = metadata_of(result)
    assert (meta["versions_opened"], meta["versions_closed"]) == (1, 1)
    assert meta["versions_updated_in_place"] == 1
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["keys_unique"].passed
    assert checks["counts_match_table"].passed
    assert checks["history_consistent"].passed
    assert len(DeltaTable(project.target.path).to_pyarrow_table()) == 3


QUALITY_YAML = (
    ORDERS_YAML
    + """    quality:
      min_score: 0.9
      rules:
        - {name: amount_positive, check: "amount > 0", action: quarantine}
"""
)


def test_quality_score_below_minimum_fails_its_blocking_check_and_stops_downstream(
    tmp_path, spark, instance
):
    project = Project(tmp_path, QUALITY_YAML)
    project.source.upsert([(1, "placed", 1.0, at(1, 5)), (2, "placed", -2.0, at(1, 6))])
    downstream_ran = []

    @dg.asset(
        deps=[dg.AssetKey("orders")],
        partitions_def=project.defs.get_assets_def("orders").partitions_def,
    )
    def order_report() -> None:
        downstream_ran.append(True)

    result = dg.materialize(
        [project.defs.get_assets_def("orders"), order_report],
        partition_key="2026-01-01",
        instance=instance,
        resources=project.defs.resources,
        raise_on_error=False,
    )

    meta = metadata_of(result)
    assert (meta["quality_score"], meta["rows_quarantined"]) == (0.5, 1)
    assert meta["rows_failing_amount_positive"] == 1
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert not checks["quality_score"].passed
    assert "below the minimum 0.9" in checks["quality_score"].description
    assert downstream_ran == [] and not result.success


@pytest.mark.parametrize(("max_lag", "passed"), [("1h", False), ("3650d", True)])
def test_freshness_check_compares_the_watermark_lag_with_max_lag(
    tmp_path, spark, instance, max_lag, passed
):
    project = Project(tmp_path, ORDERS_YAML + f"    max_lag: {max_lag}\n")
    project.source.upsert([(1, "placed", 1.0, at(1, 5))])

    result = project.materialize(instance, "2026-01-01")

    check = next(
        e for e in result.get_asset_check_evaluations() if e.check_name == "watermark_fresh"
    )
    assert check.passed is passed
    assert result.success  # not blocking: a stale source is reported, the load still lands


def test_a_table_loads_its_latest_day_once_the_day_has_ended(tmp_path, instance):
    (tmp_path / "tables.yaml").write_text(ORDERS_YAML)
    defs = build_definitions(load_project(tmp_path / "tables.yaml"))

    def requested(when: datetime, cursor):
        result = dg.evaluate_automation_conditions(
            defs=defs, instance=instance, evaluation_time=when, cursor=cursor
        )
        partitions = set()
        for r in result.results:
            if isinstance(r.key, dg.AssetCheckKey):  # the late-rows check: not partitioned
                partitions |= {(r.key.to_user_string(), None)} if r.true_subset.size else set()
                continue
            keys = r.true_subset.expensively_compute_partition_keys()
            partitions |= {(r.key.to_user_string(), key) for key in keys}
        return partitions, result.cursor

    first, cursor = requested(datetime(2026, 1, 3, 12, tzinfo=UTC), None)
    at_midnight, cursor = requested(datetime(2026, 1, 4, 0, 5, tzinfo=UTC), cursor)
    later, cursor = requested(datetime(2026, 1, 4, 0, 10, tzinfo=UTC), cursor)
    half_past, cursor = requested(datetime(2026, 1, 4, 0, 31, tzinfo=UTC), cursor)

    assert first == set()  # no day has ended since the sensor started
    # The day that just ended; and the late-rows check, whose half-hourly ticks passed.
    assert at_midnight == {("orders", "2026-01-03"), ("orders:no_late_rows_waiting", None)}
    assert later == set()  # requested once per tick
    assert half_past == {("orders:no_late_rows_waiting", None)}  # hourly, at half past


def test_the_maintenance_job_compacts_to_the_tables_file_size(tmp_path, spark, instance):
    # Eight files of about 300 KB (rows of about 1 KB of random hex): compaction aims for
    # files of target.file_size, 1MiB here, so it packs them into bins of at most that;
    # at the default (about 128 MiB) it packs all eight into one file.
    (tmp_path / "tables.yaml").write_text(
        ORDERS_YAML.rstrip() + "\n    target: {file_size: 1MiB}\n"
    )
    spec = load_project(tmp_path / "tables.yaml")
    path = spec.target_path(spec.tables[0])
    notes = random.Random(5)
    for n in range(8):
        keys = pa.array(range(n * 300, (n + 1) * 300), pa.int64())
        wide = [notes.randbytes(500).hex() for _ in range(300)]
        write_deltalake(path, pa.table({"order_id": keys, "note": wide}), mode="append")

    result = (
        build_definitions(spec).get_job_def("maintain_tables").execute_in_process(instance=instance)
    )

    assert result.success
    table = DeltaTable(path)
    sizes = pa.table(table.get_add_actions(flatten=True))["size_bytes"].to_pylist()
    assert 2 <= len(sizes) < 8, sizes
    assert max(sizes) <= 1.05 * 2**20, sizes
    assert table.to_pyarrow_table().num_rows == 2400
