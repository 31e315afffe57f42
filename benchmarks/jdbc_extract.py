"""Extracting an increment from PostgreSQL over JDBC, with one and several slices, against
reading the whole table.

1. start a throwaway PostgreSQL (``incremental_assets.demo.postgres_server``, as the demo
   and the tests do), build an ``orders`` table of ``--rows`` rows with ``generate_series``
   (about 200k orders a day, ``updated_at`` a little after ``created_at``), with an index
   on ``updated_at``, and ANALYZE it;
2. full reads, timed: Spark reading every row through JDBC into a no-op sink (one slice,
   then ``--slices`` slices on ``order_id``), and the engine's first load of the table
   (``run_load`` on an empty target) with one and with several slices;
3. change the table as an application does: half of ``--increment`` rows update recent
   orders, half insert new ones, all stamped after the loaded cursor;
4. time one incremental ``run_load`` of the increment on each target (one slice, several
   slices): the high-water mark probe, the window read with its predicate executed by the
   database (an index range scan on ``updated_at``), staging and the Delta commit;
5. check that both incremental runs loaded the increment and that the targets match the
   table's row count.

Run from the repository root (needs PostgreSQL's binaries and its JDBC driver, as
``.ci/run`` installs them)::

    .venv/bin/python benchmarks/jdbc_extract.py                 # 5M rows, a few minutes
    .venv/bin/python benchmarks/jdbc_extract.py --rows 200000 --increment 5000   # smoke run
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypeVar

from pydantic import SecretStr

from incremental_assets.demo.postgres_server import JDBC_JAR, PostgresServer
from incremental_assets.engine import DeltaTarget, LoadRequest, LoadResult, run_load
from incremental_assets.engine.delta_lake.store import row_count
from incremental_assets.engine.sources import open_source
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import TableSpec
from incremental_assets.specs.models import ConnectionSpec

T = TypeVar("T")
UTC = timezone.utc
HISTORY_START = datetime(2026, 1, 1, tzinfo=UTC)
ORDERS_PER_DAY = 200_000
PASSWORD = "bench-password"


def timed(action: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    value = action()
    return value, time.perf_counter() - start


def build_table(pg: PostgresServer, rows: int) -> None:
    pg.create_database("shop")
    pg.create_user("loader", PASSWORD)
    pg.sql(
        f"""
        CREATE TABLE orders (
          order_id bigint PRIMARY KEY, customer_id bigint NOT NULL, status text NOT NULL,
          amount float8 NOT NULL, created_at timestamptz NOT NULL,
          updated_at timestamptz NOT NULL);
        INSERT INTO orders
        SELECT i, i % 100000, (ARRAY['placed', 'paid', 'shipped'])[1 + i % 3],
               (i % 10000) / 100.0, created,
               created + ((i * 7919) % 7200) * interval '1 second'
        FROM (SELECT i, timestamptz '{HISTORY_START.isoformat()}'
                        + (i * 86400.0 / {ORDERS_PER_DAY}) * interval '1 second' AS created
              FROM generate_series(1::bigint, {rows}) AS i) AS s;
        CREATE INDEX orders_updated_at ON orders (updated_at);
        ANALYZE orders;
        GRANT SELECT ON orders TO loader;
        """,
        "shop",
    )


def change_table(pg: PostgresServer, rows: int, increment: int) -> datetime:
    """Update ``increment // 2`` recent orders and insert the rest, stamped after all
    loaded rows. Returns the instant the changes start at."""
    (top,) = pg.sql("SELECT EXTRACT(EPOCH FROM MAX(updated_at))::bigint FROM orders", "shop")[0]
    start = datetime.fromtimestamp(int(top), UTC) + timedelta(minutes=1)
    updates, inserts = increment // 2, increment - increment // 2
    recent = min(rows, 200_000)
    step = max(1, recent // max(updates, 1))
    stamp = f"timestamptz '{start.isoformat()}'"
    pg.sql(
        f"""
        UPDATE orders SET status = 'delivered',
               updated_at = {stamp} + (order_id % 600) * interval '1 second'
        WHERE order_id IN (SELECT {rows - recent} + k * {step}
                           FROM generate_series(1, {updates}) AS k);
        INSERT INTO orders
        SELECT i, i % 100000, 'placed', 1.0, {stamp},
               {stamp} + (i % 600) * interval '1 second'
        FROM generate_series({rows + 1}::bigint, {rows + inserts}) AS i;
        ANALYZE orders;
        """,
        "shop",
    )
    return start


def table_spec(pg: PostgresServer, slices: int) -> TableSpec:
    connection = ConnectionSpec(
        url=pg.jdbc_url("shop"),
        driver="org.postgresql.Driver",
        user="loader",
        name="shop",
        password=SecretStr(PASSWORD),
    )
    source: dict = {"format": "jdbc", "connection": connection, "table": "public.orders"}
    if slices > 1:
        source["slices"] = {"column": "order_id", "count": slices}
    return TableSpec.model_validate(
        {
            "name": "orders",
            "source": source,
            "keys": ["order_id"],
            "watermark": {"column": "updated_at", "kind": "timestamp", "lookback": "0s"},
            "strategy": "upsert",
            "partitioning": {"granularity": "daily", "start": HISTORY_START.date().isoformat()},
        }
    )


def day_of(value: datetime) -> LoadRequest:
    start = value.replace(hour=0, minute=0, second=0, microsecond=0)
    return LoadRequest(start, start + timedelta(days=1), run_id="bench")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="table rows")
    parser.add_argument("--increment", type=int, default=50_000, help="changed rows")
    parser.add_argument("--slices", type=int, default=4, help="parallel slices to compare")
    parser.add_argument("--data-dir", default=None, help="Delta targets (default: a temp dir)")
    args = parser.parse_args(argv)
    if not Path(JDBC_JAR).exists():
        print(f"PostgreSQL's JDBC driver is not at {JDBC_JAR} (libpostgresql-jdbc-java)")
        return 2

    data = Path(args.data_dir or tempfile.mkdtemp(prefix="ia-jdbc-bench-"))
    spark, spark_seconds = timed(
        lambda: local_session("jdbc-extract-bench", **{"spark.jars": JDBC_JAR})
    )
    print(f"Spark session: {spark_seconds:.1f}s ({spark.sparkContext.defaultParallelism} cores)")
    pg = PostgresServer.start(log_statements=False)
    try:
        _, seconds = timed(lambda: build_table(pg, args.rows))
        print(f"PostgreSQL table of {args.rows:,} rows with an index on updated_at: {seconds:.1f}s")
        counts = {1: table_spec(pg, 1), args.slices: table_spec(pg, args.slices)}
        # Untimed warm-up (JIT, driver loading): a small JDBC read and write.
        spark.read.format("jdbc").options(
            url=pg.jdbc_url("shop"), user="loader", password=PASSWORD,
            driver="org.postgresql.Driver",
            query="SELECT * FROM orders WHERE order_id <= 50000",
        ).load().write.format("noop").mode("overwrite").save()  # fmt: skip

        rows_out: list[tuple[str, int, float, LoadResult | None]] = []
        for slices, spec in counts.items():
            source = open_source(spark, "orders", spec.source, {})
            _, seconds = timed(
                lambda s=source: s.read().write.format("noop").mode("overwrite").save()
            )
            rows_out.append((f"full table read, {slices} slice(s)", args.rows, seconds, None))

        end = HISTORY_START + timedelta(days=args.rows // ORDERS_PER_DAY + 2)
        first_load = LoadRequest(HISTORY_START, end, run_id="bench-initial")
        targets = {}
        for slices, spec in counts.items():
            target = DeltaTarget("orders", str(data / f"orders_{slices}"))
            result, seconds = timed(lambda t=target, s=spec: run_load(spark, s, t, first_load))
            rows_out.append(
                (
                    f"first load (run_load), {slices} slice(s)",
                    result.rows_extracted,
                    seconds,
                    result,
                )
            )
            targets[slices] = target

        start = change_table(pg, args.rows, args.increment)
        ok = True
        for slices, spec in counts.items():
            result, seconds = timed(
                lambda t=targets[slices], s=spec: run_load(spark, s, t, day_of(start))
            )
            rows_out.append(
                (f"increment (run_load), {slices} slice(s)", result.rows_extracted, seconds, result)
            )
            expected = (args.increment - args.increment // 2, args.increment // 2)
            if (result.rows_inserted, result.rows_updated) != expected:
                print(
                    f"CHECK FAILED: {slices} slice(s) inserted/updated "
                    f"{result.rows_inserted}/{result.rows_updated}, expected {expected}"
                )
                ok = False
            total = row_count(targets[slices].open())
            if total != args.rows + expected[0]:
                print(f"CHECK FAILED: target has {total} rows, table {args.rows + expected[0]}")
                ok = False

        full_read = rows_out[0][2]
        full_load = next(r[2] for r in rows_out if r[0].startswith("first load"))
        header = ("case", "rows", "probe s", "extract s", "total s", "/full read", "/full load")
        print(f"\n{header[0]:<38} {header[1]:>10} " + " ".join(f"{h:>10}" for h in header[2:]))
        for name, rows, seconds, result in rows_out:
            phases = result.phase_seconds if result else {}
            cells = [f"{phases[p]:.2f}" if p in phases else "-" for p in ("probe", "extract")] + [
                f"{seconds:.2f}",
                f"{seconds / full_read:.3f}x",
                f"{seconds / full_load:.3f}x",
            ]
            print(f"{name:<38} {rows:>10,} " + " ".join(f"{c:>10}" for c in cells))
        print()
        print("checks:", "ok" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        pg.close()
        spark.stop()
        if not args.data_dir:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
