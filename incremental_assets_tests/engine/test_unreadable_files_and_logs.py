"""Every message names what to change and where: a source file Spark cannot read (a
nanosecond timestamp, a corrupt file) and a Delta log entry that is not JSON are named,
`status` lists the tables it can still read, and a partitioning.start in the future is
refused when the specs load."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from incremental_assets import cli
from incremental_assets.engine import DeltaTarget, run_load
from incremental_assets.engine.errors import UnreadableFileError, UnreadableLogError
from incremental_assets.specs import SpecError, load_project
from incremental_assets_tests.builders import (
    ORDERS,
    at,
    day_request,
    make_spec,
    order_rows,
    target_rows,
)
from incremental_assets_tests.servers import s3_options

UTC = timezone.utc


def _orders(unit: str) -> pa.Table:
    table = order_rows([(1, "new", 1.0, at(1, 1)), (2, "new", 2.0, at(1, 2))])
    return table.cast(
        pa.schema([*list(ORDERS)[:3], pa.field("updated_at", pa.timestamp(unit, tz="UTC"))])
    )


def _parquet_spec(folder: Path | str):
    return make_spec(str(folder), source={"format": "parquet", "path": str(folder)})


def test_nanosecond_timestamps_are_refused_naming_the_column_file_and_fix(tmp_path, spark):
    folder = tmp_path / "drops"
    folder.mkdir()
    pq.write_table(_orders("us"), folder / "part-1.parquet")
    pq.write_table(_orders("ns"), folder / "part-2.parquet")  # pandas' default unit
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))

    with pytest.raises(UnreadableFileError) as caught:
        run_load(spark, _parquet_spec(folder), target, day_request(1))

    message = str(caught.value)
    assert "timestamps in nanoseconds" in message
    assert f"updated_at in {folder / 'part-2.parquet'}" in message
    assert "coerce_timestamps='us'" in message
    assert "check source.path" not in message  # not the old, misleading advice
    assert not target.exists()


def test_nanosecond_timestamps_in_a_bucket_are_refused_naming_the_file_there(tmp_path, spark, s3):
    # The footers are read where the folder lives: its files listed and their schemas
    # read in the bucket (delta-rs's storage handler, with the source's storage options).
    bucket = f"drops-{uuid.uuid4().hex[:10]}"
    s3.create(bucket)
    for name, unit in (("part-1.parquet", "us"), ("part-2.parquet", "ns")):
        pq.write_table(_orders(unit), tmp_path / name)
        body = (tmp_path / name).read_bytes()
        s3.client.put_object(Bucket=bucket, Key=f"drops/{name}", Body=body)
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
    spec = _parquet_spec(f"s3://{bucket}/drops")

    with pytest.raises(UnreadableFileError) as caught:
        run_load(spark, spec, target, day_request(1), source_storage=s3_options(s3.endpoint))

    message = str(caught.value)
    assert "timestamps in nanoseconds" in message
    assert f"updated_at in s3://{bucket}/drops/part-2.parquet" in message
    assert not target.exists()


def test_microsecond_copies_of_the_same_files_load(tmp_path, spark):
    folder = tmp_path / "drops"
    folder.mkdir()
    pq.write_table(_orders("ns"), folder / "part-1.parquet", coerce_timestamps="us")
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))

    run_load(spark, _parquet_spec(folder), target, day_request(1))

    assert [r[0] for r in target_rows(target)] == [1, 2]


def test_a_corrupt_parquet_file_is_named_and_nothing_is_written(tmp_path, spark):
    folder = tmp_path / "drops"
    folder.mkdir()
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
    pq.write_table(_orders("us"), folder / "part-1.parquet")
    run_load(spark, _parquet_spec(folder), target, day_request(1))
    version = target.open().version()
    (folder / "part-2.parquet").write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")

    with pytest.raises(UnreadableFileError) as caught:
        run_load(spark, _parquet_spec(folder), target, day_request(2))

    assert caught.value.path == str(folder / "part-2.parquet")
    assert f"cannot read {folder / 'part-2.parquet'}: corrupted file" in str(caught.value)
    assert "replace or remove that file" in str(caught.value)
    assert target.open().version() == version


def _corrupt_last_log_entry(table_path: Path) -> Path:
    log = sorted((table_path / "_delta_log").glob("*.json"))[-1]
    log.write_text("{not json\n")
    return log


def test_a_corrupt_target_log_names_the_table_and_the_file(tmp_path, spark, orders_source):
    orders_source.upsert([(1, "new", 1.0, at(1, 1))])
    spec = make_spec(orders_source.path)
    path = tmp_path / "warehouse" / "orders"
    target = DeltaTarget("orders", str(path))
    run_load(spark, spec, target, day_request(1))
    run_load(spark, spec, target, day_request(2))
    bad = _corrupt_last_log_entry(path)
    before = sorted(p.name for p in path.rglob("*"))

    with pytest.raises(UnreadableLogError) as caught:
        run_load(spark, spec, target, day_request(3))

    message = str(caught.value)
    assert message.startswith("table 'orders': the Delta log of ")
    assert f"{bad} is not a valid Delta log entry" in message
    assert "restore that file" in message
    assert sorted(p.name for p in path.rglob("*")) == before


def test_a_corrupt_target_log_on_s3_names_the_file_in_its_bucket(spark, s3, orders_source):
    # The log is read where the table lives: its newest commit file, found and named in
    # the bucket (through delta-rs's storage handler, with the warehouse's options).
    orders_source.upsert([(1, "new", 1.0, at(1, 1))])
    spec = make_spec(orders_source.path)
    bucket = f"wh-{uuid.uuid4().hex[:10]}"
    s3.create(bucket)
    target = DeltaTarget("orders", f"s3://{bucket}/wh/orders", s3_options(s3.endpoint))
    run_load(spark, spec, target, day_request(1))
    run_load(spark, spec, target, day_request(2))
    newest = sorted(k for k in s3.keys(bucket) if k.endswith(".json") and "_delta_log/" in k)[-1]
    s3.put(bucket, newest, "{not json\n")

    with pytest.raises(UnreadableLogError) as caught:
        run_load(spark, spec, target, day_request(3))

    message = str(caught.value)
    assert f"s3://{bucket}/{newest} is not a valid Delta log entry" in message
    assert caught.value.path == f"s3://{bucket}/{newest}"
    assert "restore that file" in message


def test_a_corrupt_delta_source_log_names_the_source_file(tmp_path, spark, orders_source):
    orders_source.upsert([(1, "new", 1.0, at(1, 1))])
    orders_source.upsert([(2, "new", 1.0, at(1, 2))])
    bad = _corrupt_last_log_entry(Path(orders_source.path))
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))

    with pytest.raises(UnreadableLogError, match="not a valid Delta log entry") as caught:
        run_load(spark, make_spec(orders_source.path), target, day_request(1))

    assert caught.value.path == str(bad)
    assert not target.exists()


def _project_file(tmp_path: Path, source: str, names: list[str], start: str) -> Path:
    tables = [
        {
            "name": name,
            "source": {"format": "delta", "path": source},
            "keys": ["order_id"],
            "watermark": {"column": "updated_at", "kind": "timestamp"},
            "strategy": "upsert",
            "partitioning": {"granularity": "daily", "start": start},
        }
        for name in names
    ]
    path = tmp_path / "tables.yaml"
    path.write_text(yaml.safe_dump({"warehouse": {"root": str(tmp_path / "wh")}, "tables": tables}))
    return path


def test_status_reports_an_unreadable_table_and_still_lists_the_others(
    tmp_path, spark, orders_source, capsys
):
    orders_source.upsert([(1, "new", 1.0, at(1, 1))])
    tables = _project_file(tmp_path, orders_source.path, ["broken", "fine"], "2026-01-01")
    project = load_project(tables)
    for spec in project.tables:
        run_load(spark, spec, DeltaTarget(spec.name, project.target_path(spec)), day_request(1))
    _corrupt_last_log_entry(tmp_path / "wh" / "broken")

    code = cli.main(["status", "--tables", str(tables)])

    out = capsys.readouterr().out
    assert code == 1
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "(unreadable)" in lines["broken"]
    assert "2026-01-01T01:00:00Z" in lines["fine"]
    assert "* broken: unreadable: table 'broken': the Delta log of" in out
    assert cli.main(["status", "--tables", str(tables), "--json"]) == 1
    by_table = {s["table"]: s for s in json.loads(capsys.readouterr().out)}
    assert "not a valid Delta log entry" in by_table["broken"]["error"]
    assert by_table["fine"]["error"] is None and by_table["fine"]["delta_version"] == 0


def test_a_partitioning_start_in_the_future_is_refused_when_the_specs_load(tmp_path):
    tomorrow = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%d")
    tables = _project_file(tmp_path, str(tmp_path / "src"), ["orders"], tomorrow)

    with pytest.raises(SpecError) as caught:
        load_project(tables)

    message = str(caught.value)
    assert "table 'orders', field 'partitioning.start'" in message
    assert f"{tomorrow} 00:00 UTC is in the future" in message
    assert "Could not find a partition" in message
