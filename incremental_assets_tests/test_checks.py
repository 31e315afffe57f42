"""Engine checks behind the asset checks, on real Delta tables."""

from __future__ import annotations

from deltalake import DeltaTable, write_deltalake

from incremental_assets.engine import checks
from incremental_assets_tests.conftest import at, load, make_spec


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
