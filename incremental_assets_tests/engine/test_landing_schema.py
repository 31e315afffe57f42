"""Schema evolution of landing files: a new column is added to bronze and silver (earlier
rows null) or fails the run, per on_schema_change; a changed type always fails the run
and commits nothing, naming the file, the column and both types."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import SchemaMismatchError
from incremental_assets.engine.landing import FileIndex, load_landing
from incremental_assets.specs import TableSpec
from incremental_assets_tests.builders import NOW, OLD, InvoiceLayers, drop, invoice, landing_spec


def later() -> datetime:
    """A clock past the settle time of files written just now."""
    return datetime.now(timezone.utc) + timedelta(minutes=5)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "landing" / "invoices"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def bronze(tmp_path: Path) -> DeltaTarget:
    return DeltaTarget("invoices_bronze", str(tmp_path / "warehouse" / "invoices_bronze"))


def evolving_spec(folder: Path) -> TableSpec:
    return landing_spec(folder).model_copy(update={"on_schema_change": "append_new_columns"})


def targets(spark, tmp_path: Path, spec: TableSpec) -> InvoiceLayers:
    """Bronze, and silver and gold as the project's tables.yaml declares them."""
    return InvoiceLayers(spark, tmp_path / "warehouse", spec)


def with_loyalty(number: int, points: int) -> dict:
    return {**invoice(number), "LoyaltyPoints": points}


def test_a_new_json_field_is_added_to_bronze_and_silver_with_earlier_rows_null(
    spark, folder, tmp_path
):
    spec = evolving_spec(folder)
    layers = targets(spark, tmp_path, spec)
    bronze, silver = layers.bronze, layers.silver_target
    drop(folder, "a.json", [invoice(1)])
    load_landing(spark, spec, bronze, now=NOW)
    layers.silver()
    layers.gold()

    drop(folder, "b.json", [with_loyalty(2, 40)])
    report = load_landing(spark, spec, bronze, now=NOW)
    assert [Path(f.path).name for f in report.files_loaded] == ["b.json"]
    rows = DeltaTable(bronze.path).to_pyarrow_table(columns=["InvoiceNumber", "LoyaltyPoints"])
    assert sorted(rows.to_pylist(), key=lambda r: r["InvoiceNumber"]) == [
        {"InvoiceNumber": "INV1", "LoyaltyPoints": None},
        {"InvoiceNumber": "INV2", "LoyaltyPoints": 40},
    ]

    layers.silver()
    lines = DeltaTable(silver.path).to_pyarrow_table(columns=["InvoiceNumber", "LoyaltyPoints"])
    assert sorted((r["InvoiceNumber"], r["LoyaltyPoints"]) for r in lines.to_pylist()) == [
        ("INV1", None),
        ("INV1", None),
        ("INV2", 40),
        ("INV2", 40),
    ]
    assert layers.gold().version is not None

    # A later file without the field still loads (its rows null), and the field stays.
    drop(folder, "c.json", [invoice(3)])
    assert len(load_landing(spark, spec, bronze, now=NOW).files_loaded) == 1
    assert "LoyaltyPoints" in DeltaTable(bronze.path).schema().to_arrow().names


def test_a_new_json_field_fails_the_run_when_the_table_says_fail(spark, folder, bronze):
    spec = landing_spec(folder)
    assert spec.on_schema_change == "fail"
    drop(folder, "a.json", [invoice(1)])
    load_landing(spark, spec, bronze, now=NOW)
    version = DeltaTable(bronze.path).version()
    known = FileIndex(bronze).known()

    drop(folder, "b.json", [with_loyalty(2, 40)])
    with pytest.raises(SchemaMismatchError) as info:
        load_landing(spark, spec, bronze, now=NOW)
    message = str(info.value)
    assert "b.json" in message and "LoyaltyPoints" in message
    assert "append_new_columns" in message
    assert DeltaTable(bronze.path).version() == version
    assert FileIndex(bronze).known() == known


def test_a_changed_json_type_fails_naming_file_column_and_both_types(spark, folder, bronze):
    spec = evolving_spec(folder)
    drop(folder, "a.json", [invoice(1)])
    load_landing(spark, spec, bronze, now=NOW)
    version = DeltaTable(bronze.path).version()
    known = FileIndex(bronze).known()

    changed = {**invoice(2), "TotalAmount": "thirty"}
    drop(folder, "b.json", [invoice(3)])
    drop(folder, "c.json", [changed])
    with pytest.raises(SchemaMismatchError) as info:
        load_landing(spark, spec, bronze, now=NOW)
    message = str(info.value)
    assert "c.json" in message and "b.json" not in message
    assert "'TotalAmount' changed type from double to string" in message
    assert info.value.column == "TotalAmount"
    # Nothing committed: neither b.json (good) nor c.json is in bronze or in the index.
    assert DeltaTable(bronze.path).version() == version
    assert FileIndex(bronze).known() == known
    assert (folder / "c.json").exists()


def test_a_new_column_in_a_later_file_is_typed_once_and_checked_after(spark, folder, bronze):
    spec = evolving_spec(folder)
    drop(folder, "a.json", [with_loyalty(1, 10)])
    load_landing(spark, spec, bronze, now=NOW)
    # The column bronze gained is now part of the table's schema: a string there fails.
    drop(folder, "b.json", [{**invoice(2), "LoyaltyPoints": {"tier": "gold"}}])
    with pytest.raises(SchemaMismatchError, match="from bigint to struct<tier:string>"):
        load_landing(spark, spec, bronze, now=NOW)


def _parquet(folder: Path, name: str, table: pa.Table) -> None:
    pq.write_table(table, folder / name)
    os.utime(folder / name, (OLD.timestamp(), OLD.timestamp()))


def _parquet_spec(folder: Path, change: str) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": "items_bronze",
            "source": {"format": "parquet", "path": str(folder), "landing": {}},
            "partitioning": {"granularity": "daily", "start": "2026-01-01"},
            "on_schema_change": change,
        }
    )


def test_parquet_and_csv_files_evolve_by_their_footer_and_header(spark, tmp_path):
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    spec = _parquet_spec(parquet, "append_new_columns")
    target = DeltaTarget(spec.name, str(tmp_path / "warehouse" / spec.name))
    _parquet(parquet, "a.parquet", pa.table({"id": [1, 2], "amount": [2.5, 3.0]}))
    load_landing(spark, spec, target, now=NOW)
    _parquet(parquet, "b.parquet", pa.table({"id": [3], "amount": [1.0], "note": ["x"]}))
    load_landing(spark, spec, target, now=NOW)
    rows = DeltaTable(target.path).to_pyarrow_table(columns=["id", "note"]).to_pylist()
    assert sorted(rows, key=lambda r: r["id"]) == [
        {"id": 1, "note": None},
        {"id": 2, "note": None},
        {"id": 3, "note": "x"},
    ]
    _parquet(parquet, "c.parquet", pa.table({"id": ["4"], "amount": [1.0]}))
    with pytest.raises(SchemaMismatchError, match=r"c\.parquet: column 'id' changed type"):
        load_landing(spark, spec, target, now=NOW)

    csv = tmp_path / "csv"
    csv.mkdir()
    csv_spec = TableSpec.model_validate(
        {
            "name": "csv_bronze",
            "source": {
                "format": "csv",
                "path": str(csv),
                "schema": "id BIGINT, amount DOUBLE",
                "landing": {},
            },
            "partitioning": {"granularity": "daily", "start": "2026-01-01"},
        }
    )
    csv_target = DeltaTarget(csv_spec.name, str(tmp_path / "warehouse" / csv_spec.name))
    (csv / "a.csv").write_text("id,amount,note\n1,2.5,x\n")
    with pytest.raises(SchemaMismatchError, match=r"a\.csv: new columns \['note'\]"):
        load_landing(spark, csv_spec, csv_target, now=later())
    assert not DeltaTable.is_deltatable(csv_target.path)
    evolving = csv_spec.model_copy(update={"on_schema_change": "append_new_columns"})
    (csv / "b.csv").write_text("id,amount\n2,1.0\n")
    load_landing(spark, evolving, csv_target, now=later())
    rows = DeltaTable(csv_target.path).to_pyarrow_table(columns=["id", "note"]).to_pylist()
    assert sorted(rows, key=lambda r: r["id"]) == [
        {"id": 1, "note": "x"},
        {"id": 2, "note": None},
    ]


def test_json_fields_missing_or_null_in_a_file_are_not_a_change(spark, folder, bronze):
    spec = landing_spec(folder)
    sparse = invoice(1)
    sparse["CustomerCardNo"] = None
    del sparse["DeliveryAddress"]
    empty = {**invoice(2), "InvoiceLineItems": []}
    whole = {**invoice(3), "TotalAmount": 30}  # an integer where a double is declared
    (folder / "a.json").write_text("\n".join(json.dumps(r) for r in (sparse, empty, whole)))
    report = load_landing(spark, spec, bronze, now=later())
    assert len(report.files_loaded) == 1 and not report.quarantined
