"""The demo: simulated sources loaded round by round through Dagster, then proved equal to
a full reload.

Run it with ``incremental-assets demo`` (the README's ``./dev demo``). It resets ``data/``
and the project's Dagster instance (``.dagster/``), so ``dagster dev`` afterwards shows
exactly the demo's runs.

With ``--postgres`` the orders table lives in PostgreSQL (a throwaway server the demo
starts, or the one ``INCREMENTAL_ASSETS_DEMO_PG_URL`` names; see :mod:`shop_database`)
and is loaded over JDBC, with the tables of ``demo/tables_postgres.yaml``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from string import Template

import dagster as dg

from incremental_assets.definitions import PROJECT_ROOT, tables_path
from incremental_assets.defs.build import build_definitions
from incremental_assets.demo.shop_database import (
    ORDERS_TABLE,
    PASSWORD_ENV,
    ShopDatabase,
    jdbc_jar,
    shop_database,
)
from incremental_assets.demo.simulator import SourceSimulator, day
from incremental_assets.engine.reload import differences
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import ProjectSpec, load_project

POSTGRES_TABLES = Path(__file__).with_name("tables_postgres.yaml")
COLUMNS = (
    "table",
    "mode",
    "extracted",
    "inserted",
    "updated",
    "deleted",
    "unchanged",
    "watermark",
    "version",
)


def main(rounds: int = 4, root: Path = PROJECT_ROOT, postgres: bool = False) -> int:
    """Run the demo in ``root``; 0 when every table ends equal to a full reload.

    Raises:
        DemoDatabaseUnavailable: with ``postgres``, when no PostgreSQL server can be started
            or reached (the message says what to install or set).
    """
    # dagster.yaml keeps the instance in .dagster/ relative to the project root.
    os.chdir(root)
    os.environ.setdefault("DAGSTER_HOME", str(root))
    data = root / "data"
    if not postgres:
        project = load_project(tables_path())
        _reset(root, data)
        return _run(project, SourceSimulator(data / "source"), rounds)

    jar = jdbc_jar()  # before anything is reset or started
    with shop_database() as database:
        _reset(root, data)
        database.create_orders_table()
        tables = _render_postgres_tables(data, database, jar)
        print(
            f"Orders live in PostgreSQL table {ORDERS_TABLE} ({database.describe()}), "
            f"loaded over JDBC; events and customers are files. Tables: {tables}"
        )
        simulator = SourceSimulator(data / "source", orders=database)
        with _environment(PASSWORD_ENV, database.password):
            return _run(load_project(tables), simulator, rounds, database)


def _reset(root: Path, data: Path) -> None:
    print(f"Resetting {data} and the Dagster instance in {root / '.dagster'}")
    shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(root / ".dagster", ignore_errors=True)


def _render_postgres_tables(data: Path, database: ShopDatabase, jar: str) -> Path:
    """data/tables_postgres.yaml: the template with this database's URL, user and driver."""
    values = {
        "jdbc_url": database.jdbc_url,
        "user": database.user,
        "password_env": PASSWORD_ENV,
        "jdbc_jar": jar,
        "orders_table": ORDERS_TABLE,
    }
    # JSON strings are YAML strings: any character in a path or URL stays literal.
    text = Template(POSTGRES_TABLES.read_text()).substitute(
        {k: json.dumps(v) for k, v in values.items()}
    )
    path = data / "tables_postgres.yaml"
    data.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` while the demo runs (the connection's password_env, read by
    Dagster's EnvVar), then as before."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _run(
    project: ProjectSpec,
    simulator: SourceSimulator,
    rounds: int,
    database: ShopDatabase | None = None,
) -> int:
    defs = build_definitions(project)
    assets = [defs.get_assets_def(spec.name) for spec in project.tables]
    resources = defs.resources
    started = time.perf_counter()

    with dg.DagsterInstance.get() as instance:
        for n in range(1, rounds + 1):
            summary = simulator.write_day(day(n))
            print(
                f"\nRound {n}: source day {summary.day:%Y-%m-%d}: {summary.orders_new} new "
                f"orders ({summary.orders_burst} sharing one timestamp), "
                f"{summary.orders_updated} updates, {summary.orders_late} late (inside the "
                f"lookback), {summary.orders_very_late} very late; {summary.events} events "
                f"({summary.events_late} for the previous day); {summary.changes} customer "
                f"changes ({summary.changes_deletes} deletes, {summary.changes_held_back} "
                "held back to the next day, out of order); a product export of "
                f"{summary.products} products ({summary.products_new} new, "
                f"{summary.products_repriced} repriced, {summary.products_gone} discontinued)"
            )
            since = database.log_position() if database else None
            rows = [
                _materialize(instance, assets, resources, spec.name, partition=f"{day(n):%Y-%m-%d}")
                for spec in project.tables
            ]
            _print_table(rows)
            if database:
                _print_window_filters(database, since)

        first, last = f"{day(1):%Y-%m-%d}", f"{day(rounds):%Y-%m-%d}"
        print(
            f"\nBackfill of partitions {first}...{last} in one run per table "
            "(loads the rows that arrived later than the lookback)"
        )
        rows = [
            _materialize(instance, assets, resources, spec.name, partition_range=(first, last))
            for spec in project.tables
        ]
        _print_table(rows)

    print("\nChecking every table against a full reload of its source:")
    spark = local_session("incremental-assets-demo-check")
    failures = 0
    for spec in project.tables:
        target = defs.resources["warehouse"].target(project, spec)
        extra, missing = differences(spark, spec, target)
        rows = target.to_spark(spark).count()
        verdict = "equal" if extra == missing == 0 else "DIFFERENT"
        failures += verdict != "equal"
        print(
            f"  {spec.name:<17} {verdict} to a full reload ({rows} rows; {extra} extra, "
            f"{missing} missing)"
        )
    print(
        f"\nDemo finished in {time.perf_counter() - started:.0f}s. "
        "Open the Dagster UI with ./dev ui to see the runs, metadata and checks."
    )
    return 1 if failures else 0


def _print_window_filters(database: ShopDatabase, since: int | None) -> None:
    """What PostgreSQL itself filtered for the orders window (from its statement log)."""
    filters = database.window_filters(since)
    if filters:
        print(
            f"  PostgreSQL's statement log: {len(filters)} reads of the orders window, "
            f"filtered by the database itself, e.g. ... {filters[-1]}"
        )


def _materialize(instance, assets, resources, name, partition=None, partition_range=None):
    tags = {}
    if partition_range:
        tags = {
            "dagster/asset_partition_range_start": partition_range[0],
            "dagster/asset_partition_range_end": partition_range[1],
        }
    result = dg.materialize(
        assets,
        selection=[name],
        partition_key=partition,
        instance=instance,
        resources=resources,
        tags=tags,
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
    )
    event = result.asset_materializations_for_node(name)[-1]
    meta = {k: v.value for k, v in event.metadata.items()}
    failed = [c for c in result.get_asset_check_evaluations() if not c.passed]
    if failed:
        names = ", ".join(c.check_name for c in failed)
        raise SystemExit(f"asset checks failed for {name}: {names}")
    return {
        "table": name,
        "mode": meta["mode"],
        "extracted": meta["rows_extracted"],
        "inserted": meta["rows_inserted"],
        "updated": meta["rows_updated"],
        "deleted": meta["rows_deleted"],
        "unchanged": meta["rows_unchanged"],
        "watermark": meta["watermark_after"],
        "version": meta["delta_version"],
    }


def _print_table(rows: list[dict]) -> None:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    print("  " + "  ".join(c.ljust(widths[c]) for c in COLUMNS))
    for row in rows:
        print("  " + "  ".join(str(row[c]).ljust(widths[c]) for c in COLUMNS))
