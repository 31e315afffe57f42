"""A source switched under a table (another database, Delta table path, folder or landing
folder) is refused before anything is read or written, naming both sources and the command
that accepts the new one; after that command the next run loads from it. Loads recorded
before identities were recorded are accepted, and record theirs."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable
from pydantic import SecretStr

from incremental_assets import cli
from incremental_assets.engine import DeltaTarget, transforms
from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake.store import app_id
from incremental_assets.engine.errors import SourceSwitchedError
from incremental_assets.engine.explain import explain
from incremental_assets.engine.landing import load_landing
from incremental_assets.engine.operations import accept_source, rewind
from incremental_assets.engine.sources.identity import database_identity, normal_url
from incremental_assets.specs import TableSpec
from incremental_assets.specs.locations import normal_location
from incremental_assets.specs.models import ConnectionSpec
from incremental_assets_tests.builders import (
    NOW,
    ORDERS_YAML,
    DeltaSourceTable,
    ParquetFolder,
    Project,
    at,
    day_request,
    drop,
    feed,
    feed_spec,
    invoice,
    landing_spec,
    load,
    make_spec,
    rows,
    target_rows,
)
from incremental_assets_tests.postgres import PostgresServer, start_or_skip

SOURCE_IDENTITY = delta_commits.SOURCE_IDENTITY


def recorded(target: DeltaTarget) -> str | None:
    """The source identity the target's newest commit records."""
    commit = DeltaTable(target.path).history(1)[0]
    return delta_commits.parse(commit).get(SOURCE_IDENTITY)


def side_tables(target: DeltaTarget) -> list[str]:
    parent = Path(target.path).parent
    return sorted(p.name for p in parent.iterdir() if p.name != Path(target.path).name)


# -- identities, from the spec alone -------------------------------------------------------


def test_a_database_identity_keeps_what_chooses_the_table_and_drops_credentials():
    url = "jdbc:postgresql://loader:pw@DB.Internal/shop?ssl=true&user=loader&currentSchema=s1"
    assert normal_url(url) == "jdbc:postgresql://db.internal:5432/shop?currentschema=s1"
    assert "pw" not in normal_url(url) and "loader" not in normal_url(url)
    # The same database however spelled; another database, host, port or schema differs.
    same = "jdbc:postgresql://db.internal:5432/shop?currentSchema=s1&connectTimeout=5"
    assert normal_url(same) == normal_url(url)
    assert normal_url("jdbc:postgresql://db.internal/shop") != normal_url(url)
    assert normal_url("jdbc:postgresql://db.internal/shop2?currentSchema=s1") != normal_url(url)
    assert normal_url("jdbc:postgresql://db.internal:5433/shop?currentSchema=s1") != normal_url(url)
    assert normal_url("jdbc:postgresql:shop") == "jdbc:postgresql://localhost:5432/shop"
    # A database chosen by a parameter (SQL Server) or by a connection property.
    assert normal_url("jdbc:sqlserver://H;databaseName=Sales;encrypt=true") == (
        "jdbc:sqlserver://h:1433?databasename=Sales"
    )
    assert normal_url("jdbc:mysql://h/", {"database": "a"}) == "jdbc:mysql://h:3306?database=a"
    assert normal_url("jdbc:oracle:thin:scott/tiger@//h:1521/svc") == (
        "jdbc:oracle:thin:@//h:1521/svc"
    )
    # Unquoted names are folded as the database folds them; quoted ones are kept.
    assert database_identity("jdbc:postgresql://h/shop", "Public.Orders") == (
        "jdbc:postgresql://h:5432/shop table public.orders"
    )
    assert database_identity("jdbc:postgresql://h/shop", 'sales."Order Lines"').endswith(
        'table sales."Order Lines"'
    )


# -- a Delta source's path, through Dagster and the CLI ----------------------------------


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def test_a_delta_source_moved_fails_before_writing_naming_both_and_accept_source_goes_on(
    tmp_path, instance, spark, capsys, monkeypatch
):
    project = Project(tmp_path)
    project.source.upsert([(i, "placed", 1.0, at(1, i)) for i in range(1, 6)])
    assert project.materialize(instance, "2026-01-01").success
    first = f"delta {normal_location(project.source.path)}"
    assert recorded(project.target) == first
    moved = DeltaSourceTable(tmp_path / "source" / "orders_v2")
    moved.upsert([(i, "placed", 1.0, at(1, i)) for i in range(1, 6)])
    moved.upsert([(i, "placed", 2.0, at(1, 12)) for i in range(6, 9)])
    switched = Project(tmp_path, ORDERS_YAML.replace("./source/orders", "./source/orders_v2"))
    version = DeltaTable(project.target.path).version()
    listed = side_tables(project.target)

    result = switched.materialize(instance, "2026-01-01", raise_on_error=False)

    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.step_failure_data.error.message
    second = f"delta {normal_location(moved.path)}"
    assert first in message and second in message
    assert "incremental-assets rewind orders --accept-source" in message
    assert "incremental-assets rewind orders --reset" in message
    assert "source.path" in message
    assert DeltaTable(project.target.path).version() == version
    assert side_tables(project.target) == listed  # no staging folder, no side table
    # explain, which plans the run with the same probe, says so too.
    spec = switched.spec.tables[0]
    with pytest.raises(SourceSwitchedError, match="the spec now names delta"):
        explain(spark, spec, switched.target, day_request(1))

    # The CLI accepts the new source and keeps the watermark.
    monkeypatch.setattr(
        "incremental_assets.engine.spark_session.local_session", lambda *a, **k: spark
    )
    tables = str(tmp_path / "tables.yaml")
    accept = ["rewind", "orders", "--accept-source", "--tables", tables, "--reason"]
    code = cli.main([*accept, "moved"])
    out = capsys.readouterr().out
    assert code == 0 and f"source {second} accepted (was {first})" in out
    assert "watermark kept at 2026-01-01T05:00:00Z" in out
    assert recorded(project.target) == second

    again = switched.materialize(instance, "2026-01-01")

    assert again.success
    # The new source's orders 6-8 (past the kept watermark) are loaded; its orders 1-5,
    # equal to those loaded, change nothing.
    assert rows(project.target, "order_id", "amount") == [
        *[(i, 1.0) for i in range(1, 6)],
        *[(i, 2.0) for i in range(6, 9)],
    ]
    assert recorded(project.target) == second
    # Nothing left to accept: the command says so.
    code = cli.main([*accept, "again"])
    assert code == 1 and "already" in capsys.readouterr().err


# -- a folder's path, with a reset -------------------------------------------------------


def test_a_folder_source_moved_fails_before_writing_and_a_reset_reloads_from_the_new_one(
    spark, tmp_path
):
    old, new = ParquetFolder(tmp_path / "feed"), ParquetFolder(tmp_path / "feed_b")
    old.drop(feed((1, "a", "I", 1, at(1)), (2, "b", "I", 2, at(1))))
    new.drop(feed((7, "x", "I", 1, at(1)), (8, "y", "I", 2, at(1)), (9, "z", "I", 3, at(1))))
    spec = feed_spec(old.path, "upsert")
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
    load(spark, spec, target, 1)
    assert recorded(target) == f"parquet {normal_location(str(old.path))}"
    moved = feed_spec(new.path, "upsert")
    version = DeltaTable(target.path).version()
    listed = side_tables(target)

    with pytest.raises(SourceSwitchedError) as refused:
        load(spark, moved, target, 1)

    assert refused.value.recorded == f"parquet {normal_location(str(old.path))}"
    assert refused.value.current == f"parquet {normal_location(str(new.path))}"
    assert "--reset" in str(refused.value) and "source.path and source.format" in str(refused.value)
    assert DeltaTable(target.path).version() == version
    assert side_tables(target) == listed
    # A rewind to a value does not accept it unnoticed.
    with pytest.raises(Exception, match="add --accept-source"):
        rewind(moved, target, "1", by="me", reason="why", spark=spark)
    # The format is part of the identity too.
    as_json = spec.model_copy(update={"source": spec.source.model_copy(update={"format": "json"})})
    with pytest.raises(SourceSwitchedError, match="now names json"):
        load(spark, as_json, target, 1)

    done = rewind(moved, target, None, by="me", reason="new feed", spark=spark)
    reloaded = load(spark, moved, target, 1)

    assert done.source_before == refused.value.recorded
    assert reloaded.cursor_before is None and reloaded.rows_extracted == 3
    assert {r[0] for r in rows(target, "id")} == {1, 2, 7, 8, 9}
    assert recorded(target) == refused.value.current


# -- a connection to another database ---------------------------------------------------


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = start_or_skip()
    server.create_user("loader", "loader-pw-42")
    yield server
    server.close()


def _database(pg: PostgresServer, name: str, rows_: list[tuple]) -> ConnectionSpec:
    pg.create_database(name)
    values = ", ".join(f"({i}, 'placed', {a}, '{ts.isoformat(sep=' ')}')" for i, a, ts in rows_)
    pg.sql(
        "CREATE TABLE orders (order_id bigint PRIMARY KEY, status text, amount float8, "
        f"updated_at timestamptz); INSERT INTO orders VALUES {values}; "
        'GRANT SELECT ON orders TO "loader";',
        name,
    )
    return ConnectionSpec(
        url=pg.jdbc_url(name),
        driver="org.postgresql.Driver",
        user="loader",
        name="shop",
        password=SecretStr("loader-pw-42"),
    )


def _jdbc_spec(connection: ConnectionSpec) -> TableSpec:
    return make_spec(
        "unused",
        source={"format": "jdbc", "path": None, "connection": connection, "table": "orders"},
        watermark={"lookback": "0s"},
    )


def test_a_connection_moved_to_another_database_fails_before_querying_it(spark, tmp_path, postgres):
    first = _database(postgres, "shop_a", [(1, 1.0, at(1, 1)), (2, 1.0, at(1, 2))])
    second = _database(postgres, "shop_b", [(1, 5.0, at(1, 1)), (3, 5.0, at(1, 3))])
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    load(spark, _jdbc_spec(first), target, 1)
    assert recorded(target) == f"jdbc:postgresql://127.0.0.1:{postgres.port}/shop_a table orders"
    version = DeltaTable(target.path).version()
    since = postgres.log_position()

    with pytest.raises(SourceSwitchedError) as refused:
        load(spark, _jdbc_spec(second), target, 1)

    text = str(refused.value)
    assert f"127.0.0.1:{postgres.port}/shop_a table orders" in text
    assert f"127.0.0.1:{postgres.port}/shop_b table orders" in text
    assert "source.connection (its url) and source.table" in text
    assert "loader-pw-42" not in text and "loader@" not in text
    # Refused from the spec alone: the other database received no statement at all.
    assert postgres.statements(since, database="shop_b") == []
    assert DeltaTable(target.path).version() == version

    accepted = accept_source(_jdbc_spec(second), target, by="me", reason="moved", spark=spark)
    moved = load(spark, _jdbc_spec(second), target, 1)

    assert accepted.cursor_after == at(1, 2) and accepted.source_before == refused.value.recorded
    # From the kept watermark on: shop_b's order 3; its order 1 is older than the cursor.
    assert moved.rows_inserted == 1
    assert rows(target, "order_id", "amount") == [(1, 1.0), (2, 1.0), (3, 5.0)]


# -- a landing folder, and loads recorded before identities -----------------------------


def test_a_landing_folder_moved_fails_before_the_file_index_is_written(spark, tmp_path):
    first, second = tmp_path / "landing_a", tmp_path / "landing_b"
    first.mkdir()
    second.mkdir()
    drop(first, "a.json", [invoice(1)])
    drop(second, "b.json", [invoice(2), invoice(3)])
    target = DeltaTarget("invoices_bronze", str(tmp_path / "warehouse" / "invoices_bronze"))
    load_landing(spark, landing_spec(first), target, now=NOW)
    version = DeltaTable(target.path).version()
    index = DeltaTable(target.path + "__files").version()

    with pytest.raises(SourceSwitchedError, match="--accept-source") as refused:
        load_landing(spark, landing_spec(second), target, now=NOW)

    assert "--reset" not in str(refused.value)  # a landing table has no watermark to reset
    assert DeltaTable(target.path).version() == version
    assert DeltaTable(target.path + "__files").version() == index

    accept_source(landing_spec(second), target, by="me", reason="moved", spark=spark)
    moved = load_landing(spark, landing_spec(second), target, now=NOW)

    assert [Path(f.path).name for f in moved.files_loaded] == ["b.json"]
    assert moved.commit is not None and moved.commit.rows_inserted == 2


def test_loads_recorded_before_identities_are_accepted_and_then_recorded(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source")
    source.upsert([(1, "placed", 1.0, at(1, 1)), (2, "placed", 1.0, at(1, 3))])
    spec = make_spec(source.path)
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    # A load as an earlier release committed it: its record names no source.
    first = (
        spark.read.format("delta")
        .load(source.path)
        .filter("order_id = 1")
        .transform(transforms.with_row_hash(version=1))
    )
    delta_commits.append(
        first,
        target.path,
        delta_commits.record(
            {"table": "orders", "cursor_after": "2026-01-01T01:00:00Z", "sequence": 0}
        ),
        app_id=app_id("orders"),
        version=0,
        mode="error",
    )
    assert target.state("timestamp").source_identity is None

    result = load(spark, spec, target, 1)

    assert result.committed and result.cursor_after == at(1, 3)
    assert recorded(target) == f"delta {normal_location(source.path)}"
    assert [r[0] for r in target_rows(target, ("order_id",))] == [1, 2]
    shutil.rmtree(tmp_path / "source")  # the same path created again stays the same source
    DeltaSourceTable(tmp_path / "source").upsert([(4, "placed", 1.0, at(1, 4))])
    assert load(spark, spec, target, 1).rows_inserted == 1
