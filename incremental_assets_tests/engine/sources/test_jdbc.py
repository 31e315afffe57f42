"""Database sources over JDBC, against a real PostgreSQL started by these tests: the
window's predicate and the probes run in the database (proven from its statement log),
rows written during a run, a server that goes away mid-run, bad credentials, and time
zones of the database session and of zone-less columns."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import dagster as dg
import pytest
from deltalake import DeltaTable
from pydantic import SecretStr
from pyspark.sql import functions as F

from incremental_assets.dagster_layer import assets as assets_module
from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.dagster_layer.connections import DatabaseConnections
from incremental_assets.engine import (
    DeltaTarget,
    IncrementalLoadError,
    SchemaMismatchError,
    SourceNotFoundError,
    predicates,
    run_load,
    transforms,
)
from incremental_assets.engine.errors import SourceAccessError
from incremental_assets.engine.sources import jdbc, open_source
from incremental_assets.engine.sources.jdbc import JdbcSource
from incremental_assets.specs import SpecError, TableSpec, load_project
from incremental_assets.specs.models import ConnectionSpec, WatermarkSpec
from incremental_assets_tests.builders import at, day_request, target_rows
from incremental_assets_tests.postgres import (
    JDBC_JAR,
    PostgresServer,
    PostgresUnavailable,
)

PASSWORD = "s3cr3t-Loader-pw-91"
USER = "loader"
_databases = itertools.count(1)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One throwaway server for the module. Skips without PostgreSQL or its JDBC driver,
    except on CI (CI set), where a missing database is a failure."""
    problem = None
    server = None
    if not Path(JDBC_JAR).exists():
        problem = f"PostgreSQL's JDBC driver is not at {JDBC_JAR} (libpostgresql-jdbc-java)"
    else:
        try:
            server = PostgresServer.start()
        except PostgresUnavailable as exc:
            problem = f"cannot start PostgreSQL: {exc}"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"{problem} (CI is set, so this fails instead of skipping)")
        pytest.skip(problem)
    assert server is not None
    server.create_user(USER, PASSWORD)
    yield server
    server.close()


class Shop:
    """A fresh database with an ``orders`` table (timestamptz watermark) that the loader's
    user may read, and specs pointing at it."""

    def __init__(self, pg: PostgresServer, spark, root: Path):
        self.pg = pg
        self.spark = spark
        self.root = root
        self.name = f"shop_{next(_databases)}"
        pg.create_database(self.name)
        self.sql(
            "CREATE TABLE orders (order_id bigint PRIMARY KEY, status text, amount float8, "
            "updated_at timestamptz); "
            "CREATE INDEX ON orders (updated_at); "
            f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{USER}"; '
            f'ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO "{USER}";'
        )

    def sql(self, statement: str) -> list[list[str]]:
        return self.pg.sql(statement, self.name)

    def upsert(self, rows: list[tuple[int, str, float, datetime]], table: str = "orders"):
        values = ", ".join(f"({i}, '{s}', {a}, '{ts.isoformat(sep=' ')}')" for i, s, a, ts in rows)
        self.sql(
            f"INSERT INTO {table} VALUES {values} ON CONFLICT (order_id) DO UPDATE SET "
            "status = EXCLUDED.status, amount = EXCLUDED.amount, "
            "updated_at = EXCLUDED.updated_at"
        )

    def connection(self, password: str | None = PASSWORD) -> ConnectionSpec:
        return ConnectionSpec(
            url=self.pg.jdbc_url(self.name),
            driver="org.postgresql.Driver",
            user=USER,
            name="shop",
            password=SecretStr(password) if password is not None else None,
        )

    def spec(self, password: str | None = PASSWORD, **overrides: Any) -> TableSpec:
        source = {
            "format": "jdbc",
            "connection": self.connection(password),
            "table": "public.orders",
            **overrides.pop("source", {}),
        }
        raw: dict[str, Any] = {
            "name": "orders",
            "source": source,
            "keys": ["order_id"],
            "watermark": {"column": "updated_at", "kind": "timestamp", "lookback": "1h"},
            "strategy": "upsert",
            "partitioning": {"granularity": "daily", "start": "2026-01-01"},
            **overrides,
        }
        return TableSpec.model_validate(raw)

    def target(self, name: str = "orders") -> DeltaTarget:
        return DeltaTarget(name, str(self.root / "warehouse" / self.name / name))

    def rows(self, table: str = "orders") -> list[tuple]:
        """The database's rows as (id, status, amount, updated_at as a UTC instant)."""
        out = self.sql(
            "SELECT order_id, status, amount, "
            f"(EXTRACT(EPOCH FROM updated_at) * 1000000)::bigint FROM {table} ORDER BY 1"
        )
        return [(int(i), s, float(a), _instant(int(us))) for i, s, a, us in out]

    def statements(self, since: int) -> list[str]:
        return [s.text for s in self.pg.statements(since, database=self.name)]


def _instant(micros: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=micros)


@pytest.fixture
def shop(postgres, spark, tmp_path) -> Shop:
    return Shop(postgres, spark, tmp_path)


def load(spark, spec, target, day: int, **kwargs):
    return run_load(spark, spec, target, day_request(day), **kwargs)


def selects(statements: list[str]) -> list[str]:
    """Statements that read rows, without Spark's schema probes (``WHERE 1=0``, the
    driver's catalog look-ups)."""
    return [
        s
        for s in statements
        if s.lstrip().upper().startswith("SELECT") and "1=0" not in s and "pg_catalog" not in s
    ]


# -- push-down --------------------------------------------------------------------------


def test_window_rows_are_read_with_the_watermark_predicate_executed_by_the_database(shop, spark):
    shop.upsert([(i, "placed", float(i), at(1, i)) for i in range(1, 11)])
    spec, target = shop.spec(), shop.target()
    load(spark, spec, target, 1)
    shop.upsert([(3, "paid", 3.0, at(2, 4)), (11, "placed", 11.0, at(2, 5))])
    since = shop.pg.log_position()

    result = load(spark, spec, target, 2)

    assert (result.rows_inserted, result.rows_updated) == (1, 1)
    row_reads = [s for s in selects(shop.statements(since)) if '"status"' in s]
    assert len(row_reads) == 1, shop.statements(since)  # the window is read once
    # (cursor - lookback, high-water mark] = (10:00 - 1h, 2026-01-02 05:00]
    for sql in row_reads:
        assert '"updated_at" > \'2026-01-01 09:00:00' in sql
        assert '"updated_at" <= \'2026-01-02 05:00:00' in sql
    assert target_rows(target) == shop.rows()


def test_null_check_and_clock_are_queries_answered_by_the_database(shop, spark):
    shop.upsert([(1, "placed", 1.0, at(1, 1))])
    since = shop.pg.log_position()

    load(spark, shop.spec(), shop.target(), 1)

    statements = selects(shop.statements(since))
    assert any(
        'SELECT COUNT(*) AS n FROM public.orders WHERE "updated_at" IS NULL' in s
        for s in statements
    )
    assert any("CURRENT_TIMESTAMP" in s for s in statements)


def test_null_watermarks_in_the_database_stop_the_run(shop, spark):
    shop.upsert([(1, "placed", 1.0, at(1, 1))])
    shop.sql("INSERT INTO orders VALUES (2, 'placed', 2.0, NULL)")

    with pytest.raises(IncrementalLoadError, match=r"updated_at: 1"):
        load(spark, shop.spec(), shop.target(), 1)


def test_high_water_mark_is_one_max_query_executed_by_the_database(shop, spark):
    shop.upsert([(i, "placed", float(i), at(1, i)) for i in range(1, 6)])
    shop.upsert([(6, "placed", 6.0, at(2, 1))])
    source = open_source(spark, "orders", shop.spec().source, {})
    assert isinstance(source, JdbcSource)
    since = shop.pg.log_position()

    high = source.high_water(
        (predicates.Range("updated_at", at(1, 2), False, at(2), False),), "timestamp"
    )

    assert high == at(1, 5)
    (query,) = selects(shop.statements(since))
    assert 'MAX("updated_at")' in query
    assert "'2026-01-01 02:00:00.000000+00:00'" in query  # the cursor
    assert "'2026-01-02 00:00:00.000000+00:00'" in query  # the cap
    assert source.clock() > at(1)


def test_a_run_takes_its_high_water_mark_from_a_max_query_in_the_database(shop, spark):
    shop.upsert([(i, "placed", float(i), at(1, i)) for i in range(1, 6)])
    since = shop.pg.log_position()

    load(spark, shop.spec(), shop.target(), 1)

    assert any('MAX("updated_at")' in s for s in selects(shop.statements(since)))


def test_slices_read_the_window_in_parallel_range_queries(shop, spark):
    shop.upsert([(i, "placed", float(i), at(1, 0, i)) for i in range(1, 301)])
    spec = shop.spec(source={"slices": {"column": "order_id", "count": 3}, "fetch_size": 50})
    target = shop.target()
    since = shop.pg.log_position()

    result = load(spark, spec, target, 1)

    assert result.rows_inserted == 300
    assert target_rows(target) == shop.rows()
    statements = selects(shop.statements(since))
    assert any('MIN("order_id")' in s and 'MAX("order_id")' in s for s in statements)
    sliced = {s for s in statements if '"status"' in s and '"order_id"' in s.split("WHERE")[1]}
    assert len(sliced) == 3
    assert all('"updated_at" <= \'2026-01-01 05:00:00' in s for s in sliced)


def test_hybrid_watermark_runs_stop_inside_a_burst_and_lose_nothing(shop, spark):
    shop.upsert([(i, "placed", float(i), at(1, 12)) for i in range(1, 251)])  # one instant
    shop.upsert([(i, "placed", float(i), at(1, 13)) for i in range(251, 301)])
    hybrid = WatermarkSpec.model_validate(
        {
            "column": "updated_at",
            "kind": "hybrid",
            "tiebreak": "order_id",
            "max_rows": 100,
            "lookback": "0s",
        }
    )
    spec = shop.spec().model_copy(update={"watermark": hybrid})
    target = shop.target()
    source = open_source(spark, "orders", spec.source, {})
    after_100 = (predicates.Range("updated_at", (at(1, 12), 100), False, at(2), False, "order_id"),)
    since = shop.pg.log_position()

    assert source.high_water(after_100, "hybrid", max_rows=100) == (at(1, 12), 200)
    assert "ORDER BY t DESC, i DESC LIMIT 1" in selects(shop.statements(since))[0]
    runs = [load(spark, spec, target, 1) for _ in range(4)]

    assert [r.rows_inserted for r in runs] == [100, 100, 100, 0]
    assert [r.cursor_after for r in runs[:3]] == [
        (at(1, 12), 100),
        (at(1, 12), 200),
        (at(1, 13), 300),
    ]
    assert target_rows(target) == shop.rows()


# -- rows written during a run ----------------------------------------------------------


def test_rows_inserted_and_updated_while_a_run_extracts_are_loaded_by_the_next_run(shop, spark):
    shop.upsert([(i, "placed", float(i), at(1, i)) for i in range(1, 6)])
    spec, target = shop.spec(), shop.target()
    load(spark, spec, target, 1)
    shop.upsert([(i, "placed", float(i), at(1, i)) for i in range(6, 11)])

    def write_during_the_run(phase: str) -> None:
        if phase == "probed":
            # Committed after the high-water mark was captured, stamped later (as a
            # database's clock stamps them): a new order, an update of an order loaded
            # before, and an update of an order this run has not read yet.
            shop.upsert(
                [
                    (11, "placed", 11.0, at(1, 12)),
                    (3, "paid", 3.5, at(1, 13)),
                    (7, "paid", 7.5, at(1, 14)),
                ]
            )

    during = load(spark, spec, target, 1, hook=write_during_the_run)

    assert during.high_water == at(1, 10)
    # Order 7 left the window before it was read: it waits for the next run rather than
    # landing in a version the database no longer holds.
    assert (during.rows_inserted, during.rows_updated) == (4, 0)
    loaded = {r[0]: r for r in target_rows(target)}
    assert 7 not in loaded and 11 not in loaded and loaded[3][1] == "placed"

    after = load(spark, spec, target, 1)

    assert (after.rows_inserted, after.rows_updated) == (2, 1)
    assert target_rows(target) == shop.rows()
    again = load(spark, spec, target, 1)
    assert not again.committed and target_rows(target) == shop.rows()


# -- failures ---------------------------------------------------------------------------


def test_server_stopping_mid_run_commits_nothing_and_a_rerun_is_exact(shop, spark):
    shop.upsert([(i, "placed", float(i), at(1, i)) for i in range(1, 6)])
    spec, target = shop.spec(), shop.target()
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()
    shop.upsert([(6, "placed", 6.0, at(2, 1)), (1, "paid", 1.0, at(2, 2))])

    def stop_server(phase: str) -> None:
        if phase == "probed":
            shop.pg.stop("immediate")

    try:
        with pytest.raises(Exception) as failure:
            load(spark, spec, target, 2, hook=stop_server)
    finally:
        shop.pg.resume()

    assert PASSWORD not in str(failure.value)
    assert DeltaTable(target.path).version() == version
    rerun = load(spark, spec, target, 2)
    assert (rerun.rows_inserted, rerun.rows_updated) == (1, 1)
    assert target_rows(target) == shop.rows()


@pytest.mark.parametrize(
    ("change", "error", "named"),
    [
        ({"password": "wrong-password-123"}, SourceAccessError, "refused the login"),
        ({"source": {"table": "public.no_such_table"}}, SourceNotFoundError, "no_such_table"),
        (
            {"watermark": {"column": "modified_at", "kind": "timestamp"}},
            SchemaMismatchError,
            "modified_at",
        ),
    ],
    ids=["wrong_password", "missing_table", "missing_column"],
)
def test_bad_credentials_table_or_column_fail_naming_the_table_without_the_secret(
    shop, spark, change, error, named
):
    shop.upsert([(1, "placed", 1.0, at(1, 1))])
    spec = shop.spec(**change)
    target = shop.target()

    with pytest.raises(error) as failure:
        load(spark, spec, target, 1)

    message = str(failure.value)
    assert "table 'orders'" in message and named in message
    assert failure.value.fix
    assert PASSWORD not in message and "wrong-password-123" not in message
    assert not target.exists()


# -- time zones -------------------------------------------------------------------------

NEW_YORK = ZoneInfo("America/New_York")


def test_timestamptz_and_zone_less_columns_load_the_same_rows_in_any_session_zone(shop, spark):
    # The database's default zone is Tokyo, the connection's startup options set another
    # zone, and the zone-less copy of the table holds New York wall-clock times.
    shop.pg.sql(f"ALTER DATABASE {shop.name} SET timezone = 'Asia/Tokyo'")
    shop.sql(
        "CREATE TABLE orders_local (order_id bigint PRIMARY KEY, status text, "
        "amount float8, updated_at timestamp without time zone)"
    )
    micro = timedelta(microseconds=1)
    instants = [
        at(1) - micro, at(1), at(1, 12), at(2) - micro, at(2), at(2) + micro, at(2, 23, 59),
        at(3) - micro, at(3),
    ]  # fmt: skip
    rows = [(i, "s", float(i), ts) for i, ts in enumerate(instants, start=1)]
    shop.upsert(rows)
    shop.upsert(
        [(i, s, a, ts.astimezone(NEW_YORK).replace(tzinfo=None)) for i, s, a, ts in rows],
        table="orders_local",
    )
    kiritimati = {"options": "-c TimeZone=Pacific/Kiritimati"}  # pgjdbc's startup options
    aware = shop.spec(
        source={"connection": shop.connection().model_copy(update={"properties": kiritimati})}
    )
    local = shop.spec(source={"table": "public.orders_local", "timezone": "America/New_York"})
    targets = {"aware": shop.target("aware"), "local": shop.target("local")}

    for day, end in ((1, at(2)), (2, at(3))):
        for name, spec in (("aware", aware), ("local", local)):
            load(spark, spec, targets[name], day)
        expected = sorted(r for r in rows if at(1) <= r[3] < end)
        assert target_rows(targets["aware"]) == expected, f"day {day}"
        assert target_rows(targets["local"]) == expected, f"day {day}"
    # The pin is the session's zone (pushed-down literals are rendered in it, with the Java 8
    # time API the engine requires), read through public settings, never the JVM's zone.
    assert spark.conf.get("spark.sql.datetime.java8API.enabled") == "true"
    options = jdbc.reader_options(spark, shop.connection(), aware.source, None)
    assert options["sessionInitStatement"] == "SET TIME ZONE 'UTC'"


@pytest.mark.parametrize(
    ("java_zone", "offset"),
    [("GMT+01:00", "+01"), ("GMT-05:30", "-05:30"), ("Asia/Tokyo", "+09"), ("Etc/UTC", "+00")],
)
def test_session_zone_pin_reads_java_zone_ids_as_java_does(postgres, java_zone, offset):
    # PostgreSQL alone would read 'GMT+01:00' POSIX-style: one hour west, not east.
    pin = jdbc._postgres_zone(java_zone)

    ((shown,),) = postgres.sql(f"SET TIME ZONE {pin}; SELECT '2026-01-01 00:00'::timestamptz")

    assert shown == f"2026-01-01 00:00:00{offset}"


def test_high_water_of_zone_less_times_across_the_spring_gap_is_exact(shop, spark):
    """New York skips 02:00-03:00 on 2026-03-08; a wall-clock 02:30 written anyway becomes
    07:30Z, later than 03:10 (07:10Z). The database's MAX over wall-clock values is then
    not the latest instant, so the exact maximum is taken near it."""
    shop.sql(
        "CREATE TABLE orders_local (order_id bigint PRIMARY KEY, status text, "
        "amount float8, updated_at timestamp without time zone)"
    )
    shop.upsert(
        [
            (1, "s", 1.0, datetime(2026, 3, 8, 2, 30)),
            (2, "s", 2.0, datetime(2026, 3, 8, 3, 10)),
            (3, "s", 3.0, datetime(2026, 3, 7, 12, 0)),
        ],
        table="orders_local",
    )
    spec = shop.spec(source={"table": "public.orders_local", "timezone": "America/New_York"})
    source = open_source(spark, "orders", spec.source, {})
    part = (predicates.Range("updated_at", at(1), False, None, False),)

    high = source.high_water(part, "timestamp")

    assert high == _spark_high_water(source, part, "America/New_York")
    assert high == datetime(2026, 3, 8, 7, 30, tzinfo=timezone.utc)


def _spark_high_water(source, part, zone):
    """The engine's own definition: max over the exact filter after conversion to UTC."""
    types = {f.name: f.dataType for f in source.schema.fields}
    df = (
        source.read(predicates.to_source_ranges([part], types, zone))
        .select("updated_at")
        .filter(predicates.to_source_filter([part], types, zone))
        .transform(transforms.to_utc_instants(zone))
        .filter(predicates.to_filter([part]))
    )
    value = df.agg(F.max(F.unix_micros("updated_at")).alias("hw")).collect()[0]["hw"]
    return _instant(value)


# -- specs ------------------------------------------------------------------------------

TABLES_YAML = """
warehouse:
  root: ./warehouse
connections:
  shop:
    url: {url}
    driver: org.postgresql.Driver
    user: loader
    password_env: IA_TEST_SHOP_PASSWORD
    max_retries: 3
    retry_delay: 0.2s
tables:
  - name: orders
    source: {{format: jdbc, connection: shop, table: public.orders}}
    keys: [order_id]
    watermark: {{column: updated_at, kind: timestamp, lookback: 1h}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
  - name: customers
    source: {{format: jdbc, connection: {connection}, table: public.customers}}
    keys: [customer_id]
    watermark: {{column: updated_at, kind: timestamp}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
"""


def write_project(root: Path, url: str, connection: str = "shop") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "tables.yaml"
    path.write_text(TABLES_YAML.format(url=url, connection=connection))
    return path


def test_unknown_connection_fails_at_load_naming_table_and_field(tmp_path):
    path = write_project(tmp_path, "jdbc:postgresql://localhost:5432/shop", "shpo")

    with pytest.raises(SpecError) as failure:
        load_project(path)

    assert failure.value.problems == [
        ("customers", "source.connection", "unknown connection 'shpo' (did you mean "
         "'shop'?); connections: shop")
    ]  # fmt: skip


def test_password_in_yaml_or_url_is_refused(tmp_path):
    path = write_project(tmp_path, "jdbc:postgresql://localhost:5432/shop?password=x")
    path.write_text(path.read_text().replace("    max_retries", "    password: x\n    max_retries"))

    with pytest.raises(SpecError) as failure:
        load_project(path)

    fields = {field for _table, field, _message in failure.value.problems}
    assert fields == {"connections.shop.password"}
    path.write_text(path.read_text().replace("    password: x\n", ""))
    with pytest.raises(SpecError, match="password_env"):
        load_project(path)


# -- Dagster ----------------------------------------------------------------------------


class DagsterShop:
    """A project folder whose tables.yaml declares the shop connection and two tables."""

    def __init__(self, shop: Shop, monkeypatch):
        shop.sql(
            "CREATE TABLE customers (customer_id bigint PRIMARY KEY, name text, "
            "updated_at timestamptz)"
        )
        monkeypatch.setenv("IA_TEST_SHOP_PASSWORD", PASSWORD)
        self.shop = shop
        self.project = load_project(
            write_project(shop.root / "project", shop.pg.jdbc_url(shop.name))
        )
        self.defs = build_definitions(self.project)
        self.target = self.defs.resources["warehouse"].target(
            self.project, self.project.table("orders")
        )

    def materialize(
        self, instance, names=("orders",), partition="2026-01-01", resources=None, **kwargs
    ):
        return dg.materialize(
            [self.defs.get_assets_def(n) for n in names],
            partition_key=partition,
            instance=instance,
            resources={**self.defs.resources, **(resources or {})},
            **kwargs,
        )


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture
def dagster_shop(shop, monkeypatch) -> DagsterShop:
    return DagsterShop(shop, monkeypatch)


def test_tables_of_one_database_share_its_pool_retry_policy_and_password_resource(
    dagster_shop, instance
):
    shop = dagster_shop.shop
    shop.upsert([(1, "placed", 1.0, at(1, 1))])
    shop.sql("INSERT INTO customers VALUES (7, 'Ada', '2026-01-01 03:00+00')")
    orders = dagster_shop.defs.get_assets_def("orders")
    customers = dagster_shop.defs.get_assets_def("customers")

    result = dagster_shop.materialize(instance, names=("orders", "customers"))

    assert result.success
    assert orders.op.pool == customers.op.pool == "jdbc_shop"
    assert orders.op.retry_policy.max_retries == 3
    assert {"spark", "warehouse", "databases"} <= orders.required_resource_keys
    assert {e.asset_key.path[-1] for e in result.get_asset_materialization_events()} == {
        "orders", "customers",
    }  # fmt: skip
    assert PASSWORD not in str(instance.all_logs(result.run_id))


def test_dagster_retries_a_load_whose_database_went_away_and_ends_exact(
    dagster_shop, instance, monkeypatch
):
    shop = dagster_shop.shop
    shop.upsert([(i, "placed", float(i), at(1, i)) for i in range(1, 6)])
    attempts: list[str] = []
    real_run_load = assets_module.run_load

    def flaky_run_load(*args, **kwargs):
        attempts.append("attempt")
        if len(attempts) == 1:  # the server goes away after the probe, mid-extraction
            kwargs["hook"] = lambda phase: shop.pg.stop("immediate") if phase == "probed" else None
        elif len(attempts) == 3:  # still down on the second attempt; back for the third
            shop.pg.resume()
        return real_run_load(*args, **kwargs)

    monkeypatch.setattr(assets_module, "run_load", flaky_run_load)
    try:
        result = dagster_shop.materialize(instance, raise_on_error=False)
    finally:
        if not shop.pg.running:
            shop.pg.resume()

    assert result.success and len(attempts) == 3
    retried = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retried) == 2
    logs = str(instance.all_logs(result.run_id))
    assert "lost database connection 'shop'" in logs and "Nothing was committed" in logs
    assert PASSWORD not in logs
    assert target_rows(dagster_shop.target) == shop.rows()
    assert DeltaTable(dagster_shop.target.path).version() == 0


def test_dagster_wrong_password_fails_without_retry_and_without_the_secret(
    dagster_shop, instance, monkeypatch
):
    monkeypatch.setenv("IA_TEST_SHOP_PASSWORD", "wrong-Password-777")
    dagster_shop.shop.upsert([(1, "placed", 1.0, at(1, 1))])

    result = dagster_shop.materialize(instance, raise_on_error=False)

    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.step_failure_data.error.message
    assert "table 'orders'" in message and "IA_TEST_SHOP_PASSWORD" in message
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    logs = str(instance.all_logs(result.run_id))
    assert "wrong-Password-777" not in logs and PASSWORD not in logs


def test_a_password_given_to_the_databases_resource_replaces_password_env(
    dagster_shop, instance, monkeypatch
):
    monkeypatch.delenv("IA_TEST_SHOP_PASSWORD")  # password_env is not set...
    monkeypatch.setenv("IA_TEST_VAULT_PASSWORD", PASSWORD)  # ...the resource's variable is
    dagster_shop.shop.upsert([(1, "placed", 1.0, at(1, 1))])
    databases = DatabaseConnections(passwords={"shop": dg.EnvVar("IA_TEST_VAULT_PASSWORD")})

    result = dagster_shop.materialize(instance, resources={"databases": databases})

    assert result.success
    assert target_rows(dagster_shop.target) == dagster_shop.shop.rows()
    assert PASSWORD not in str(instance.all_logs(result.run_id))
    run = instance.get_run_by_id(result.run_id)
    assert PASSWORD not in str(run.run_config) and PASSWORD not in str(run.tags)
