"""The demo: simulated sources loaded round by round through Dagster, then proved equal to
a full reload.

Run it with ``incremental-assets demo`` (the README's ``./dev demo``). It resets ``data/``
and the project's Dagster instance (its folders in the project root, the demo's
``DAGSTER_HOME``), so ``dagster dev`` afterwards shows exactly the demo's runs.

With ``--postgres`` the orders table lives in PostgreSQL (a throwaway server the demo
starts, or the one ``INCREMENTAL_ASSETS_DEMO_PG_URL`` names; see :mod:`shop_database`)
and is loaded over JDBC, with the tables of ``demo/tables_postgres.yaml``.

With ``--s3`` every target (side tables, staging and checkpoints with it) lives in a bucket
of a throwaway S3 server (:mod:`s3_server`); with ``--warehouse URI`` under a warehouse of
your own (``--storage-option KEY=VALUE`` as under ``warehouse.storage_options``,
credentials from the standard environment). The sources stay in ``data/source``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from string import Template

import dagster as dg
import yaml
from pyspark.sql import functions as F

from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.dagster_layer.declared import NO_LATE_ROWS
from incremental_assets.definitions import PROJECT_ROOT, tables_path
from incremental_assets.demo.invoice_csv import InvoiceCsvFeed, hourly_totals
from incremental_assets.demo.s3_server import local_s3
from incremental_assets.demo.shop_database import (
    ORDERS_TABLE,
    PASSWORD_ENV,
    ShopDatabase,
    jdbc_jar,
    shop_database,
)
from incremental_assets.demo.simulator import DeltaOrders, SourceSimulator
from incremental_assets.demo.simulator import day as simulator_day
from incremental_assets.engine.declared_layers import layer_inputs
from incremental_assets.engine.declared_layers.aggregate_layer import aggregate
from incremental_assets.engine.landing import quarantine_dir
from incremental_assets.engine.reload import differences
from incremental_assets.engine.spark_session import start_session
from incremental_assets.specs import ProjectSpec, WarehouseSpec, load_project
from incremental_assets.specs.layers import (
    WINDOW_END,
    WINDOW_START,
    AggregateLayerSpec,
    LayerSpec,
)

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


def main(
    rounds: int = 4,
    root: Path = PROJECT_ROOT,
    postgres: bool = False,
    warehouse: str | None = None,
    storage_options: dict[str, str] | None = None,
    s3: bool = False,
    only: Sequence[str] = (),
) -> int:
    """Run the demo in ``root``; 0 when every table ends equal to a full reload.

    ``only`` (names) runs the demo for those tables only, a landing table with its
    layers; every table when empty (``data/`` and the instance are reset all the same). A
    name the demo does not have, or ``postgres`` without ``orders`` among them, is refused
    before anything is reset (``DemoTablesError``).

    ``warehouse`` (a folder or an ``s3://``/``abfss://`` URI, with its ``storage_options``)
    replaces the tables file's warehouse root for every target; ``s3`` puts it on a
    throwaway local S3 server instead.

    Raises:
        DemoDatabaseUnavailable: with ``postgres``, when no PostgreSQL server can be started
            or reached (the message says what to install or set).
        S3Unavailable: with ``s3``, when moto's server is not installed or does not start.
    """
    # The demo's instance is the project's: dagster.yaml in root, its folders beside it.
    os.chdir(root)
    os.environ["DAGSTER_HOME"] = str(root)
    data = root / "data"
    place = partial(_on_warehouse, warehouse=warehouse, options=storage_options, s3=s3)
    with ExitStack() as stack:
        if not postgres:
            project = load_project(_tables(root))
            _known([t.name for t in project.tables], only)
            _reset(root, data)
            project = place(stack, project, data)
            return _run(project, SourceSimulator(data / "source"), rounds, only=only)

        _known(_template_tables(), only)
        if only and ORDERS not in only:
            raise DemoTablesError(
                f"--postgres puts only {ORDERS} in PostgreSQL: add {ORDERS} to --only, or "
                "leave out --postgres"
            )
        jar = jdbc_jar()  # before anything is reset or started
        database = stack.enter_context(shop_database())
        _reset(root, data)
        database.create_orders_table()
        tables_file = _render_postgres_tables(data, database, jar)
        print(
            f"Orders live in PostgreSQL table {ORDERS_TABLE} ({database.describe()}), "
            f"loaded over JDBC; events and customers are files. Tables: {tables_file}"
        )
        simulator = SourceSimulator(data / "source", orders=database)
        project = place(stack, load_project(tables_file), data)
        with _environment(PASSWORD_ENV, database.password):
            return _run(project, simulator, rounds, database, only=only)


class DemoTablesError(ValueError):
    """``--only`` names a table the demo does not load (or leaves out the one
    ``--postgres`` is about)."""


def _template_tables() -> list[str]:
    """The table names of demo/tables_postgres.yaml (a template, whose ``${...}``
    placeholders are plain YAML strings until the database's settings are filled in)."""
    return [t["name"] for t in yaml.safe_load(POSTGRES_TABLES.read_text())["tables"]]


def _known(declared: list[str], only: Sequence[str]) -> None:
    """Refuse ``only`` names the demo does not load (``declared``, and the landing tables
    it adds)."""
    names = [n for n in declared if n not in LANDING] + list(LANDING)
    unknown = [t for t in only if t not in names]
    if unknown:
        raise DemoTablesError(
            f"--only: the demo has no table {', '.join(map(repr, unknown))}; its tables are "
            f"{', '.join(names)}"
        )


def _tables(root: Path) -> Path:
    """The demo's tables file: INCREMENTAL_ASSETS_TABLES when set, else ``root``'s
    tables.yaml (the project's own for the default root)."""
    return tables_path() if os.environ.get("INCREMENTAL_ASSETS_TABLES") else root / "tables.yaml"


def _on_warehouse(
    stack: ExitStack,
    project: ProjectSpec,
    data: Path,
    warehouse: str | None,
    options: dict[str, str] | None,
    s3: bool,
) -> ProjectSpec:
    """The project with its targets under ``warehouse`` (or a throwaway S3 server's bucket,
    started on ``stack``); unchanged when neither is asked for."""
    if s3:
        warehouse, options = stack.enter_context(local_s3(data))
        print(f"Warehouse on a throwaway S3 server (moto at {options['endpoint']}): {warehouse}")
    elif warehouse is None:
        return project
    elif "://" not in warehouse:
        warehouse = str(Path(warehouse).resolve())
    spec = WarehouseSpec(root=warehouse, storage_options=options or {})
    if not s3:
        print(f"Warehouse: {warehouse} (the sources stay in {data / 'source'})")
    return project.model_copy(update={"warehouse": spec})


# What a Dagster instance keeps under DAGSTER_HOME when dagster.yaml names no folder.
INSTANCE_FOLDERS = ("history", "schedules", "storage", "logs")


def _reset(root: Path, data: Path) -> None:
    print(f"Resetting {data} and the Dagster instance in {root} ({', '.join(INSTANCE_FOLDERS)})")
    shutil.rmtree(data, ignore_errors=True)
    for folder in INSTANCE_FOLDERS:
        shutil.rmtree(root / folder, ignore_errors=True)


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


# The table --postgres keeps in PostgreSQL.
ORDERS = "orders"
INVOICES = "invoices_bronze"
# The CSV invoices of the project's first example and their streaming layer.
INVOICE_CSV = "invoice_headers"
STREAMED = "invoice_totals_hourly"
# Landing tables the demo loads after the day's tables, each then its layers.
LANDING = (INVOICES, INVOICE_CSV)
# The project's own tables file declares the landing tables and their layers.
DEMO_TABLES = PROJECT_ROOT / "tables.yaml"


def layers_after(project: ProjectSpec, table: str) -> list[LayerSpec]:
    """The layers after ``table`` (and after those), in order."""
    after, out = {table}, []
    for layer in project.layers:
        if layer.upstream in after:
            after.add(layer.name)
            out.append(layer)
    return out


def invoice_layers(project: ProjectSpec) -> list[LayerSpec]:
    """The layers after the invoices' bronze table (and after those), in order."""
    return layers_after(project, INVOICES)


def _with_invoices(project: ProjectSpec, simulator: SourceSimulator) -> ProjectSpec:
    """The project plus each landing table and its layers as the project's tables.yaml
    declares them (reading the simulator's folder), unless it has the table."""
    folders = {INVOICES: simulator.invoices_path, INVOICE_CSV: simulator.invoice_csv_path}
    missing = [n for n in LANDING if not any(t.name == n for t in project.tables)]
    if not missing:
        return project
    demo = load_project(DEMO_TABLES)
    tables, layers = list(project.tables), list(project.layers)
    for name in missing:
        table = demo.table(name)
        source = table.source.model_copy(update={"path": folders[name]})
        tables.append(table.model_copy(update={"source": source}))
        layers += layers_after(demo, name)
    return project.model_copy(update={"tables": tables, "layers": layers})


def _run(
    project: ProjectSpec,
    simulator: SourceSimulator,
    rounds: int,
    database: ShopDatabase | None = None,
    only: Sequence[str] = (),
) -> int:
    full = _with_invoices(project, simulator)

    def chosen(name: str) -> bool:
        return not only or name in only

    project = project.model_copy(
        update={"tables": [t for t in project.tables if t.name not in LANDING and chosen(t.name)]}
    )
    defs = build_definitions(full)
    assets = [defs.get_assets_def(spec.name) for spec in project.tables]
    landing = {
        name: [defs.get_assets_def(n) for n in (name, *[x.name for x in layers_after(full, name)])]
        for name in LANDING
        if chosen(name)
    }
    streamed = full.layer(STREAMED)
    assert isinstance(streamed, AggregateLayerSpec) and streamed.window is not None
    late_dropped = 0  # rows the streaming layer's runs report dropped behind its watermark
    resources = defs.resources
    if simulator.orders is None:
        # The orders source is a Delta table written by Spark's Delta Lake, in the session
        # the project's Spark resource starts (the same settings, so the same session).
        session = partial(start_session, dict(resources["spark"].spark_config))
        simulator.orders = DeltaOrders(simulator.orders_path, session)
    started = time.perf_counter()
    # The demo's days are the partitions' first days (tables.yaml: today-4d, so they end
    # yesterday and the UI shows them filled).
    first_day = full.tables[0].partitioning.start

    def day(n: int) -> datetime:
        return simulator_day(n, first_day)

    complete = (datetime.now(UTC) - first_day).days
    if rounds > complete:
        print(
            f"--rounds {rounds} asks for more days than the partitions hold: they start "
            f"{first_day:%Y-%m-%d} (tables.yaml's partitioning.start), so {complete} days have "
            "ended. Lower --rounds, or move start back (e.g. today-7d)."
        )
        return 2

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
            partition = f"{day(n):%Y-%m-%d}"
            if INVOICES in landing:
                dropped = simulator.write_invoices(day(n), n, day(1))
                files = ", ".join(
                    f"{k} ({v} invoices)" if v else f"{k} (corrupt)" for k, v in dropped.items()
                )
                _load_landing(
                    instance,
                    landing[INVOICES],
                    resources,
                    f"invoice files dropped: {files}",
                    partition,
                )
            if INVOICE_CSV in landing:
                window = streamed.window
                csv = simulator.invoice_csv.write_round(day(n), window.size, window.watermark)
                late_dropped += _load_landing(
                    instance,
                    landing[INVOICE_CSV],
                    resources,
                    f"invoice CSV file dropped: {csv.file} ({csv.on_time} invoices of the day; "
                    f"late: {csv.late_within} inside the watermark, {csv.late_dropped} behind it)",
                    partition,
                )

        first, last = f"{day(1):%Y-%m-%d}", f"{day(rounds):%Y-%m-%d}"
        if rounds == 1:
            # Its one partition was read right after its source day was written: nothing
            # has come since that a backfill could load.
            print(f"\nNo backfill: one round (partition {first} has nothing left to load)")
        else:
            print(
                f"\nBackfill of partitions {first}...{last} in one run per table "
                "(loads what no run could read: late rows of a database source; otherwise "
                "it changes nothing)"
            )
            rows = [
                _materialize(instance, assets, resources, spec.name, partition_range=(first, last))
                for spec in project.tables
            ]
            _print_table(rows)

    print("\nChecking every table against a full reload of its source:")
    # The project's settings (connectors for an object-store warehouse included).
    spark = start_session(dict(resources["spark"].spark_config), "incremental-assets-demo-check")
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
    if INVOICES in landing:
        failures += _check_invoices(spark, full, defs.resources["warehouse"])
    if INVOICE_CSV in landing:
        failures += _check_streamed(
            spark, full, streamed, defs.resources["warehouse"], simulator.invoice_csv, late_dropped
        )
    print(
        f"\nDemo finished in {time.perf_counter() - started:.0f}s. "
        "Open the Dagster UI with ./dev ui to see the runs, metadata and checks."
    )
    return 1 if failures else 0


def _load_landing(instance, assets, resources, dropped: str, partition: str) -> int:
    """Bronze for the round's partition (every new file), then its layers (silver, gold,
    a streaming layer); prints what each did. Returns the rows its streaming layers dropped
    as late: their check ``no_late_rows_dropped`` then fails, as the demo means it to (the
    end compares the count with the invoices the simulator wrote behind the watermark);
    any other failed check stops the demo."""
    started = time.perf_counter()
    bronze, *layers = (a.key.to_user_string() for a in assets)
    print(f"  {dropped}")
    run = dg.materialize(
        assets[:1],
        selection=[bronze],
        partition_key=partition,
        instance=instance,
        resources=resources,
        run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
    )
    meta = {k: v.value for k, v in run.asset_materializations_for_node(bronze)[-1].metadata.items()}
    quarantined = [
        c for c in run.get_asset_check_evaluations() if c.check_name == "no_files_quarantined"
    ]
    result = dg.materialize(
        assets[1:],
        instance=instance,
        resources=resources,
        run_config={"loggers": {"console": {"config": {"log_level": "ERROR"}}}},
    )
    failed = [
        f"{c.asset_key.to_user_string()} {c.check_name}"
        for c in result.get_asset_check_evaluations()
        if not c.passed and c.check_name != NO_LATE_ROWS
    ]
    if failed:
        raise SystemExit(f"asset checks failed: {', '.join(failed)}")
    warned = [c for c in quarantined if not c.passed]
    parts = [
        f"{bronze}: {meta['files_loaded']} files loaded, {meta['files_quarantined']} "
        f"quarantined{' (check no_files_quarantined warns)' if warned else ''}, "
        f"{meta['rows_inserted']} rows"
    ]
    late = 0
    for name in layers:
        event = result.asset_materializations_for_node(name)[-1]
        m = {k: v.value for k, v in event.metadata.items()}
        if m.get("run") == "streaming":
            late += m["late_rows_dropped"]
            parts.append(
                f"{name}: {m['batches']} batches, {m['rows_in']} rows in, {m['rows_out']} "
                f"windows written, {m['late_rows_dropped']} late rows dropped"
                + (f" (check {NO_LATE_ROWS} fails, as expected)" if m["late_rows_dropped"] else "")
            )
        elif "windows_recomputed" in m:
            parts.append(f"{name}: windows recomputed {m['windows_recomputed']}")
        else:
            upserted = m["rows_inserted"] + m["rows_updated"]
            parts.append(f"{name}: {upserted} rows upserted, {m['rows_deleted']} deleted")
    print(f"  {'; '.join(parts)} ({time.perf_counter() - started:.1f}s)")
    return late


def _check_invoices(spark, project: ProjectSpec, warehouse) -> int:
    """Each aggregate layer after the invoices equals a from-scratch aggregation of its
    upstream; the corrupt file is quarantined."""
    spec = project.table(INVOICES)
    failures = 0
    for layer in invoice_layers(project):
        if isinstance(layer, AggregateLayerSpec):
            failures += _check_aggregate(spark, project, layer, warehouse)
    folder = quarantine_dir(str(spec.source.path), spec.landing)
    moved = (
        sorted(p for p in os.listdir(folder) if not p.endswith(".reason.txt"))
        if os.path.isdir(folder)
        else []
    )
    corrupt = [p for p in moved if "corrupt" in p]
    print(
        f"  {spec.name:<17} corrupt files quarantined: {', '.join(corrupt) or 'NONE'} (in {folder})"
    )
    return failures + (not corrupt)


def _check_aggregate(spark, project: ProjectSpec, layer: AggregateLayerSpec, warehouse) -> int:
    inputs = layer_inputs(project, layer, warehouse.storage_options())
    held = inputs.target.to_spark(spark)
    scratch = aggregate(layer, inputs.upstream.to_spark(spark))
    columns = [*layer.keys_of_layer, *[a.name for a in layer.aggregates]]
    # Compared with sums rounded to 6 decimals: a sum of doubles depends on the order Spark
    # adds them in, which differs with the files' layout.
    mine, theirs = Counter(comparable(held, columns)), Counter(comparable(scratch, columns))
    extra, missing = (mine - theirs).total(), (theirs - mine).total()
    verdict = "equal" if extra == missing == 0 else "DIFFERENT"
    print(
        f"  {layer.name:<17} {verdict} to a from-scratch aggregation of {layer.upstream} "
        f"({sum(mine.values())} rows; {extra} extra, {missing} missing)"
    )
    return verdict != "equal"


def _check_streamed(
    spark,
    project: ProjectSpec,
    layer: AggregateLayerSpec,
    warehouse,
    feed: InvoiceCsvFeed,
    reported: int,
) -> int:
    """The streaming layer holds the hourly totals of every CSV invoice the simulator wrote
    but those it wrote behind the watermark, and its runs reported as many rows dropped as
    late as it wrote behind the watermark."""
    assert layer.window is not None
    behind = set(feed.dropped)
    expected = hourly_totals([r for r in feed.written if r not in behind], layer.window.size)
    theirs = Counter((*key, total) for key, total in expected.items())
    held = layer_inputs(project, layer, warehouse.storage_options()).target.to_spark(spark)
    # (customer, window start, window end, total_amount), the bounds as UTC datetimes.
    columns = [*layer.group_by, WINDOW_START, WINDOW_END, layer.aggregates[0].name]
    mine = Counter(
        (customer, datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC), total)
        for customer, start, end, total in comparable(_epoch_windows(held), columns)
    )
    extra, missing = (mine - theirs).total(), (theirs - mine).total()
    verdict = "equal" if extra == missing == 0 else "DIFFERENT"
    print(
        f"  {layer.name:<17} {verdict} to the hourly totals of the {len(feed.written)} CSV "
        f"invoices but the {len(behind)} written behind the watermark "
        f"({sum(mine.values())} rows; {extra} extra, {missing} missing)"
    )
    counted = "equal" if reported == len(behind) else "DIFFERENT"
    print(
        f"  {layer.name:<17} late rows dropped: {reported} reported by its runs (check "
        f"{NO_LATE_ROWS}), {len(behind)} written behind the watermark: {counted}"
    )
    return (verdict != "equal") + (counted != "equal")


def _epoch_windows(rows):
    """The layer's rows with their window bounds as seconds since the epoch: Python's
    datetimes of a collect depend on the client's zone, the epoch does not."""
    return rows.withColumns({c: F.unix_timestamp(F.col(c)) for c in (WINDOW_START, WINDOW_END)})


def comparable(rows, columns: list[str]) -> list[tuple]:
    """The ``columns`` of a DataFrame's rows as tuples (doubles rounded to 6 decimals)."""
    return [
        tuple(round(v, 6) if isinstance(v, float) else v for v in (r[c] for c in columns))
        for r in rows.select(*columns).collect()
    ]


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
    if not rows:  # --only named landing tables only
        return
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    print("  " + "  ".join(c.ljust(widths[c]) for c in COLUMNS))
    for row in rows:
        print("  " + "  ".join(str(row[c]).ljust(widths[c]) for c in COLUMNS))
