"""Database sources are queried with identifiers, never with text from the spec.
``source.table`` is 1 to 3 plain or double-quoted names, checked when the specs load and
quoted for the dialect when sent; the JDBC options that carry SQL or override the
connection are refused; and a secret in any options mapping is refused without its value.
Against a real PostgreSQL (started by these tests): the injected table name of the bad-input
report is refused, and its victim table keeps its row."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable
from pydantic import ValidationError

from incremental_assets.engine import DeltaTarget, IncrementalLoadError
from incremental_assets.specs import SparkSpec, SpecError, TableSpec, load_project
from incremental_assets.specs.loader import parse_project
from incremental_assets.specs.models import ConnectionSpec, WarehouseSpec
from incremental_assets_tests.builders import at, load, target_rows
from incremental_assets_tests.postgres import PostgresServer, start_or_skip

USER = "loader"
PASSWORD = "Loader-pw-7f3e9"
PASSWORD_ENV = "SHOP_DB_PASSWORD"
INJECTED = "public.orders; DELETE FROM public.victim; --"
SECRET = "Sup3r-S3cret-Value-42"
_databases = itertools.count(1)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = start_or_skip()
    server.create_user(USER, PASSWORD)
    yield server
    server.close()


class Shop:
    """A fresh database: ``public.orders``, ``public.victim`` (one row, which the loader's
    user could delete) and ``sales."Order Lines"`` beside a decoy ``sales."order lines"``;
    and a ``tables.yaml`` naming them through a connection whose password is in the
    environment."""

    def __init__(self, pg: PostgresServer, root: Path):
        self.pg = pg
        self.root = root
        self.name = f"shop_bad_{next(_databases)}"
        pg.create_database(self.name)
        columns = (
            "(order_id bigint PRIMARY KEY, status text, amount float8, updated_at timestamptz)"
        )
        self.sql(
            f"CREATE TABLE public.orders {columns}; "
            "CREATE TABLE public.victim (id int); INSERT INTO public.victim VALUES (1); "
            f'CREATE SCHEMA sales; CREATE TABLE sales."Order Lines" {columns}; '
            f'CREATE TABLE sales."order lines" {columns}; '
            f'GRANT USAGE ON SCHEMA sales TO "{USER}"; '
            f'GRANT SELECT ON ALL TABLES IN SCHEMA public, sales TO "{USER}"; '
            f'GRANT DELETE ON public.victim TO "{USER}";'
        )

    def sql(self, statement: str) -> list[list[str]]:
        return self.pg.sql(statement, self.name)

    def insert(self, table: str, rows: list[tuple[int, str, float, Any]]) -> None:
        values = ", ".join(f"({i}, '{s}', {a}, '{ts.isoformat(sep=' ')}')" for i, s, a, ts in rows)
        self.sql(f"INSERT INTO {table} VALUES {values}")

    def victim_rows(self) -> int:
        return int(self.sql("SELECT count(*) FROM public.victim")[0][0])

    def project(self, table: str, **source: Any) -> dict[str, Any]:
        return {
            "warehouse": {"root": "./warehouse"},
            "connections": {
                "shop": {
                    "url": self.pg.jdbc_url(self.name),
                    "driver": "org.postgresql.Driver",
                    "user": USER,
                    "password_env": PASSWORD_ENV,
                    **source.pop("connection", {}),
                }
            },
            "tables": [
                {
                    "name": "orders",
                    "source": {"format": "jdbc", "connection": "shop", "table": table, **source},
                    "keys": ["order_id"],
                    "watermark": {"column": "updated_at", "kind": "timestamp"},
                    "strategy": "upsert",
                    "partitioning": {"granularity": "daily", "start": "2026-01-01"},
                }
            ],
        }

    def write(self, raw: dict[str, Any]) -> Path:
        path = self.root / "tables.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        return path

    def loader_statements(self, since: int) -> list[str]:
        """What the loader's user sent (the tests' own checks run as the superuser)."""
        return [s.text for s in self.pg.statements(since, self.name) if s.user == USER]


@pytest.fixture
def shop(postgres, tmp_path, monkeypatch) -> Shop:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    return Shop(postgres, tmp_path)


def problems_of(raw: dict[str, Any], tmp_path: Path) -> list[tuple[str | None, str, str]]:
    with pytest.raises(SpecError) as info:
        parse_project(raw, source="tables.yaml", base_dir=tmp_path)
    return info.value.problems


def offline_project(table: str = "public.orders", **source: Any) -> dict[str, Any]:
    """A project naming a database that is never contacted (spec checks only)."""
    connection = {"url": "jdbc:postgresql://db.internal:5432/shop", "user": USER}
    return {
        "warehouse": {"root": "./warehouse"},
        "connections": {"shop": {**connection, **source.pop("connection", {})}},
        "tables": [
            {
                "name": "orders",
                "source": {"format": "jdbc", "connection": "shop", "table": table, **source},
                "keys": ["order_id"],
                "watermark": {"column": "updated_at", "kind": "timestamp"},
                "strategy": "upsert",
                "partitioning": {"granularity": "daily", "start": "2026-01-01"},
            }
        ],
    }


# -- the injected table name ------------------------------------------------------------


def test_an_injected_table_name_is_refused_at_load_and_the_victim_keeps_its_row(shop, spark):
    shop.insert("public.orders", [(1, "placed", 1.0, at(1, 1))])
    since = shop.pg.log_position()

    with pytest.raises(SpecError) as info:
        load_project(shop.write(shop.project(INJECTED)))

    ((table, field, message),) = info.value.problems
    assert (table, field) == ("orders", "source.table")
    assert "is not a table name (';' at position 14, outside double quotes)" in message
    assert 'e.g. public.orders or sales."Order Lines"' in message
    assert "create a view in the database" in message
    # A spec changed after loading (model_copy skips validation) cannot send it either.
    project = load_project(shop.write(shop.project("public.orders")))
    valid = project.tables[0]
    forged = valid.model_copy(
        update={"source": valid.source.model_copy(update={"table": INJECTED})}
    )
    target = DeltaTarget("orders", project.target_path(forged))
    with pytest.raises(IncrementalLoadError) as refused:
        load(spark, forged, target, 1)
    assert "source.table: 'public.orders; DELETE FROM public.victim; --'" in str(refused.value)
    assert "nothing was sent to the database" in str(refused.value)
    assert shop.victim_rows() == 1
    assert not [s for s in shop.loader_statements(since) if "victim" in s]
    assert not DeltaTable.is_deltatable(target.path)


def test_sql_smuggled_into_options_of_an_unvalidated_spec_never_reaches_the_database(shop, spark):
    shop.insert("public.orders", [(1, "placed", 1.0, at(1, 1))])
    project = load_project(shop.write(shop.project("public.orders")))
    valid = project.tables[0]
    smuggled = {
        "sessionInitStatement": "DELETE FROM public.victim",
        "QUERY": "DELETE FROM public.victim RETURNING *",
        "prepareQuery": "DELETE FROM public.victim;",
    }
    forged = valid.model_copy(
        update={"source": valid.source.model_copy(update={"options": smuggled})}
    )
    since = shop.pg.log_position()

    result = load(spark, forged, DeltaTarget("orders", project.target_path(forged)), 1)

    assert result.rows_inserted == 1
    assert shop.victim_rows() == 1
    assert not [s for s in shop.loader_statements(since) if "victim" in s]


@pytest.mark.parametrize(
    "table",
    [
        INJECTED,
        'public."orders"; DROP TABLE public.victim',
        "public.orders -- comment",
        "public.orders/* comment */",
        "(SELECT * FROM public.victim) AS t",
        "public . orders",
        "public.orders x",
        "shop.public.orders.extra",
        "public.",
        '"unclosed',
        '""',
        '"line\nbreak"',
        "1orders",
        "",
    ],
)
def test_a_table_name_that_is_not_one_to_three_identifiers_is_refused_at_load(tmp_path, table):
    ((name, field, message),) = problems_of(offline_project(table), tmp_path)

    assert (name, field) == ("orders", "source.table")
    assert "is not a table name" in message
    assert "write 1 to 3 dot-separated names" in message


# -- quoted names, end to end -----------------------------------------------------------


def test_a_quoted_mixed_case_table_name_with_a_space_loads_end_to_end(shop, spark):
    rows = [(1, "placed", 1.0, at(1, 1)), (2, "paid", 2.0, at(1, 2))]
    shop.insert('sales."Order Lines"', rows)
    shop.insert('sales."order lines"', [(9, "decoy", 9.0, at(1, 3))])
    # Plain parts fold as the database folds them (Sales is sales); quoted ones are exact.
    # Harmless connection properties are accepted and passed to the driver.
    raw = shop.project(
        'Sales."Order Lines"',
        connection={"properties": {"sslmode": "disable", "ApplicationName": "ia-loader"}},
    )
    project = load_project(shop.write(raw))
    spec = project.tables[0]
    assert spec.source.table == 'Sales."Order Lines"'
    target = DeltaTarget("orders", project.target_path(spec))
    since = shop.pg.log_position()

    result = load(spark, spec, target, 1)

    assert result.rows_inserted == 2
    assert target_rows(target) == sorted(rows)
    statements = shop.loader_statements(since)
    assert any(
        'SELECT COUNT(*) AS n FROM Sales."Order Lines" WHERE "updated_at" IS NULL' in s
        for s in statements
    ), statements


# -- options that carry SQL or override the connection ----------------------------------

INSTEAD = {
    "dbtable": "source.table",
    "query": "create a view and name it",
    "prepareQuery": "source.table",
    "sessionInitStatement": "ALTER ROLE ... SET",
    "url": "the connection's url",
    "driver": "the connection's driver",
    "user": "the connection's user",
    "partitionColumn": "source.slices",
    "lowerBound": "source.slices",
    "upperBound": "source.slices",
    "numPartitions": "source.slices.count",
    "customSchema": "cast a column in a view",
    "pushDownPredicate": "executed by the database",
}
PLACES = {
    "source.options": lambda option: offline_project(options={option: "x"}),
    "connections.shop.properties": lambda option: offline_project(
        connection={"properties": {option: "x"}}
    ),
}


@pytest.mark.parametrize("field", list(PLACES))
@pytest.mark.parametrize("spelling", [str, str.upper], ids=["as-documented", "upper-case"])
@pytest.mark.parametrize("option", list(INSTEAD))
def test_a_jdbc_option_carrying_sql_or_the_connection_is_refused_naming_it(
    tmp_path, field, spelling, option
):
    key = spelling(option)

    ((table, where, message),) = problems_of(PLACES[field](key), tmp_path)

    assert where == field
    assert table == (None if field.startswith("connections") else "orders")
    assert f"{key!r} ({option}): " in message
    assert INSTEAD[option] in message


@pytest.mark.parametrize("field", list(PLACES))
def test_a_password_option_is_refused_as_a_secret_pointing_at_password_env(tmp_path, field):
    if field == "source.options":
        raw = offline_project(options={"Password": SECRET})
    else:
        raw = offline_project(connection={"properties": {"Password": SECRET}})

    with pytest.raises(SpecError) as info:
        parse_project(raw, source="tables.yaml", base_dir=tmp_path)

    ((_, where, message),) = info.value.problems
    assert where == field
    assert "'Password': secrets are never written in tables.yaml" in message
    assert "password_env" in message
    assert SECRET not in str(info.value)


# -- secrets in any options mapping -----------------------------------------------------


def project_with(section: str, key: str, value: str = SECRET) -> dict[str, Any]:
    raw = offline_project()
    if section == "connections.shop.properties":
        raw["connections"]["shop"]["properties"] = {key: value}
    elif section == "source.options":
        raw["tables"][0]["source"] = {
            "format": "parquet",
            "path": "s3a://lake/orders",
            "options": {key: value},
        }
    elif section == "spark.conf":
        raw["spark"] = {"conf": {key: value}}
    else:
        raw["warehouse"]["storage_options"] = {key: value}
    return raw


SECRETS = [
    ("connections.shop.properties", "password", "password_env"),
    ("connections.shop.properties", "sslpassword", "password_env"),
    ("connections.shop.properties", "sslKeyPassword", "password_env"),
    ("source.options", "fs.s3a.secret.key", "AWS_SECRET_ACCESS_KEY"),
    ("source.options", "sasToken", "AWS_SECRET_ACCESS_KEY"),
    ("spark.conf", "spark.hadoop.fs.s3a.secret.key", "AWS_SECRET_ACCESS_KEY"),
    ("spark.conf", "spark.hadoop.fs.s3a.access.key", "AWS_ACCESS_KEY_ID"),
    ("spark.conf", "spark.hadoop.fs.s3a.session.token", "environment"),
    ("spark.conf", "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net", "environment"),
    ("spark.conf", "spark.hadoop.fs.azure.sas.lake.acct.blob.core.windows.net", "environment"),
    ("spark.conf", "spark.hadoop.fs.azure.account.oauth2.client.secret", "environment"),
    ("spark.conf", "spark.ssl.keyStorePassword", "environment"),
    ("spark.conf", "spark.authenticate.secret", "environment"),
    ("warehouse.storage_options", "aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
    ("warehouse.storage_options", "azure_storage_account_key", "AZURE_STORAGE_ACCOUNT_KEY"),
]


@pytest.mark.parametrize(("field", "key", "instead"), SECRETS, ids=[k for _, k, _ in SECRETS])
def test_a_secret_in_an_options_mapping_is_refused_without_its_value(tmp_path, field, key, instead):
    with pytest.raises(SpecError) as info:
        parse_project(project_with(field, key), source="tables.yaml", base_dir=tmp_path)

    ((_, where, message),) = info.value.problems
    assert where == field
    assert f"{key!r}: secrets are never written in tables.yaml (the value is not shown)" in (
        message
    )
    assert instead in message
    assert SECRET not in str(info.value)


def test_a_models_own_validation_error_does_not_echo_the_secret():
    raw = offline_project()["tables"][0]
    raw["source"] = {**raw["source"], "options": {"password": SECRET}}
    attempts = [
        lambda: TableSpec.model_validate(raw),
        lambda: ConnectionSpec.model_validate({"url": "jdbc:x:y", "properties": {"pwd": SECRET}}),
        lambda: SparkSpec.model_validate({"conf": {"fs.s3a.secret.key": SECRET}}),
        lambda: WarehouseSpec.model_validate(
            {"root": ".", "storage_options": {"aws_session_token": SECRET}}
        ),
    ]
    for attempt in attempts:
        with pytest.raises(ValidationError) as info:
            attempt()
        assert "secrets are never written" in str(info.value)
        assert SECRET not in str(info.value)


def test_harmless_keys_are_accepted_in_every_options_mapping(tmp_path):
    properties = {
        "sslmode": "require",
        "sslrootcert": "/etc/ssl/root.crt",
        "sslkey": "/etc/ssl/client.key",  # a path to the key file, not the key
        "ApplicationName": "loader",
        "options": "-c statement_timeout=600000",
    }
    spark_conf = {
        "spark.jars.packages": "org.postgresql:postgresql:42.7.4",
        "spark.hadoop.fs.s3a.endpoint": "http://minio:9000",
        "spark.hadoop.fs.s3a.aws.credentials.provider": (
            "com.amazonaws.auth.EnvironmentVariableCredentialsProvider"
        ),
        "spark.hadoop.fs.azure.sas.token.provider.type": "org.example.SasProvider",
        "spark.ssl.keyStore": "/etc/spark/keystore.jks",
        "spark.ssl.trustStore": "/etc/spark/truststore.jks",
        "spark.kerberos.keytab": "/etc/spark/loader.keytab",
        "spark.authenticate.secret.file": "/etc/spark/secret",
        "hadoop.security.credential.provider.path": "jceks://file/etc/spark/creds.jceks",
    }
    raw = offline_project(
        options={"queryTimeout": "600", "fetchsize": "5000"},
        connection={"properties": properties},
    )
    raw["spark"] = {"conf": spark_conf}
    raw["warehouse"]["storage_options"] = {"endpoint": "http://minio:9000", "allow_http": "true"}
    raw["tables"].append(
        {
            "name": "events",
            "source": {"format": "csv", "path": "./events", "schema": "id BIGINT, ts TIMESTAMP"},
            "keys": ["id"],
            "watermark": {"column": "ts", "kind": "timestamp"},
            "strategy": "append",
            "partitioning": {"granularity": "daily", "start": "2026-01-01"},
        }
    )
    raw["tables"][1]["source"]["options"] = {"header": "true", "sep": ";"}

    project = parse_project(raw, source="tables.yaml", base_dir=tmp_path)

    assert project.connections["shop"].properties == properties
    assert project.spark.conf == spark_conf
    assert project.tables[0].source.options == {"queryTimeout": "600", "fetchsize": "5000"}
    assert project.tables[1].source.options == {"header": "true", "sep": ";"}
