"""Engine checks behind the asset checks, on real Delta tables."""

from __future__ import annotations

from deltalake import DeltaTable, write_deltalake

from incremental_assets.engine import checks
from incremental_assets_tests.builders import (
    DeltaSourceTable,
    ParquetFolder,
    Project,
    at,
    cdc_spec,
    feed,
    load,
    make_spec,
    products,
    snapshot_spec,
)


def test_duplicate_check_scoped_to_a_commit_reads_only_files_that_can_hold_its_keys(
    spark, orders_source, target
):
    spec = make_spec(orders_source.path)
    orders_source.upsert([(i, "placed", 1.0, at(1, 1)) for i in range(1, 101)])
    load(spark, spec, target, 1)
    orders_source.upsert([(i, "placed", 1.0, at(2, 1)) for i in range(1001, 1101)])
    load(spark, spec, target, 2)
    # A foreign writer appends a second copy of order 5 (the first load's key range).
    copy = DeltaTable(target.path).to_pyarrow_table(filters=[("order_id", "=", 5)])
    write_deltalake(target.path, copy, mode="append")
    foreign = DeltaTable(target.path).version()

    scoped = checks.keys_unique(spark, target, spec.keys, written_by=foreign)
    second_load = checks.keys_unique(spark, target, spec.keys, written_by=foreign - 1)
    full = checks.keys_unique(spark, target, spec.keys)

    assert not scoped.passed and scoped.metadata["duplicate_keys"] == 1
    assert "(5,)" in scoped.metadata["sample"]
    assert scoped.metadata["scope"].startswith("2 of 3 files")
    # Keys 1001..1100 (the second load) are unique, and their files hold no order 5.
    assert second_load.passed and second_load.metadata["scope"].startswith("1 of 3 files")
    assert not full.passed and full.metadata["scope"] == "all 3 files"


def test_counts_check_fails_when_reported_counts_disagree_with_the_commit(
    spark, orders_source, target
):
    spec = make_spec(orders_source.path)
    orders_source.upsert([(i, "placed", 1.0, at(1, 1)) for i in range(1, 11)])
    load(spark, spec, target, 1)
    orders_source.upsert([(1, "paid", 1.0, at(1, 2)), (11, "placed", 1.0, at(1, 2))])
    result = load(spark, spec, target, 1)

    honest = checks.counts_match_table(target, result.delta_version, 1, 1, 0)
    inflated = checks.counts_match_table(target, result.delta_version, 2, 1, 0)

    assert honest.passed, honest.description
    assert (honest.metadata["rows_before"], honest.metadata["rows_after"]) == (10, 11)
    assert not inflated.passed
    assert "inserted: run reports 2, Delta log says 1" in inflated.description


def test_history_check_finds_overlapping_versions_and_a_second_current_row(spark, tmp_path):
    import pyarrow as pa

    from incremental_assets.engine import DeltaTarget

    def versions(*rows):
        names = ("id", "valid_from", "valid_to", "is_current")
        schema = pa.schema(
            [
                ("id", pa.int64()),
                ("valid_from", pa.timestamp("us", tz="UTC")),
                ("valid_to", pa.timestamp("us", tz="UTC")),
                ("is_current", pa.bool_()),
            ]
        )
        return pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows], schema)

    good = DeltaTarget("good", str(tmp_path / "good"))
    write_deltalake(
        good.path,
        versions((1, at(1), at(2), False), (1, at(2), None, True), (2, at(1), at(3), False)),
    )
    bad = DeltaTarget("bad", str(tmp_path / "bad"))
    write_deltalake(
        bad.path,
        versions(
            (1, at(1), at(3), False),  # overlaps the next version
            (1, at(2), None, True),
            (2, at(1), None, True),  # two open versions of key 2
            (2, at(2), None, True),
            (3, at(1), None, False),  # open but not current
        ),
    )
    args = (["id"], "valid_from", "valid_to", "is_current")

    assert checks.history_consistent(spark, good, *args).passed
    outcome = checks.history_consistent(spark, bad, *args)
    assert not outcome.passed and outcome.metadata["inconsistent_keys"] == 3


# --- keys_not_null, rows_reconciled, schema_matches_spec ---------------------------------


def test_null_key_check_reads_the_log_and_counts_only_files_without_statistics(
    spark, orders_source, target, tmp_path
):
    import pyarrow as pa

    from incremental_assets.engine import DeltaTarget

    spec = make_spec(orders_source.path)
    orders_source.upsert([(i, "placed", 1.0, at(1, 1)) for i in range(1, 21)])
    load(spark, spec, target, 1)
    loaded = checks.keys_not_null(spark, target, spec.keys)

    foreign = DeltaTarget("foreign", str(tmp_path / "foreign"))
    ids = pa.table({"order_id": pa.array([1, None, 3], pa.int64()), "note": ["a", "b", "c"]})
    # A first file written without column statistics, then one with them.
    write_deltalake(foreign.path, ids, configuration={"delta.dataSkippingNumIndexedCols": "0"})
    DeltaTable(foreign.path).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": "32"})
    more = pa.table({"order_id": pa.array([None, None, 6], pa.int64()), "note": ["d", "e", "f"]})
    write_deltalake(foreign.path, more, mode="append")
    mixed = checks.keys_not_null(spark, foreign, ["order_id"])

    assert loaded.passed, loaded.description
    assert loaded.metadata["null_order_id"] == 0
    assert loaded.metadata["files_counted_by_spark"] == 0
    assert not mixed.passed
    assert mixed.metadata["null_order_id"] == 3
    assert (mixed.metadata["files_from_statistics"], mixed.metadata["files_counted_by_spark"]) == (
        1,
        1,
    )
    assert "order_id: 3" in mixed.description


def test_row_reconciliation_fails_when_the_counts_of_a_load_do_not_add_up(
    spark, orders_source, target
):
    from dataclasses import replace

    spec = make_spec(
        orders_source.path,
        quality={"rules": [{"name": "paid", "check": "amount > 0", "action": "quarantine"}]},
    )
    orders_source.upsert([(i, "placed", 1.0, at(1, 1)) for i in range(1, 11)])
    load(spark, spec, target, 1)
    orders_source.upsert(
        [(1, "paid", 1.0, at(1, 2)), (2, "placed", 1.0, at(1, 1)), (11, "placed", -1.0, at(1, 2))]
    )
    result = load(spark, spec, target, 1)  # lookback 0: reads the three rows above 01:00
    honest = checks.rows_reconciled(spec, result)

    inflated = checks.rows_reconciled(spec, replace(result, rows_inserted=5))
    lost = checks.rows_reconciled(spec, replace(result, rows_extracted=1))
    deleting = checks.rows_reconciled(spec, replace(result, rows_deleted=1, rows_updated=0))

    assert honest.passed, honest.description
    assert honest.description == (
        "extracted 2 = inserted 0 + updated 1 + unchanged 0 + superseded 0 + quarantined 1"
    )
    assert not inflated.passed and "the merge wrote 6 rows from 1 staged rows" in (
        inflated.description
    )
    assert not lost.passed and "exceed the 1 extracted" in lost.description
    assert not deleting.passed and "1 rows deleted, which upsert loads never do" in (
        deleting.description
    )


def test_row_reconciliation_passes_real_loads_of_every_strategy(spark, tmp_path):
    from incremental_assets.engine import DeltaTarget

    outcomes = {}

    def reconcile(name, spec, source_steps):
        target = DeltaTarget(name, str(tmp_path / "warehouse" / name))
        for day, step in enumerate(source_steps, start=1):
            step()
            outcome = checks.rows_reconciled(spec, load(spark, spec, target, day))
            assert outcome.passed, f"{name} day {day}: {outcome.description}"
            outcomes[(name, day)] = outcome.description

    first = [(i, "placed", 1.0, at(1, i)) for i in range(1, 5)]
    second = [(1, "paid", 1.0, at(2, 1)), (5, "placed", 1.0, at(2, 2))]
    for kind in ("upsert", "append"):
        orders = DeltaSourceTable(tmp_path / f"orders_{kind}")
        spec = make_spec(orders.path, strategy=kind, watermark={"lookback": "1d"})
        reconcile(kind, spec, [lambda o=orders: o.upsert(first), lambda o=orders: o.upsert(second)])

    for deletes in ("hard", "soft"):
        folder = ParquetFolder(tmp_path / f"feed_{deletes}")
        spec = cdc_spec(folder.path, deletes=deletes)
        reconcile(
            f"cdc_{deletes}",
            spec,
            [
                lambda f=folder: f.drop(
                    feed(
                        (1, "a", "I", 1, at(1, 1)),
                        (1, "a2", "U", 2, at(1, 2)),  # supersedes lsn 1 in the batch
                        (2, "b", "I", 3, at(1, 3)),
                        (3, "c", "I", 4, at(1, 3)),
                    )
                ),
                lambda f=folder: f.drop(
                    feed(
                        (2, None, "D", 5, at(2, 1)),
                        (4, None, "D", 6, at(2, 1)),  # a delete of a key never loaded
                        (3, "c", "U", 4, at(1, 3)),  # a replayed change
                    )
                ),
            ],
        )

    snapshots = DeltaSourceTable(tmp_path / "products")
    reconcile(
        "snapshot",
        snapshot_spec(snapshots.path),
        [
            lambda: snapshots.replace(products((1, "pen", 1.0), (2, "ink", 2.0), (3, "pad", 3.0))),
            lambda: snapshots.replace(products((1, "pen", 1.0), (2, "ink", 2.5), (4, "box", 4.0))),
        ],
    )

    history = DeltaSourceTable(tmp_path / "history")
    reconcile(
        "scd2",
        make_spec(history.path, strategy="scd2", watermark={"lookback": "1d"}),
        [
            lambda: history.upsert(first),
            lambda: history.upsert(second),
        ],
    )

    assert outcomes[("snapshot", 2)] == (
        "extracted 3 = 1 new + 1 changed + 1 unchanged; written 1 inserted + 1 updated + "
        "1 deleted = 1 new + 1 changed + 1 vanished"
    )
    assert outcomes[("cdc_hard", 1)] == (
        "extracted 4 = inserted 3 + updated 0 + deleted 0 + unchanged 0 + superseded 1 + "
        "quarantined 0"
    )
    # Day 2's file is new, so its replayed change (lsn 4, at the cursor) is read as a late
    # row: extracted and left unchanged.
    assert outcomes[("cdc_hard", 2)].startswith(
        "extracted 3 = inserted 0 + updated 0 + deleted 1 + unchanged 2"
    )
    assert outcomes[("append", 2)].startswith("extracted 5 = inserted 1 + updated 0 + unchanged 4")
    # Day 2 re-reads day 1 (lookback 1d): the re-read events are in the change log already.
    assert outcomes[("scd2", 2)].startswith("extracted 5 = 2 new events + 3 already logged")


def test_schema_check_reports_missing_retyped_and_undeclared_columns(spark, orders_source, target):
    import pyarrow as pa

    from incremental_assets.engine import DeltaTarget

    spec = make_spec(orders_source.path)
    orders_source.upsert([(1, "placed", 1.0, at(1, 1))])
    load(spark, spec, target, 1)
    loaded = checks.schema_matches_spec(target, spec)

    ddl = "order_id BIGINT, status STRING, amount DOUBLE, updated_at TIMESTAMP_NTZ"
    declared = make_spec(orders_source.path, source={"format": "csv", "schema": ddl})
    drifted = DeltaTarget("drifted", orders_source.path + "_drifted")
    table = pa.table(
        {
            "order_id": pa.array([1], pa.int32()),  # narrower than declared
            "status": ["placed"],
            "updated_at": pa.array(["2026-01-01"]),  # text, not a timestamp
            "_ia_row_hash": pa.array([1], pa.int64()),
            "coupon": ["x"],  # not declared
        }
    )
    write_deltalake(drifted.path, table)
    strict = checks.schema_matches_spec(drifted, declared)
    widened = DeltaTarget("widened", orders_source.path + "_widened")
    write_deltalake(
        widened.path,
        DeltaTable(target.path).to_pyarrow_table().append_column("coupon", pa.array(["x"])),
    )
    lenient = make_spec(
        orders_source.path,
        source={"format": "csv", "schema": ddl},
        on_schema_change="append_new_columns",
    )
    warned = checks.schema_matches_spec(widened, lenient)
    failed = checks.schema_matches_spec(widened, declared)

    assert loaded.passed, loaded.description
    assert loaded.description.startswith("3 columns the spec names are present")
    assert not strict.passed
    assert strict.metadata["missing_columns"] == "amount (source.schema)"
    assert strict.metadata["retyped_columns"] == (
        "order_id: int, expected bigint, updated_at: string, expected timestamp_ntz"
    )
    assert strict.metadata["unexpected_columns"] == "coupon"
    assert warned.passed and "warning: columns the spec does not declare: coupon" in (
        warned.description
    )
    assert not failed.passed and "coupon (on_schema_change: fail)" in failed.description


def test_schema_check_knows_the_columns_a_landing_table_adds(spark, tmp_path):
    import pyarrow as pa

    from incremental_assets.engine import DeltaTarget

    spec = make_spec(
        str(tmp_path / "landing"),
        keys=None,
        watermark=None,
        strategy="append",
        source={"format": "json", "schema": "InvoiceNumber STRING, Total DOUBLE", "landing": {}},
    )
    bronze = DeltaTarget("bronze", str(tmp_path / "bronze"))
    row = {
        "_ia_source_file": "a.json",
        "_ia_file_version": "10-1",
        "_ia_file_row": 1,
        "_ia_ingested_at": at(1),
        "InvoiceNumber": "A1",
        "Total": 1.0,
    }
    write_deltalake(bronze.path, pa.Table.from_pylist([row]))

    outcome = checks.schema_matches_spec(bronze, spec)

    assert outcome.passed, outcome.description
    assert outcome.metadata["unexpected_columns"] == ""


def test_new_checks_run_on_every_materialization(tmp_path, spark):
    import dagster as dg

    project = Project(tmp_path)
    project.source.upsert([(1, "placed", 1.0, at(1, 5)), (2, "placed", 2.0, at(1, 6))])
    with dg.instance_for_test() as instance:
        result = project.materialize(instance, "2026-01-01")
    evaluations = {c.check_name: c for c in result.get_asset_check_evaluations()}

    for name in ("keys_not_null", "rows_reconciled", "schema_matches_spec"):
        assert evaluations[name].passed, evaluations[name].description
    assert evaluations["keys_not_null"].metadata["null_order_id"].value == 0
    specs = {c.name: c for c in project.defs.get_assets_def("orders").check_specs}
    assert specs["keys_not_null"].blocking
    assert not specs["rows_reconciled"].blocking and not specs["schema_matches_spec"].blocking
    assert specs["rows_reconciled"].description.startswith(
        "Rows extracted = inserted + updated + unchanged + superseded + quarantined"
    )
    assert evaluations["rows_reconciled"].metadata["equation"].value == (
        "extracted 2 = inserted 2 + updated 0 + unchanged 0 + superseded 0 + quarantined 0"
    )
