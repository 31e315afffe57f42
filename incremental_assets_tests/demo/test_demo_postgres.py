"""The demo's ``--postgres`` switch: orders written to a throwaway PostgreSQL, loaded over
JDBC through Dagster, and proved equal to a full reload; without PostgreSQL, a message that
says what to install, and nothing reset. The demo's ``--only``: unknown names refused with
the demo's tables, nothing reset."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from incremental_assets import cli
from incremental_assets.demo import run
from incremental_assets.demo.shop_database import (
    PASSWORD_ENV,
    URL_ENV,
    DemoDatabaseUnavailable,
    shop_database,
)
from incremental_assets.specs import load_project
from incremental_assets.specs.models import ConnectionSpec, relative_day
from incremental_assets_tests.builders import PROJECT_ROOT
from incremental_assets_tests.postgres import JDBC_JAR, skip_or_fail_on_ci


@pytest.fixture
def demo_root(tmp_path, monkeypatch) -> Path:
    shutil.copy(PROJECT_ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def kept(demo_root, monkeypatch) -> Path:
    """A file an earlier demo left in ``data/`` (a refused demo must not reset it), with
    ``incremental-assets demo`` run in ``demo_root`` and its tables.yaml there."""
    shutil.copy(PROJECT_ROOT / "tables.yaml", demo_root / "tables.yaml")
    kept = demo_root / "data" / "kept.txt"
    kept.parent.mkdir()
    kept.write_text("earlier demo")
    real_main = run.main
    monkeypatch.setattr(run, "main", lambda **kw: real_main(**kw, root=demo_root))
    return kept


@pytest.mark.slow
def test_postgres_demo_loads_orders_over_jdbc_and_ends_equal_to_a_full_reload(
    demo_root, capsys, spark
):
    if not Path(JDBC_JAR).exists():
        skip_or_fail_on_ci(f"PostgreSQL's JDBC driver is not at {JDBC_JAR}")
    try:
        # Orders alone, the table --postgres is about. The file-based tables of
        # tables_postgres.yaml are not loaded here: their sources and settings are those of
        # tables.yaml, which test_demo.py loads (only the relative paths' base differs).
        code = run.main(rounds=2, root=demo_root, postgres=True, only=["orders"])
    except DemoDatabaseUnavailable as exc:
        skip_or_fail_on_ci(f"the demo cannot start PostgreSQL: {exc}")

    out = capsys.readouterr().out
    assert code == 0, out
    verdicts = {line.split()[0]: line for line in out.splitlines() if "a full reload (" in line}
    assert set(verdicts) == {"orders"}
    assert "invoice files dropped" not in out  # the landing tables were not asked for
    assert all(" equal to a full reload" in line for line in verdicts.values()), verdicts
    assert "Orders live in PostgreSQL table incremental_assets_demo.orders" in out
    # The window's bounds reached the database: it filtered the rows, not Spark.
    assert "reads of the orders window, filtered by the database itself" in out
    first_day = relative_day("today-4d")  # the demo's first day (tables_postgres.yaml)
    assert f'"updated_at" > \'{first_day:%Y-%m-%d} 21:59:53' in out  # round 2: cursor - 2h
    project = load_project(demo_root / "data" / "tables_postgres.yaml")
    orders = project.table("orders")
    assert orders.source.format == "jdbc"
    assert isinstance(orders.source.connection, ConnectionSpec)
    assert orders.source.connection.password_env == PASSWORD_ENV
    assert {t.source.format for t in project.tables if t.name != "orders"} == {"parquet"}
    assert PASSWORD_ENV not in os.environ  # the generated password was not left behind


def test_postgres_demo_without_postgresql_says_what_to_install_and_resets_nothing(
    demo_root, monkeypatch, capsys, kept
):
    monkeypatch.setenv("INCREMENTAL_ASSETS_PG_BIN", str(demo_root / "no-postgres-here"))
    monkeypatch.setenv("INCREMENTAL_ASSETS_PG_JDBC_JAR", __file__)  # any existing file

    code = cli.main(["demo", "--postgres", "--rounds", "1"])

    error = capsys.readouterr().err
    assert code == 2
    assert "apt-get install postgresql libpostgresql-jdbc-java" in error
    assert URL_ENV in error
    assert kept.exists()


@pytest.mark.parametrize("postgres", [False, True])
def test_a_table_the_demo_does_not_have_is_refused_with_its_tables_and_nothing_reset(
    kept, capsys, postgres
):
    code = cli.main(["demo", "--only", "orders,ordres", *(["--postgres"] if postgres else [])])

    error = capsys.readouterr().err
    assert code == 2
    assert "the demo has no table 'ordres'" in error
    assert "orders, events, customers, customers_history, products" in error
    assert "invoices_bronze" in error
    assert kept.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", " , "], "--only needs table names"),
        (["--only", "events", "--postgres"], "add orders to --only, or leave out --postgres"),
    ],
)
def test_an_empty_only_or_postgres_without_orders_is_refused_and_nothing_reset(
    kept, capsys, argv, message
):
    code = cli.main(["demo", *argv])

    assert code == 2
    assert message in capsys.readouterr().err
    assert kept.exists()


def test_postgres_demo_without_the_jdbc_driver_names_the_package(demo_root, monkeypatch):
    monkeypatch.setenv("INCREMENTAL_ASSETS_PG_JDBC_JAR", str(demo_root / "missing.jar"))

    with pytest.raises(DemoDatabaseUnavailable, match="libpostgresql-jdbc-java"):
        run.main(rounds=1, root=demo_root, postgres=True)


@pytest.mark.parametrize(
    ("url", "password", "message"),
    [
        ("postgresql://demo:pw@localhost/shop", "pw", "must not carry the password"),
        ("postgresql://localhost/shop", "pw", "must look like"),
        ("postgresql://demo@localhost/shop", None, f"set {PASSWORD_ENV}"),
    ],
)
def test_external_database_url_is_refused_with_the_fix(monkeypatch, url, password, message):
    monkeypatch.setenv(URL_ENV, url)
    if password is None:
        monkeypatch.delenv(PASSWORD_ENV, raising=False)
    else:
        monkeypatch.setenv(PASSWORD_ENV, password)

    with pytest.raises(DemoDatabaseUnavailable, match=message), shop_database():
        pass
