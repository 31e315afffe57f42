"""Bad sources and schemas fail a run with an error that says what to fix, and commit
nothing: an existing target keeps its Delta version, cursor and rows; a missing target is
not created."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from incremental_assets.engine import DeltaTarget, run_load
from incremental_assets.engine.errors import (
    NullValuesError,
    SchemaMismatchError,
    SourceNotFoundError,
)
from incremental_assets_tests.builders import (
    ORDERS,
    DeltaSourceTable,
    ParquetFolder,
    at,
    day_request,
    load,
    make_spec,
    order_rows,
    target_rows,
)
from incremental_assets_tests.servers import s3_options

# Loaded by the baseline run (day 1); every test starts from a copy of that target.
DAY1 = [(1, "new", 10.0, at(1, 1)), (2, "paid", 20.0, at(1, 2))]
DAY2 = [(3, "new", 30.0, at(2, 1))]


def table(schema: pa.Schema, rows: list[tuple]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema)


def with_field(name: str, dtype: pa.DataType) -> pa.Schema:
    """ORDERS with ``name`` changed to ``dtype`` (or appended when not in ORDERS)."""
    if name in ORDERS.names:
        return ORDERS.set(ORDERS.get_field_index(name), pa.field(name, dtype))
    return ORDERS.append(pa.field(name, dtype))


def without_field(name: str) -> pa.Schema:
    return ORDERS.remove(ORDERS.get_field_index(name))


def committed_state(target: DeltaTarget) -> dict[str, Any] | None:
    """What a failed run must leave untouched: version, cursor and rows (None: no table)."""
    if not target.exists():
        return None
    state = target.state("timestamp")
    return {"version": state.version, "cursor": state.cursor, "rows": target_rows(target)}


def parquet_source(tmp_path: Path, *batches: pa.Table) -> ParquetFolder:
    folder = ParquetFolder(tmp_path / "source" / "files")
    for batch in batches:
        folder.drop(batch)
    return folder


def parquet_spec(folder: ParquetFolder, **overrides: Any):
    return make_spec(str(folder.path), source={"format": "parquet"}, **overrides)


@pytest.fixture(scope="module")
def baseline_target(spark, tmp_path_factory) -> Path:
    """A target after one successful load of DAY1 (built once, copied by each test)."""
    base = tmp_path_factory.mktemp("baseline")
    source = DeltaSourceTable(base / "source")
    source.upsert(DAY1)
    result = load(spark, make_spec(source.path), DeltaTarget("orders", str(base / "target")), 1)
    assert result.committed
    _forget_source(base / "target")
    return base / "target"


def _forget_source(target: Path) -> None:
    """Drop the source identity from the target's commit record, as a load of a release
    before identities were recorded left it: the first run of each test then takes the
    test's own source (its path, or Parquet instead of Delta) as the table's, and the
    errors under test are not pre-empted by a switched-source refusal."""
    log = target / "_delta_log" / f"{0:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines() if line]
    for action in actions:
        if "commitInfo" in action:
            record = json.loads(action["commitInfo"]["userMetadata"])
            assert record["incremental_assets"].pop("source_identity", None)
            action["commitInfo"]["userMetadata"] = json.dumps(record)
    log.write_text("".join(json.dumps(a) + "\n" for a in actions))
    (log.parent / f".{log.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the old text


@pytest.fixture
def existing(baseline_target, target) -> dict[str, Any]:
    """The `target` fixture holding the baseline load; returns its committed state."""
    shutil.copytree(baseline_target, target.path)
    state = committed_state(target)
    assert state == {"version": 0, "cursor": at(1, 2), "rows": sorted(DAY1)}
    return state


# --- missing or unreadable sources ------------------------------------------------------


def test_missing_delta_source_fails_and_creates_no_target(spark, tmp_path, target):
    missing = tmp_path / "no_such_table"

    with pytest.raises(SourceNotFoundError) as info:
        load(spark, make_spec(str(missing)), target, 1)

    message = str(info.value)
    assert str(missing) in message
    assert "does not exist" in message
    assert "source.path" in message
    assert not target.exists()


def test_missing_parquet_folder_fails_and_leaves_target_unchanged(
    spark, tmp_path, target, existing
):
    missing = tmp_path / "no_such_folder"

    with pytest.raises(SourceNotFoundError) as info:
        load(spark, make_spec(str(missing), source={"format": "parquet"}), target, 2)

    message = str(info.value)
    assert str(missing) in message
    assert "does not exist" in message
    assert "source.path" in message
    assert committed_state(target) == existing


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_delta_table_read_as_parquet_fails_naming_the_format_and_creates_no_target(
    spark, tmp_path, target, where, request
):
    # Read as plain Parquet, a Delta table gives every file it ever wrote, replaced ones
    # too. Found where the table lives: a local folder, or a bucket (its log asked through
    # delta-rs with the storage options; a local-only check let it through).
    storage = None
    if where == "local":
        path = spark_path = str(tmp_path / "orders")
    else:
        s3 = request.getfixturevalue("s3")
        bucket = f"src-{uuid.uuid4().hex[:10]}"
        s3.create(bucket)
        path, spark_path = f"s3://{bucket}/orders", f"s3a://{bucket}/orders"
        storage = s3_options(s3.endpoint)
    rows = order_rows(DAY1).to_pylist()
    schema = "order_id long, status string, amount double, updated_at timestamp"
    spark.createDataFrame(rows, schema=schema).write.format("delta").save(spark_path)
    spec = make_spec(path, source={"format": "parquet"})

    with pytest.raises(SourceNotFoundError) as info:
        run_load(spark, spec, target, day_request(1), source_storage=storage)

    message = str(info.value)
    assert f"{path} is a Delta table" in message
    assert "set source.format: delta" in message
    assert not target.exists()


def test_empty_parquet_folder_fails_and_creates_no_target(spark, tmp_path, target):
    folder = parquet_source(tmp_path)

    with pytest.raises(SourceNotFoundError) as info:
        load(spark, parquet_spec(folder), target, 1)

    message = str(info.value)
    assert f"cannot read parquet files at {folder.path}" in message
    assert "source.path" in message
    assert "source.format" in message
    assert not target.exists()


# --- missing columns and wrong types ----------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "column", "setting", "hint"),
    [
        ({"watermark": {"column": "updated"}}, "updated", "watermark.column", "updated_at"),
        ({"keys": ["orderid"]}, "orderid", "keys", "order_id"),
        ({"watermark": {"column": "version"}}, "version", "watermark.column", None),
    ],
    ids=["watermark-close-name", "key-close-name", "watermark-no-close-name"],
)
def test_missing_source_column_fails_naming_setting_and_close_name(
    spark, orders_source, target, existing, overrides, column, setting, hint
):
    orders_source.upsert(DAY1 + DAY2)

    with pytest.raises(SchemaMismatchError) as info:
        load(spark, make_spec(orders_source.path, **overrides), target, 2)

    message = str(info.value)
    assert info.value.column == column
    assert f"column '{column}' ({setting}) is not in the source" in message
    assert "source columns: order_id, status, amount, updated_at" in message
    assert f"correct {setting} in the table spec" in message
    if hint:
        assert f"Did you mean '{hint}'?" in message
    else:
        assert "Did you mean" not in message
    assert committed_state(target) == existing


def test_id_watermark_partition_column_missing_fails_naming_partitioning_column(
    spark, orders_source, target
):
    orders_source.upsert(DAY1)
    spec = make_spec(
        orders_source.path,
        watermark={"column": "order_id", "kind": "id", "lookback": 0},
        partitioning={"column": "created_at"},
    )

    with pytest.raises(SchemaMismatchError) as info:
        load(spark, spec, target, 1)

    assert info.value.column == "created_at"
    assert "column 'created_at' (partitioning.column) is not in the source" in str(info.value)
    assert not target.exists()


def test_string_watermark_with_timestamp_kind_fails_naming_kind(spark, tmp_path, target):
    rows = [(1, "new", 10.0, "2026-01-01 01:00:00")]
    folder = parquet_source(tmp_path, table(with_field("updated_at", pa.string()), rows))

    with pytest.raises(SchemaMismatchError) as info:
        load(spark, parquet_spec(folder), target, 1)

    message = str(info.value)
    assert info.value.column == "updated_at"
    assert "watermark column 'updated_at' is string" in message
    assert "watermark.kind is 'timestamp'" in message
    assert "watermark.kind: id" in message
    assert not target.exists()


def test_timestamp_watermark_with_id_kind_fails_naming_kind(spark, orders_source, target):
    orders_source.upsert(DAY1)
    spec = make_spec(
        orders_source.path,
        watermark={"kind": "id", "lookback": 0},
        partitioning={"column": "updated_at"},
    )

    with pytest.raises(SchemaMismatchError) as info:
        load(spark, spec, target, 1)

    message = str(info.value)
    assert info.value.column == "updated_at"
    assert "watermark column 'updated_at' is timestamp" in message
    assert "watermark.kind is 'id'" in message
    assert "watermark.kind: timestamp" in message
    assert not target.exists()


def test_non_timestamp_partition_column_fails_naming_partitioning_column(
    spark, orders_source, target
):
    orders_source.upsert(DAY1)
    spec = make_spec(
        orders_source.path,
        watermark={"column": "order_id", "kind": "id", "lookback": 0},
        partitioning={"column": "status"},
    )

    with pytest.raises(SchemaMismatchError) as info:
        load(spark, spec, target, 1)

    message = str(info.value)
    assert info.value.column == "status"
    assert "partition column 'status' is string" in message
    assert "set partitioning.column to a timestamp column" in message
    assert not target.exists()


# --- null keys and watermarks -----------------------------------------------------------


def test_null_keys_in_increment_fail_naming_key_and_count(spark, orders_source, target, existing):
    orders_source.upsert(DAY1)
    orders_source.append(order_rows([(None, "new", 30.0, at(2, 1)), (4, "new", 40.0, at(2, 2))]))

    with pytest.raises(NullValuesError) as info:
        load(spark, make_spec(orders_source.path), target, 2)

    assert info.value.counts == {"order_id": 1}
    message = str(info.value)
    assert "null values in required columns (order_id: 1)" in message
    assert "fill the key columns" in message
    assert committed_state(target) == existing


@pytest.mark.parametrize("source_format", ["delta", "parquet"])
def test_null_watermarks_fail_naming_column_and_count(
    spark, tmp_path, orders_source, target, existing, source_format
):
    nulls = order_rows([(3, "new", 30.0, None), (4, "new", 40.0, None), *DAY2])
    if source_format == "delta":
        orders_source.upsert(DAY1)
        orders_source.append(nulls)
        spec = make_spec(orders_source.path)
    else:
        spec = parquet_spec(parquet_source(tmp_path, order_rows(DAY1), nulls))

    with pytest.raises(NullValuesError) as info:
        load(spark, spec, target, 2)

    assert info.value.counts == {"updated_at": 2}
    message = str(info.value)
    assert "null values in required columns (updated_at: 2)" in message
    assert "fill 'updated_at' in the source" in message
    assert committed_state(target) == existing


# --- schema changes between runs --------------------------------------------------------


def test_type_change_in_recreated_delta_source_fails_after_first_load(
    spark, orders_source, target, existing
):
    changed = with_field("amount", pa.string())
    rows = [(i, s, str(a), t) for i, s, a, t in DAY1 + DAY2]
    write_deltalake(
        orders_source.path, table(changed, rows), mode="overwrite", schema_mode="overwrite"
    )

    with pytest.raises(SchemaMismatchError) as info:
        load(spark, make_spec(orders_source.path), target, 2)

    message = str(info.value)
    assert info.value.column == "amount"
    assert "column 'amount' is string in the source but double in the target" in message
    assert "migrate the target table" in message
    assert committed_state(target) == existing


def test_type_change_in_new_parquet_files_fails_with_schema_mismatch(
    spark, tmp_path, target, existing
):
    changed = table(with_field("amount", pa.string()), [(3, "new", "30.0", at(2, 1))])
    folder = parquet_source(tmp_path, order_rows(DAY1), changed)

    with pytest.raises(SchemaMismatchError) as info:
        load(spark, parquet_spec(folder), target, 2)

    assert info.value.column == "amount"
    assert "string" in str(info.value)
    assert "double" in str(info.value)
    assert committed_state(target) == existing


def test_new_delta_source_column_fails_by_default_naming_column_and_setting(
    spark, orders_source, target, existing
):
    orders_source.upsert(DAY1)
    note = with_field("note", pa.string())
    write_deltalake(
        orders_source.path,
        table(note, [(3, "new", 30.0, at(2, 1), "gift")]),
        mode="append",
        schema_mode="merge",
    )

    with pytest.raises(SchemaMismatchError) as info:
        load(spark, make_spec(orders_source.path), target, 2)

    message = str(info.value)
    assert info.value.column == "note"
    assert "new source columns ['note'] are not in the target" in message
    assert "on_schema_change: append_new_columns" in message
    assert committed_state(target) == existing


def test_new_delta_source_column_is_added_with_append_new_columns(
    spark, orders_source, target, existing
):
    orders_source.upsert(DAY1)
    note = with_field("note", pa.string())
    write_deltalake(
        orders_source.path,
        table(note, [(3, "new", 30.0, at(2, 1), "gift")]),
        mode="append",
        schema_mode="merge",
    )
    spec = make_spec(orders_source.path, on_schema_change="append_new_columns")

    result = load(spark, spec, target, 2)

    assert result.committed
    assert result.new_columns == ("note",)
    assert result.rows_inserted == 1
    state = target.state("timestamp")
    assert state.version == existing["version"] + 1
    assert state.cursor == at(2, 1)
    assert target_rows(target, ("order_id", "note")) == [(1, None), (2, None), (3, "gift")]


def test_new_column_in_parquet_files_fails_by_default(spark, tmp_path, target, existing):
    note = table(with_field("note", pa.string()), [(3, "new", 30.0, at(2, 1), "gift")])
    folder = parquet_source(tmp_path, order_rows(DAY1), note)

    with pytest.raises(SchemaMismatchError) as info:
        load(spark, parquet_spec(folder), target, 2)

    assert info.value.column == "note"
    assert "on_schema_change" in str(info.value)
    assert committed_state(target) == existing


def test_target_column_dropped_from_source_fails(spark, orders_source, target, existing):
    rows = [(i, a, t) for i, _, a, t in DAY1 + DAY2]
    write_deltalake(
        orders_source.path,
        table(without_field("status"), rows),
        mode="overwrite",
        schema_mode="overwrite",
    )

    with pytest.raises(SchemaMismatchError) as info:
        load(spark, make_spec(orders_source.path), target, 2)

    message = str(info.value)
    assert info.value.column == "status"
    assert "target columns ['status'] are no longer in the source" in message
    assert "restore them in the source" in message
    assert committed_state(target) == existing
