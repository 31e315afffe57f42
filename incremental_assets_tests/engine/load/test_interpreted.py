"""A small run runs Spark interpreted (engine/load/interpreted.py): from its probe's first
read of the source to its end, without code generation, and the session's settings are as
before once it ends (a landing run's too); a run over more than ``interpreted.BELOW``
bytes of source and target files keeps code generation, and so does a session that sets
it itself. The suite's own session runs interpreted (servers.INTERPRETED): these tests
take those settings away for their runs, so the engine's choice is what they see."""

from __future__ import annotations

import pytest

from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.landing import load_landing
from incremental_assets.engine.load import interpreted
from incremental_assets.engine.reload import differences
from incremental_assets.engine.spark import runtime_conf
from incremental_assets_tests.builders import (
    NOW,
    ParquetFolder,
    at,
    drop,
    invoice,
    landing_spec,
    load,
    make_spec,
    order_rows,
)
from incremental_assets_tests.servers import INTERPRETED

KEYS = list(interpreted.SETTINGS)


@pytest.fixture
def unset(spark):
    """The suite's interpreted settings taken away for the test, put back after it."""
    settings = runtime_conf.get_many(spark, INTERPRETED)
    runtime_conf.unset_many(spark, INTERPRETED)
    yield
    runtime_conf.restore(spark, settings)


def seen_during(spark):
    """A run's hook that records the session's settings of ``KEYS`` as the run passes each
    phase after its probe."""
    seen = {}

    def hook(phase: str) -> None:
        seen[phase] = runtime_conf.get_many(spark, KEYS)

    return seen, hook


def loaded_twice(spark, spec, target, source_rows):
    """Day 1 loaded (the table created), then day 2 merged with the hook; its result and
    what the hook saw."""
    source_rows(1, [(i, "placed", 1.0, at(1, 10)) for i in range(1, 21)])
    load(spark, spec, target, 1)
    source_rows(2, [(1, "paid", 2.0, at(2, 9)), (30, "placed", 1.0, at(2, 11))])
    seen, hook = seen_during(spark)
    result = load(spark, spec, target, 2, hook=hook)
    assert result.committed and (result.rows_inserted, result.rows_updated) == (1, 1)
    assert differences(spark, spec, target) == (0, 0)
    return result, seen


@pytest.fixture(params=["delta", "parquet folder"])
def source(request, tmp_path, orders_source):
    """(spec, a way to add a day's rows) on a Delta table or a folder of Parquet files."""
    if request.param == "delta":
        return make_spec(orders_source.path), lambda _day, rows: orders_source.upsert(rows)
    folder = ParquetFolder(tmp_path / "orders_files")
    spec = make_spec(str(folder.path), source={"format": "parquet", "path": str(folder.path)})
    return spec, lambda _day, rows: folder.drop(order_rows(rows))


def test_a_small_run_runs_interpreted_and_leaves_the_session_as_it_was(
    spark, unset, source, target
):
    spec, add = source

    result, seen = loaded_twice(spark, spec, target, add)

    # A few kilobytes of source and target files: interpreted through every phase.
    interpreted_settings = dict(interpreted.SETTINGS)
    assert seen == {p: interpreted_settings for p in ("probed", "staged", "committed")}
    assert result.interpreted
    assert runtime_conf.get_many(spark, KEYS) == dict.fromkeys(KEYS)


def test_a_run_over_more_bytes_than_the_bound_keeps_code_generation(
    spark, unset, orders_source, target, monkeypatch
):
    # The bound below the source's and target's few kilobytes.
    monkeypatch.setattr(interpreted, "BELOW", 1024)

    result, seen = loaded_twice(
        spark, make_spec(orders_source.path), target, lambda _day, rows: orders_source.upsert(rows)
    )

    assert seen == {p: dict.fromkeys(KEYS) for p in ("probed", "staged", "committed")}
    assert not result.interpreted


@pytest.mark.parametrize("own", ["true", "false"])
def test_a_session_that_sets_code_generation_itself_keeps_its_choice(
    spark, unset, orders_source, target, own
):
    runtime_conf.set_many(spark, {"spark.sql.codegen.wholeStage": own})
    try:
        result, seen = loaded_twice(
            spark,
            make_spec(orders_source.path),
            target,
            lambda _day, rows: orders_source.upsert(rows),
        )
        after = runtime_conf.get_many(spark, KEYS)
    finally:
        runtime_conf.unset_many(spark, ["spark.sql.codegen.wholeStage"])

    # Its setting untouched, the other key not added; the metadata says what ran.
    expected = {"spark.sql.codegen.wholeStage": own, "spark.sql.codegen.factoryMode": None}
    assert seen == {p: expected for p in ("probed", "staged", "committed")}
    assert result.interpreted is (own == "false")
    assert after == expected


class Stop(Exception):
    pass


def test_a_run_that_fails_leaves_the_session_as_it_was(spark, unset, orders_source, target):
    spec = make_spec(orders_source.path)
    orders_source.upsert([(1, "placed", 1.0, at(1, 10))])
    seen = {}

    def hook(phase: str) -> None:
        seen[phase] = runtime_conf.get_many(spark, KEYS)
        if phase == "staged":
            raise Stop("the run fails after staging its increment")

    with pytest.raises(Stop):
        load(spark, spec, target, 1, hook=hook)

    assert seen == {p: dict(interpreted.SETTINGS) for p in ("probed", "staged")}
    assert runtime_conf.get_many(spark, KEYS) == dict.fromkeys(KEYS)
    assert not target.exists()  # nothing committed


@pytest.mark.parametrize(("below", "expected"), [(interpreted.BELOW, True), (1024, False)])
def test_a_landing_run_over_few_bytes_runs_interpreted(
    spark, unset, tmp_path, monkeypatch, below, expected
):
    # New files and bronze of a few kilobytes: interpreted; with the bound under them, not.
    monkeypatch.setattr(interpreted, "BELOW", below)
    folder = tmp_path / "landing"
    folder.mkdir()
    spec = landing_spec(folder)
    bronze = DeltaTarget("invoices_bronze", str(tmp_path / "warehouse" / "invoices_bronze"))
    drop(folder, "a.json", [invoice(1), invoice(2)])
    load_landing(spark, spec, bronze, now=NOW)
    drop(folder, "b.json", [invoice(3)])

    second = load_landing(spark, spec, bronze, now=NOW)

    assert second.commit.rows_inserted == 1
    assert second.interpreted is expected
    assert runtime_conf.get_many(spark, KEYS) == dict.fromkeys(KEYS)
