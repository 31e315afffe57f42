"""Shared fixtures: one local Spark session for the whole test session, and helpers that
build real sources (Delta tables, Parquet folders) and table specs in temporary folders."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from incremental_assets.engine import DeltaTarget, LoadRequest, run_load
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import TableSpec

UTC = timezone.utc

ORDERS = pa.schema(
    [
        ("order_id", pa.int64()),
        ("status", pa.string()),
        ("amount", pa.float64()),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)


def at(day: int, hour: float = 0, minute: int = 0, second: int = 0) -> datetime:
    """An instant in January 2026 (UTC)."""
    return datetime(2026, 1, day, tzinfo=UTC) + timedelta(
        hours=hour, minutes=minute, seconds=second
    )


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "2g",
        "spark.databricks.delta.snapshotPartitions": "2",
    }
    # JDBC drivers must be on the classpath when the session starts (test_jdbc.py).
    if Path("/usr/share/java/postgresql.jar").exists():
        conf["spark.jars"] = "/usr/share/java/postgresql.jar"
    session = local_session("incremental-assets-tests", **conf)
    yield session
    session.stop()


def order_rows(rows: list[tuple[int, str, float, datetime]]) -> pa.Table:
    return pa.Table.from_pylist(
        [dict(zip(ORDERS.names, r, strict=True)) for r in rows], schema=ORDERS
    )


class DeltaSourceTable:
    """A mutable source table (like a database table) stored as Delta."""

    def __init__(self, path: Path):
        self.path = str(path)

    def upsert(self, rows: list[tuple[int, str, float, datetime]]) -> None:
        table = order_rows(rows)
        if not DeltaTable.is_deltatable(self.path):
            write_deltalake(self.path, table)
            return
        (
            DeltaTable(self.path)
            .merge(table, "t.order_id = s.order_id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )

    def append(self, table: pa.Table) -> None:
        write_deltalake(self.path, table, mode="append")

    def replace(self, table: pa.Table) -> None:
        """The source's whole state becomes ``table`` (a snapshot source)."""
        write_deltalake(self.path, table, mode="overwrite", schema_mode="overwrite")


class ParquetFolder:
    """An append-only source: a folder that receives Parquet files."""

    def __init__(self, path: Path):
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)
        self._n = 0

    def drop(self, table: pa.Table) -> None:
        self._n += 1
        pq.write_table(table, self.path / f"part-{self._n:05d}.parquet")


def make_spec(source_path: str, **overrides: Any) -> TableSpec:
    raw: dict[str, Any] = {
        "name": "orders",
        "source": {"format": "delta", "path": source_path},
        "keys": ["order_id"],
        "watermark": {"column": "updated_at", "kind": "timestamp", "lookback": "0s"},
        "strategy": "upsert",
        "partitioning": {"granularity": "daily", "start": "2026-01-01"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return TableSpec.model_validate(raw)


def day_request(first: int, last: int | None = None, **kwargs: Any) -> LoadRequest:
    last = first if last is None else last
    return LoadRequest(at(first), at(last + 1), **kwargs)


@pytest.fixture
def orders_source(tmp_path: Path) -> DeltaSourceTable:
    return DeltaSourceTable(tmp_path / "source" / "orders")


@pytest.fixture
def target(tmp_path: Path) -> DeltaTarget:
    return DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))


def load(spark, spec, target, first: int, last: int | None = None, **kwargs: Any):
    """Run one load of days ``first..last`` (a range when ``last`` is given)."""
    backfill = kwargs.pop("backfill", last is not None and last != first)
    hook = kwargs.pop("hook", None)
    return run_load(
        spark, spec, target, day_request(first, last, backfill=backfill, **kwargs), hook=hook
    )


def target_rows(target: DeltaTarget, columns=("order_id", "status", "amount", "updated_at")):
    """The target's rows as sorted tuples of ``columns`` (system columns left out)."""
    table = DeltaTable(target.path).to_pyarrow_table(columns=list(columns))
    return sorted(tuple(r[c] for c in columns) for r in table.to_pylist())
