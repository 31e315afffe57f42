"""Targets and Delta sources named in Spark's catalog, backed by a Hive metastore (the test
session's, embedded Derby in a temporary folder: conftest.py): the name and the location
end at one Delta table, and a name that is wrong is refused before anything is written."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.delta_lake.maintenance import MaintenanceSettings, maintain_table
from incremental_assets.engine.errors import CatalogTableError, TargetOwnedError
from incremental_assets.specs import SpecError, load_project
from incremental_assets_tests.builders import (
    DeltaSourceTable,
    at,
    load,
    make_spec,
    target_rows,
)


@pytest.fixture
def schema(spark) -> str:
    """A catalog schema of the test's own (the metastore lives as long as the session)."""
    name = f"sales_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE SCHEMA {name}")
    return name


def named_target(spec, path: Path) -> DeltaTarget:
    return DeltaTarget(spec.name, str(path), catalog_table=spec.target.table)


def test_named_target_and_named_delta_source_end_at_the_tables_at_their_locations(
    spark, schema, tmp_path
):
    source = DeltaSourceTable(tmp_path / "source")
    source.upsert([(1, "placed", 1.0, at(1, 5)), (2, "placed", 2.0, at(1, 6))])
    spark.sql(f"CREATE TABLE {schema}.src USING delta LOCATION '{source.path}'")
    spec = make_spec(
        "",
        source={"format": "delta", "path": None, "table": f"{schema}.src"},
        target={"table": f"{schema}.orders", "path": str(tmp_path / "orders")},
    )
    target = named_target(spec, tmp_path / "orders")

    load(spark, spec, target, 1)
    source.upsert([(2, "paid", 2.5, at(2, 1)), (3, "placed", 3.0, at(2, 2))])
    load(spark, spec, target, 2)
    again = load(spark, spec, target, 2)

    expected = [
        (1, "placed", 1.0, at(1, 5)),
        (2, "paid", 2.5, at(2, 1)),
        (3, "placed", 3.0, at(2, 2)),
    ]
    # delta-rs at the location and Spark by the name read the same table.
    assert target_rows(target) == expected
    by_name = spark.table(f"{schema}.orders").select("order_id", "status", "amount")
    assert sorted(tuple(r) for r in by_name.collect()) == [e[:3] for e in expected]
    detail = spark.sql(f"DESCRIBE DETAIL {schema}.orders").collect()[0]
    assert detail["location"] == f"file:{tmp_path / 'orders'}"
    kind = spark.sql(f"DESCRIBE TABLE EXTENDED {schema}.orders").filter("col_name = 'Type'")
    assert kind.collect()[0]["data_type"] == "EXTERNAL"
    # The re-run of day 2 committed nothing: exactly once through the name as by path.
    assert not again.committed
    assert DeltaTable(str(tmp_path / "orders")).version() == 1
    assert again.source.startswith(f"delta {schema}.src at ")
    # Maintenance by the name (OPTIMIZE, VACUUM) keeps the rows and removes the files the
    # merge replaced.
    settings = MaintenanceSettings(retention_hours=0, enforce_retention=False)
    [done] = maintain_table(spark, target, settings)
    assert target_rows(target) == expected
    assert done.stale_files_before > 0 and done.stale_files_after == 0


def test_a_catalog_table_the_loader_did_not_write_is_refused_and_nothing_is_written(
    spark, schema, tmp_path
):
    # Someone else's table (here with another schema) under the name and location the
    # spec gives: the loader only loads a Delta table it created itself (issue 23), so the
    # run is refused before any schema comparison, naming the location.
    source = DeltaSourceTable(tmp_path / "source")
    source.upsert([(1, "placed", 1.0, at(1, 5))])
    location = tmp_path / "orders"
    spark.sql(
        f"CREATE TABLE {schema}.orders (order_id BIGINT, status INT) USING delta "
        f"LOCATION '{location}'"
    )
    spec = make_spec(source.path, target={"table": f"{schema}.orders", "path": str(location)})

    with pytest.raises(TargetOwnedError) as info:
        load(spark, spec, named_target(spec, location), 1)

    message = str(info.value)
    assert f"the folder {location} holds a Delta table that table 'orders' did not write" in message
    assert "Nothing was written" in message
    assert DeltaTable(str(location)).version() == 0


def test_catalog_name_at_another_location_or_unknown_source_name_fails_naming_it(
    spark, schema, tmp_path
):
    source = DeltaSourceTable(tmp_path / "source")
    source.upsert([(1, "placed", 1.0, at(1, 5))])
    spark.sql(f"CREATE TABLE {schema}.elsewhere USING delta LOCATION '{source.path}'")
    spec = make_spec(source.path, target={"table": f"{schema}.elsewhere"})
    location = tmp_path / "orders"

    with pytest.raises(CatalogTableError) as info:
        load(spark, spec, named_target(spec, location), 1)

    assert f"target.table '{schema}.elsewhere' exists in the catalog at" in str(info.value)
    assert info.value.fix.startswith(f"set target.path to {source.path}")
    assert not location.exists()

    unknown = make_spec("", source={"path": None, "table": f"{schema}.nope"})
    with pytest.raises(CatalogTableError) as info:
        load(spark, unknown, DeltaTarget("orders", str(location)), 1)
    assert f"source.table '{schema}.nope' does not resolve in Spark's catalog" in str(info.value)
    assert not location.exists()


CATALOG_YAML = """
warehouse:
  root: ./warehouse
tables:
  - name: orders
    source: {{format: delta, table: sales.orders_src}}
    keys: [order_id]
    watermark: {{column: updated_at, kind: timestamp}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
    target: {{table: {first}}}
  - name: orders_copy
    source: {{format: delta, path: ./source}}
    keys: [order_id]
    watermark: {{column: updated_at, kind: timestamp}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
    target: {{table: {second}}}
"""


def spec_problems(tmp_path: Path, first: str, second: str) -> list[tuple]:
    (tmp_path / "tables.yaml").write_text(CATALOG_YAML.format(first=first, second=second))
    with pytest.raises(SpecError) as info:
        load_project(tmp_path / "tables.yaml")
    return info.value.problems


def test_spec_refuses_two_tables_naming_one_catalog_table_and_names_that_are_not_names(
    tmp_path,
):
    # One table however spelled: case, the session catalog's prefix.
    spelled = "Spark_Catalog.SALES.orders"
    [(table, field, message)] = spec_problems(tmp_path, "sales.orders", spelled)
    assert (table, field) == ("orders_copy", "target.table")
    assert "the target of table 'orders'" in message

    problems = spec_problems(tmp_path, "sales.orders; DROP TABLE x", "a.b.c.d")
    assert [(t, f) for t, f, _ in problems] == [
        ("orders", "target.table"),
        ("orders_copy", "target.table"),
    ]
    assert "is not a catalog table name" in problems[0][2]
    # A bare name is in the default schema: the same table as default.orders.
    [(table, field, _)] = spec_problems(tmp_path, "orders", "default.orders")
    assert (table, field) == ("orders_copy", "target.table")


def test_a_delta_source_is_a_path_or_a_catalog_table_not_both():
    with pytest.raises(ValueError, match=r"source\.path .* or source\.table"):
        make_spec("", source={"path": None})
    with pytest.raises(ValueError, match="not both"):
        make_spec("/data/orders", source={"table": "sales.orders"})
    with pytest.raises(ValueError, match="is not a catalog table name"):
        make_spec("", source={"path": None, "table": 'sales."Order Lines"'})
