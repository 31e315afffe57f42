"""Every table owns its storage: a spec that points one table's writes at another table's
data is refused when the specs load; a run creates a table only in an empty folder or on a
Delta table it wrote itself, with nothing written otherwise; a VACUUM deletes only files the
table's own log removed, so foreign files in its folder survive it."""

from __future__ import annotations

import glob
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql.types import LongType, StringType, StructField, StructType

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.delta_lake.folders import held
from incremental_assets.engine.delta_lake.maintenance import MaintenanceSettings, maintain
from incremental_assets.engine.delta_lake.store import Tombstones
from incremental_assets.engine.errors import SchemaMismatchError, TargetOwnedError
from incremental_assets.engine.validation import check_against_target
from incremental_assets.specs.loader import SpecError, parse_project
from incremental_assets_tests.builders import (
    DeltaSourceTable,
    ParquetFolder,
    at,
    load,
    make_spec,
    order_rows,
)
from incremental_assets_tests.object_stores import SERVERS
from incremental_assets_tests.postgres import skip_or_fail_on_ci

IMPORTANT = "keep me: not a table's file\n"


def table(name: str, source: str | None = None, fmt: str = "delta", **extra: Any) -> dict:
    return {
        "name": name,
        "source": {"format": fmt, "path": source or f"./source/{name}"},
        "keys": ["order_id"],
        "watermark": {"column": "updated_at", "kind": "timestamp"},
        "strategy": "upsert",
        "partitioning": {"granularity": "daily", "start": "2026-01-01"},
        **extra,
    }


def landing(name: str, quarantine: str) -> dict:
    return {
        "name": name,
        "source": {
            "format": "json",
            "path": f"./landing/{name}",
            "schema": "InvoiceNumber STRING",
            "landing": {"quarantine": quarantine},
        },
        "partitioning": {"granularity": "daily", "start": "2026-01-01"},
    }


def project(tmp_path: Path, *tables: dict):
    raw = {"warehouse": {"root": "./warehouse"}, "tables": list(tables)}
    return parse_project(raw, source="tables.yaml", base_dir=tmp_path)


def problems_of(tmp_path: Path, *tables: dict) -> list[tuple[str | None, str, str]]:
    with pytest.raises(SpecError) as info:
        project(tmp_path, *tables)
    return info.value.problems


def files_in(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> content)."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


# --- at load: one table's writes on another table's data --------------------------------


@pytest.mark.parametrize(
    ("fmt", "target"),
    [
        ("parquet", "./source/events"),
        ("parquet", "./source/events/"),
        ("parquet", "./source/./other/../events"),
        ("delta", "./source/events/orders"),
        ("parquet", "./source"),
    ],
    ids=["parquet-folder", "trailing-slash", "dot-segments", "inside-delta", "containing"],
)
def test_a_target_on_another_tables_source_is_refused_at_load(tmp_path, fmt, target):
    problems = problems_of(
        tmp_path,
        table("events", fmt=fmt),
        table("orders", source="./db/orders", target={"path": target}),
    )

    assert len(problems) == 1
    name, field, message = problems[0]
    assert (name, field) == ("orders", "target.path")
    assert "the source of table 'events'" in message
    assert "change target.path" in message


def test_a_target_spelled_in_another_case_is_the_same_folder(tmp_path):
    problems = problems_of(
        tmp_path,
        table("events", fmt="parquet"),
        table("orders", target={"path": "./Source/EVENTS"}),
    )

    assert [(p[0], p[1]) for p in problems] == [("orders", "target.path")]
    assert "the source of table 'events'" in problems[0][2]


def test_a_target_inside_its_own_source_is_refused_at_load(tmp_path):
    problems = problems_of(tmp_path, table("orders", target={"path": "./source/orders/copy"}))

    assert len(problems) == 1
    name, field, message = problems[0]
    assert (name, field) == ("orders", "target.path")
    assert "lies inside its own source" in message


@pytest.mark.parametrize(
    "quarantine",
    ["../../source/events", "../../source/events/bad", "{root}/source/events"],
    ids=["relative", "inside", "absolute"],
)
def test_a_quarantine_into_another_tables_source_is_refused_at_load(tmp_path, quarantine):
    problems = problems_of(
        tmp_path,
        table("events", fmt="parquet"),
        landing("invoices", quarantine.format(root=tmp_path)),
    )

    assert len(problems) == 1
    name, field, message = problems[0]
    assert (name, field) == ("invoices", "source.landing.quarantine")
    assert "the source of table 'events'" in message
    assert "change source.landing.quarantine" in message


def test_a_quarantine_outside_the_landing_folder_on_a_folder_of_its_own_loads(tmp_path):
    loaded = project(tmp_path, table("events", fmt="parquet"), landing("invoices", "../bad"))

    assert [t.name for t in loaded.tables] == ["events", "invoices"]


def test_a_quarantine_on_the_landing_folder_itself_is_refused(tmp_path):
    problems = problems_of(tmp_path, landing("invoices", "."))

    assert [(p[0], p[1]) for p in problems] == [("invoices", "source.landing.quarantine")]
    assert "the landing folder itself" in problems[0][2]


def test_a_target_on_the_staging_folder_is_refused_at_load(tmp_path):
    problems = problems_of(
        tmp_path, table("orders"), table("audit", target={"path": "./warehouse/orders__staging"})
    )

    assert [(p[0], p[1]) for p in problems] == [("audit", "target.path")]
    assert "the staging folder of table 'orders'" in problems[0][2]


@pytest.mark.parametrize(
    "name", ["_staging", "_delta_log", "_STAGING", "orders__Tombstones", "orders__Staging"]
)
def test_reserved_table_names_are_refused(tmp_path, name):
    problems = problems_of(tmp_path, table(name, source="./source/x"))

    assert [(p[0], p[1]) for p in problems] == [(name, "name")]
    assert "choose another name" in problems[0][2]


def test_names_equal_but_for_case_are_refused_naming_both(tmp_path):
    problems = problems_of(tmp_path, table("orders"), table("Orders"))

    assert [(p[0], p[1]) for p in problems] == [("Orders", "name")]
    assert "only in case" in problems[0][2]
    assert "table 'orders'" in problems[0][2]


def test_a_table_reading_another_tables_target_as_its_delta_source_loads(tmp_path):
    # A layer after a table is not a clash: only the first table writes its target.
    loaded = project(tmp_path, table("orders"), table("orders_silver", source="./warehouse/orders"))

    assert loaded.readers_of(loaded.table("orders")) == ["orders_silver"]
    assert loaded.readers_of(loaded.table("orders_silver")) == []


# --- at run time: a table is created only where nothing else is ----------------------------


def test_a_target_on_another_tables_delta_source_is_refused_with_nothing_written(spark, tmp_path):
    events = DeltaSourceTable(tmp_path / "source" / "events")
    events.upsert([(1, "placed", 1.0, at(1, 1))])
    before = DeltaTable(events.path)
    version, rows = before.version(), before.to_pyarrow_table().to_pylist()
    orders = DeltaSourceTable(tmp_path / "source" / "orders")
    orders.upsert([(7, "new", 70.0, at(1, 2))])
    spec = make_spec(orders.path, on_schema_change="append_new_columns")

    with pytest.raises(TargetOwnedError) as info:
        load(spark, spec, DeltaTarget("orders", events.path), 1)

    message = str(info.value)
    assert "table 'orders'" in message and events.path in message
    assert "did not write" in message and "target.path" in message
    after = DeltaTable(events.path)
    assert after.version() == version
    assert after.to_pyarrow_table().to_pylist() == rows
    assert "_ia_row_hash" not in after.schema().to_arrow().names


def test_a_target_folder_holding_a_foreign_file_is_refused_at_first_load(
    spark, orders_source, tmp_path
):
    folder = tmp_path / "warehouse" / "orders"
    folder.mkdir(parents=True)
    (folder / "important.txt").write_text(IMPORTANT)
    orders_source.upsert([(1, "placed", 1.0, at(1, 1))])

    with pytest.raises(TargetOwnedError) as info:
        load(spark, make_spec(orders_source.path), DeltaTarget("orders", str(folder)), 1)

    message = str(info.value)
    assert str(folder) in message and "important.txt" in message
    assert "Nothing was written" in message and "target.path" in message
    assert files_in(folder) == {"important.txt": IMPORTANT.encode()}


def test_a_side_table_is_not_created_in_a_folder_holding_other_files(spark, tmp_path):
    target = DeltaTarget("customers", str(tmp_path / "warehouse" / "customers"))
    folder = tmp_path / "warehouse" / "customers__tombstones"
    folder.mkdir(parents=True)
    (folder / "important.txt").write_text(IMPORTANT)
    deletes = spark.createDataFrame([(1, 5, "D")], "customer_id BIGINT, lsn BIGINT, _ia_op STRING")

    with pytest.raises(TargetOwnedError) as info:
        Tombstones(target).record(deletes, ["customer_id"], "lsn")

    assert "customers__tombstones" in str(info.value) and "important.txt" in str(info.value)
    assert files_in(folder) == {"important.txt": IMPORTANT.encode()}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def store(request, tmp_path_factory):
    server_class = SERVERS[request.param]
    missing = server_class.missing()
    if missing:
        skip_or_fail_on_ci(missing)
    server = server_class(tmp_path_factory.mktemp(request.param))
    yield server
    server.stop()


def test_what_an_object_store_folder_holds_is_seen_before_a_table_is_created(store):
    bucket = f"warehouse-{uuid.uuid4().hex[:12]}"
    store.create(bucket)
    options = store.warehouse().storage_options()
    folder = store.folder(bucket, "warehouse/orders")

    assert held(folder, options) == []
    store.put(bucket, "warehouse/orders_2/part-0.parquet", "another table's")
    assert held(folder, options) == []  # a sibling with a longer name is not inside
    store.put(bucket, "warehouse/orders/important.txt", IMPORTANT)
    store.put(bucket, "warehouse/orders/events/part-0.parquet", "another table's")
    assert held(folder, options) == ["events", "important.txt"]


# --- VACUUM deletes only what the table's own log removed --------------------------------


def test_vacuum_leaves_foreign_files_in_a_tables_folder(spark, orders_source, target):
    spec = make_spec(orders_source.path)
    for hour, status in enumerate(["placed", "paid", "shipped"], start=1):
        orders_source.upsert([(i, status, 1.0, at(1, hour)) for i in range(1, 6)])
        load(spark, spec, target, 1)
    folder = Path(target.path)
    (folder / "important.txt").write_text(IMPORTANT)
    foreign = ParquetFolder(folder / "events")  # another table's files, misplaced here
    foreign.drop(order_rows([(99, "foreign", 9.0, at(1))]))
    kept = {**files_in(folder / "events"), "important.txt": IMPORTANT.encode()}
    live = set(DeltaTable(target.path).file_uris())

    result = maintain(
        spark,
        target,
        MaintenanceSettings(compact=False, retention_hours=0, enforce_retention=False),
    )

    assert result.files_vacuumed == result.stale_files_before > 0
    assert result.stale_files_after == 0
    assert (folder / "important.txt").read_bytes() == kept["important.txt"]
    assert files_in(folder / "events") == {k: v for k, v in kept.items() if k != "important.txt"}
    assert all(os.path.exists(uri.removeprefix("file://")) for uri in live)


def test_vacuum_after_log_cleanup_deletes_only_what_the_snapshot_removed(spark, tmp_path):
    """Log cleanup removed the commits since the table was created; Delta's VACUUM LITE
    then refuses (DELTA_CANNOT_VACUUM_LITE) and its advice, a full VACUUM, would delete
    every file the table does not use. The tombstones the checkpoint keeps are vacuumed
    instead, and nothing else."""
    path = str(tmp_path / "warehouse" / "events")
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT) USING delta "
        "TBLPROPERTIES ('delta.checkpointInterval' = '3')"
    )
    for start in (0, 10, 20):
        spark.range(start, start + 10).coalesce(1).write.format("delta").mode("append").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 10")  # removes the first file
    spark.range(30, 40).coalesce(1).write.format("delta").mode("append").save(path)
    # As log cleanup does after a checkpoint: the commits before it are gone.
    log = Path(path) / "_delta_log"
    assert (log / "00000000000000000003.checkpoint.parquet").exists()
    for commit in glob.glob(str(log / "0000000000000000000[0-3].json")):
        os.remove(commit)
    (Path(path) / "important.txt").write_text(IMPORTANT)
    target = DeltaTarget("events", path)
    removed = target.open().vacuum(
        retention_hours=0, dry_run=True, enforce_retention_duration=False
    )
    rows = sorted(r["id"] for r in target.open().to_pyarrow_table().to_pylist())

    result = maintain(
        spark,
        target,
        MaintenanceSettings(compact=False, retention_hours=0, enforce_retention=False),
    )

    assert len(removed) == 1 and result.files_vacuumed == 1
    assert "DELTA_CANNOT_VACUUM_LITE" in result.vacuum_note
    assert not (Path(path) / removed[0]).exists()
    assert (Path(path) / "important.txt").read_text() == IMPORTANT
    assert sorted(r["id"] for r in target.open().to_pyarrow_table().to_pylist()) == rows


# --- a failing schema change on a target another table reads -----------------------------


def test_new_columns_on_a_target_another_table_reads_do_not_suggest_appending_them():
    spec = make_spec("./source/orders")
    target = StructType([StructField("order_id", LongType())])
    incoming = StructType([*target.fields, StructField("coupon", StringType())])

    with pytest.raises(SchemaMismatchError) as alone:
        check_against_target(spec, incoming, target)
    with pytest.raises(SchemaMismatchError) as read:
        check_against_target(spec, incoming, target, read_by=["orders_silver"])

    assert "append_new_columns" in str(alone.value)
    message = str(read.value)
    assert "append_new_columns" not in message
    assert "the source of table 'orders_silver'" in message
    assert "target.path" in message
