"""The row hash: a created table records how its rows were hashed, and a table created
before that was recorded keeps being hashed its own way (its stored hashes are compared
with new rows' ones: snapshot diffs, SCD2 versions, ties of the watermark)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField

from incremental_assets.engine import DeltaTarget, SchemaMismatchError, transforms
from incremental_assets.engine.load import run as run_module
from incremental_assets.engine.reload import differences
from incremental_assets.engine.transforms import ROW_HASH, ROW_HASH_VERSION
from incremental_assets_tests.builders import (
    PRODUCTS,
    DeltaSourceTable,
    ParquetFolder,
    at,
    cdc_history_spec,
    cdc_spec,
    feed,
    load,
    make_spec,
    products,
    snapshot_spec,
    table_of,
)


def _hashes(spark, rows: list[tuple], schema: str, version: int = 2) -> list[int]:
    df = spark.createDataFrame(rows, schema).transform(transforms.with_row_hash(version=version))
    return [r[ROW_HASH] for r in df.orderBy(F.monotonically_increasing_id()).collect()]


def test_nulls_in_different_columns_hash_apart_and_a_new_null_column_changes_nothing(spark):
    moved = _hashes(spark, [(1, "a", None), (1, None, "a")], "id long, x string, y string")
    assert moved[0] != moved[1]
    # A column added to the source is null in earlier rows: their hashes stay (as they did
    # with the JSON hash, which leaves out null fields).
    before = _hashes(spark, [(1, "a", 2.5)], "id long, x string, p double")
    after = _hashes(spark, [(1, "a", 2.5, None)], "id long, x string, p double, z string")
    assert before == after
    # A changed value changes the hash; nested values are hashed as their JSON.
    nested = "id long, tags array<string>, attrs map<string,string>"
    one, two = _hashes(spark, [(1, ["a", None], {"k": "v"}), (1, [None, "a"], {"k": "v"})], nested)
    assert one != two
    assert _hashes(spark, [(1, "a", 2.5)], "id long, x string, p double") != _hashes(
        spark, [(1, "a", 2.6)], "id long, x string, p double"
    )


@pytest.fixture
def source(tmp_path) -> DeltaSourceTable:
    return DeltaSourceTable(tmp_path / "source")


def _recorded(spark, target: DeltaTarget, kind: str = "timestamp") -> int:
    # As Spark reads the table's schema, and as a run reads it (delta-rs).
    seen = transforms.row_hash_version(spark.read.format("delta").load(target.path).schema.fields)
    assert seen == target.state(kind).row_hash
    return seen


def test_a_created_table_records_its_row_hash_and_unchanged_rows_stay_unchanged(
    spark, source, tmp_path
):
    spec = snapshot_spec(source.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.0), (3, "pad", 3.0)))
    load(spark, spec, target, 1)

    field = spark.read.format("delta").load(target.path).schema[ROW_HASH]
    assert field.metadata.get(ROW_HASH_VERSION) == transforms.LATEST_ROW_HASH == 2

    source.replace(products((1, "pen", 1.0), (2, "ink", 2.5), (3, "pad", 3.0)))
    second = load(spark, spec, target, 2)
    third = load(spark, spec, target, 3)

    assert second.changes == {"insert": 0, "change": 1, "vanish": 0}
    assert third.changes == {"insert": 0, "change": 0, "vanish": 0}
    assert _recorded(spark, target) == 2  # the merges kept the column's metadata
    assert differences(spark, spec, target) == (0, 0)


def test_a_table_hashed_as_json_before_keeps_its_hash(spark, source, tmp_path, monkeypatch):
    spec = snapshot_spec(source.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.0), (3, "pad", 3.0)))
    with monkeypatch.context() as patched:
        # As an earlier release created it: JSON hashes, no version recorded.
        earlier = run_module.strategy_for
        patched.setattr(run_module, "strategy_for", lambda spec, _row_hash: earlier(spec, 1))
        load(spark, spec, target, 1)
    assert _recorded(spark, target) == 1

    # Unchanged rows are seen unchanged: hashed the table's way, not the latest.
    unchanged = load(spark, spec, target, 2)
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.5), (3, "pad", 3.0)))
    changed = load(spark, spec, target, 3)

    assert unchanged.changes == {"insert": 0, "change": 0, "vanish": 0}
    assert changed.changes == {"insert": 0, "change": 1, "vanish": 0}
    assert _recorded(spark, target) == 1
    assert differences(spark, spec, target) == (0, 0)


def _feed_case(tmp_path, spec_of):
    folder = ParquetFolder(tmp_path / "feed")
    days = [
        feed((1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(1, 2)), (3, "c", "I", 3, at(1, 3))),
        feed((1, "a2", "U", 4, at(2, 1)), (2, None, "D", 5, at(2, 2)), (4, "d", "I", 6, at(2, 3))),
    ]
    return spec_of(folder.path), [lambda day=day: folder.drop(day) for day in days]


def _orders_case(tmp_path):
    source = DeltaSourceTable(tmp_path / "orders")
    days = [
        [(1, "new", 10.0, at(1, 1)), (2, "new", 20.0, at(1, 2))],
        [(1, "paid", 10.0, at(2, 1)), (3, "new", 30.0, at(2, 2))],
    ]
    return make_spec(source.path), [lambda day=day: source.upsert(day) for day in days]


CASES = {
    "upsert": _orders_case,
    "cdc hard": lambda tmp: _feed_case(tmp, lambda p: cdc_spec(p, deletes="hard")),
    "cdc soft": lambda tmp: _feed_case(tmp, lambda p: cdc_spec(p, deletes="soft")),
    "scd2 over cdc": lambda tmp: _feed_case(tmp, cdc_history_spec),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_strategy_creates_its_table_with_the_latest_row_hash_and_keeps_it(
    spark, tmp_path, case
):
    spec, deliveries = CASES[case](tmp_path)
    target = DeltaTarget(spec.name, str(tmp_path / "target"))
    for day, deliver in enumerate(deliveries, start=1):
        deliver()
        assert load(spark, spec, target, day).committed
        # The hash column's metadata survives the strategy's reshaping, staging and the
        # merges: a lost record would read as version 1 and every row as changed.
        assert _recorded(spark, target, spec.watermark.kind) == transforms.LATEST_ROW_HASH
    assert differences(spark, spec, target) == (0, 0)


def test_a_source_gaining_a_column_keeps_the_row_hash_and_its_unchanged_rows(
    spark, source, tmp_path
):
    spec = make_spec(
        source.path,
        keys=["id"],
        watermark=None,
        strategy={"kind": "snapshot"},
        on_schema_change="append_new_columns",
    )
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.0), (3, "pad", 3.0)))
    load(spark, spec, target, 1)

    # The new column is null in the rows that did not change: they hash as before.
    noted = PRODUCTS.append(pa.field("note", pa.string()))
    source.replace(
        table_of(noted, [(1, "pen", 1.0, None), (2, "ink", 2.0, "x"), (3, "pad", 3.0, None)])
    )
    result = load(spark, spec, target, 2)

    assert result.new_columns == ("note",)
    assert result.changes == {"insert": 0, "change": 1, "vanish": 0}
    assert _recorded(spark, target) == transforms.LATEST_ROW_HASH
    assert load(spark, spec, target, 3).changes == {"insert": 0, "change": 0, "vanish": 0}
    assert differences(spark, spec, target) == (0, 0)


def test_a_version_this_release_does_not_know_fails_saying_what_to_do():
    def fields(metadata: dict | None) -> list[StructField]:
        hashed = StructField(ROW_HASH, LongType(), metadata=metadata)
        return [StructField("id", LongType()), hashed]

    assert transforms.row_hash_version(fields({})) == 1
    assert transforms.row_hash_version(fields({ROW_HASH_VERSION: 2})) == 2
    assert transforms.row_hash_version(fields({ROW_HASH_VERSION: "2"})) == 2
    assert transforms.row_hash_version([StructField("id", LongType())]) == 2
    assert transforms.row_hash_version(None) == 2
    for recorded in (3, 0, "two"):
        with pytest.raises(SchemaMismatchError) as raised:
            transforms.row_hash_version(fields({ROW_HASH_VERSION: recorded}), "orders")
        text = str(raised.value)
        assert "table 'orders'" in text and repr(recorded) in text
        assert "versions 1 to 2" in text and "release that created it" in text
