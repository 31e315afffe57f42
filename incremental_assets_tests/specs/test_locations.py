"""No two tables share storage: targets and side tables are compared in one normal form
when the specs load, and a Delta target holding another table's loads is refused at run
time with nothing written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.errors import TargetOwnedError
from incremental_assets.specs.loader import SpecError, parse_project
from incremental_assets.specs.locations import normal_location, same_location
from incremental_assets_tests.builders import DeltaSourceTable, at, load, make_spec, target_rows


def table(name: str, target: str | None = None, **extra: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": name,
        "source": {"format": "delta", "path": f"./source/{name}"},
        "keys": ["order_id"],
        "watermark": {"column": "updated_at", "kind": "timestamp"},
        "strategy": "upsert",
        "partitioning": {"granularity": "daily", "start": "2026-01-01"},
        **extra,
    }
    if target is not None:
        raw["target"] = {"path": target}
    return raw


def problems_of(tmp_path: Path, *tables: dict[str, Any]) -> list[tuple[str | None, str, str]]:
    raw = {"warehouse": {"root": "./warehouse"}, "tables": list(tables)}
    with pytest.raises(SpecError) as info:
        parse_project(raw, source="tables.yaml", base_dir=tmp_path)
    return info.value.problems


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("./warehouse/shared", "./warehouse/shared/"),
        ("./warehouse/shared", "warehouse/./shared"),
        ("./warehouse/shared", "./warehouse/other/../shared"),
        ("s3://bucket/wh/shared", "s3a://bucket/wh//shared/"),
        ("abfss://lake@acct.dfs.core.windows.net/wh/t", "az://lake@acct/wh/t"),
    ],
    ids=["trailing-slash", "dot-segment", "dot-dot", "s3a-and-s3", "abfss-and-az"],
)
def test_two_targets_spelled_differently_are_refused_naming_both_tables(tmp_path, first, second):
    problems = problems_of(tmp_path, table("orders", first), table("orders_copy", second))

    assert len(problems) == 1
    name, field, message = problems[0]
    assert (name, field) == ("orders_copy", "target.path")
    assert "same Delta table as table 'orders'" in message
    assert "change target.path" in message


def test_a_symlink_to_another_tables_target_is_the_same_location(tmp_path):
    (tmp_path / "warehouse" / "real").mkdir(parents=True)
    os.symlink(tmp_path / "warehouse" / "real", tmp_path / "alias")

    problems = problems_of(
        tmp_path, table("orders", "./warehouse/real"), table("orders_copy", "./alias")
    )

    assert [(p[0], p[1]) for p in problems] == [("orders_copy", "target.path")]


def test_a_table_named_like_another_tables_side_table_is_refused(tmp_path):
    problems = problems_of(tmp_path, table("orders"), table("orders__quarantine"))

    fields = {(name, field) for name, field, _ in problems}
    assert ("orders__quarantine", "name") in fields
    message = next(m for n, f, m in problems if f == "name")
    assert "'__quarantine'" in message
    assert "reserves" in message


def test_a_table_named_like_a_streaming_layers_checkpoint_folder_is_refused(tmp_path):
    problems = problems_of(tmp_path, table("totals__Checkpoint"))

    assert [(n, f) for n, f, _ in problems] == [("totals__Checkpoint", "name")]
    assert "'__checkpoint'" in problems[0][2]


@pytest.mark.parametrize("suffix", ["tombstones", "changes", "quarantine", "files"])
def test_a_target_at_another_tables_side_table_is_refused(tmp_path, suffix):
    problems = problems_of(
        tmp_path, table("orders"), table("audit", f"./warehouse/orders__{suffix}")
    )

    assert len(problems) == 1
    name, field, message = problems[0]
    assert name == "audit"
    assert field == "target.path"
    assert f"the __{suffix} side table of table 'orders'" in message


def test_a_target_inside_another_target_is_refused(tmp_path):
    problems = problems_of(
        tmp_path, table("orders"), table("order_lines", "./warehouse/orders/lines")
    )

    assert len(problems) == 1
    assert problems[0][:2] == ("order_lines", "target.path")
    assert "lies inside the target of table 'orders'" in problems[0][2]


def test_distinct_targets_and_a_shared_source_load(tmp_path):
    raw = {
        "warehouse": {"root": "./warehouse"},
        "tables": [
            table("orders"),
            # Reading another table's source (or target) is fine: only writes must not meet.
            {**table("orders_history"), "source": {"format": "delta", "path": "./source/orders"}},
            table("orders_2", "./warehouse/orders_2"),
        ],
    }
    project = parse_project(raw, source="tables.yaml", base_dir=tmp_path)

    assert [t.name for t in project.tables] == ["orders", "orders_history", "orders_2"]


def test_normal_location_keeps_distinct_places_apart():
    assert not same_location("s3://bucket/a", "s3://other/a")
    assert not same_location("/data/orders", "/data/orders_2")
    assert normal_location("S3A://Bucket/wh/x/") == "s3://bucket/wh/x"


def test_a_target_holding_another_tables_loads_is_refused_and_left_unchanged(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source")
    source.upsert([(1, "new", 10.0, at(1, 1))])
    path = str(tmp_path / "warehouse" / "orders")
    assert load(spark, make_spec(source.path), DeltaTarget("orders", path), 1).committed
    before = DeltaTarget("orders", path).state("timestamp").version
    source.upsert([(2, "new", 20.0, at(1, 2))])

    renamed = make_spec(source.path, name="orders_copy")
    with pytest.raises(TargetOwnedError) as info:
        load(spark, renamed, DeltaTarget("orders_copy", path), 1)

    message = str(info.value)
    assert "table 'orders_copy'" in message
    assert "holds the loads of table 'orders'" in message
    assert "target.path" in message
    owner = DeltaTarget("orders", path)
    assert owner.state("timestamp").version == before
    assert [r[0] for r in target_rows(owner)] == [1]


@pytest.mark.parametrize(
    ("where", "field"),
    [("target", "target.path"), ("source", "source.path"), ("warehouse", "warehouse.root")],
)
def test_an_azure_uri_without_its_account_is_refused_naming_the_field_and_the_form(
    tmp_path, where, field
):
    # delta-rs would take the account from storage options; Spark's connector cannot, and
    # would fail the first read with "No FileSystem for scheme az".
    uri = "az://lake/wh/orders"
    raw = table("orders", uri if where == "target" else None)
    if where == "source":
        raw["source"]["path"] = uri
    project = {"warehouse": {"root": uri if where == "warehouse" else "./warehouse"}}

    with pytest.raises(SpecError) as info:
        parse_project({**project, "tables": [raw]}, source="tables.yaml", base_dir=tmp_path)

    text = str(info.value)
    assert field in text
    assert "names no storage account" in text
    assert "az://lake@<account>.blob.core.windows.net/<path>" in text
    # With its account it loads.
    good = "az://lake@acct.blob.core.windows.net/wh/orders"
    raw = table("orders", good)
    raw = {"warehouse": {"root": "./warehouse"}, "tables": [raw]}
    parse_project(raw, source="tables.yaml", base_dir=tmp_path)


def test_an_azure_landing_folder_needs_its_account_only_where_spark_reads_it_in_place(tmp_path):
    # Into a local warehouse delta-rs copies the new files first, finding the account in
    # the storage options; into an object-store warehouse Spark reads them in place.
    landing = {
        "name": "invoices_bronze",
        "source": {
            "format": "json",
            "path": "az://landing/invoices",
            "schema": "id BIGINT",
            "landing": {},
        },
        "partitioning": {"granularity": "daily", "start": "2026-01-01"},
    }
    local = {"warehouse": {"root": "./warehouse"}, "tables": [landing]}
    parse_project(local, source="tables.yaml", base_dir=tmp_path)

    remote = {"warehouse": {"root": "s3://lake/wh"}, "tables": [landing]}
    with pytest.raises(SpecError) as info:
        parse_project(remote, source="tables.yaml", base_dir=tmp_path)
    text = str(info.value)
    assert "invoices_bronze" in text and "source.path" in text
    assert "az://landing@<account>.blob.core.windows.net/<path>" in text
