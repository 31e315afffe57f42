"""Delta tables named in Spark's catalog (Hive metastore, Unity Catalog) as well as by path.

A target named ``sales.orders`` is one Delta table at one location: Spark reads and writes
it by its name (``MERGE INTO sales.orders``, ``saveAsTable``), and delta-rs reads its log at
the location (cursor, status, sensors), which the spec gives (``target.path``, else
``<warehouse.root>/<name>``). The catalog table is created there as an external table, so
the location is known without asking the catalog: a sensor tick or ``status`` starts no
Spark and opens no metastore. A run checks, with ``DESCRIBE DETAIL``, that the catalog's
table is the one at that location before it writes.

Side tables (tombstones, change log, quarantine, file index) stay paths beside the
location (``<location>__<suffix>``): they are the loader's bookkeeping, read by delta-rs
by path, and keeping them out of the catalog needs no right to create more tables there.

Example:
    >>> sql_table("/wh/orders", "sales.orders")
    '`sales`.`orders`'
    >>> sql_table("/wh/orders", None)
    'delta.`/wh/orders`'
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, DataFrameWriter, SparkSession

from incremental_assets.engine.errors import CatalogTableError
from incremental_assets.specs.locations import same_location


def _quoted(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


def sql_table(path: str, catalog_table: str | None) -> str:
    """How Spark SQL names the table: its catalog name, else ``delta.`<path>```."""
    if catalog_table:
        return ".".join(_quoted(p) for p in catalog_table.split("."))
    return f"delta.{_quoted(path)}"


@dataclass(frozen=True)
class CatalogEntry:
    """What the catalog holds under a name: the table's location and format."""

    location: str
    format: str


def lookup(spark: SparkSession, name: str) -> CatalogEntry | None:
    """The catalog's table ``name`` (None: there is none)."""
    if not spark.catalog.tableExists(name):
        return None
    row = spark.sql(f"DESCRIBE DETAIL {sql_table('', name)}").collect()[0]
    kind = str(row["format"] or "").lower()
    return CatalogEntry(location=_plain(str(row["location"])), format=kind)


def _plain(location: str) -> str:
    """A location as the spec would write it: ``file:/x`` (Hadoop's local URI) as ``/x``."""
    if location.startswith("file:") and not location.startswith("file://"):
        return location.removeprefix("file:")
    return location.removeprefix("file://")


def resolve_source(spark: SparkSession, table: str, name: str) -> str:
    """The location of the Delta table the catalog names ``name`` (a Delta source of table
    ``table``), or CatalogTableError naming it."""
    try:
        entry = lookup(spark, name)
    except AnalysisException as exc:
        entry, detail = None, str(exc).splitlines()[0]
    else:
        detail = "no such table"
    if entry is None:
        raise CatalogTableError(
            table,
            f"source.table {name!r} does not resolve in Spark's catalog ({detail}); nothing "
            "was read or written.",
            "check the name (catalog.schema.table) and that the session uses the catalog it "
            "is in (spark.conf: spark.sql.catalogImplementation=hive, or the catalog's "
            "settings), or name the table by source.path",
        )
    if entry.format != "delta":
        raise CatalogTableError(
            table,
            f"source.table {name!r} is a {entry.format or 'non-Delta'} table, not Delta; "
            "nothing was read or written.",
            "name a Delta table, or read its files with format: parquet and source.path",
        )
    return entry.location


def check_target(spark: SparkSession, table: str, name: str, path: str, exists: bool) -> None:
    """Before a run writes to the target named ``name`` at ``path`` (``exists``: a Delta
    table is there): the catalog's table, if any, must be the Delta table at ``path``; a
    Delta table at ``path`` that the catalog lacks is registered under ``name``. A name
    that is not there yet is created by the first commit (``write``)."""
    _check_schema(spark, table, name)
    entry = lookup(spark, name)
    if entry is None:
        if exists:
            register(spark, name, path)
        return
    if entry.format != "delta":
        raise CatalogTableError(
            table,
            f"target.table {name!r} exists in the catalog as a {entry.format} table, not "
            "Delta; nothing was written.",
            "name another table in target.table, or drop that one",
        )
    if not same_location(entry.location, path):
        raise CatalogTableError(
            table,
            f"target.table {name!r} exists in the catalog at {entry.location}, not at the "
            f"table's location {path}; loading would write to another table than the one "
            "the loader reads its cursor from. Nothing was written.",
            f"set target.path to {entry.location} (to load into that table), or name "
            "another table in target.table",
        )


def _check_schema(spark: SparkSession, table: str, name: str) -> None:
    parts = name.split(".")
    if len(parts) < 2:
        return
    schema = ".".join(parts[:-1])
    if not spark.catalog.databaseExists(schema):
        raise CatalogTableError(
            table,
            f"target.table {name!r}: the catalog has no schema {schema!r}; nothing was written.",
            f"create it (CREATE SCHEMA {schema}) or name an existing schema in target.table",
        )


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def save(
    spark: SparkSession,
    writer: DataFrameWriter,
    path: str,
    catalog_table: str | None,
    creating: bool,
) -> None:
    """Run a Delta DataFrame write: by path, or into the catalog table. A new catalog table
    is written at ``path`` first, then registered there (``CREATE TABLE ... LOCATION``,
    which adds no commit): ``saveAsTable``'s create-as-select drops the writer's commit
    record (``userMetadata``), by which a run finds its commit. A run that dies between
    the two has committed; the next run's ``check_target`` registers the table."""
    if catalog_table is None:
        writer.save(path)
    elif creating:
        writer.save(path)
        register(spark, catalog_table, path)
    else:
        writer.saveAsTable(catalog_table)


def register(spark: SparkSession, name: str, path: str) -> None:
    """The Delta table at ``path`` entered in the catalog as ``name`` (an external table;
    its schema and properties are the log's)."""
    statement = f"CREATE TABLE IF NOT EXISTS {sql_table('', name)} USING delta LOCATION "
    spark.sql(statement + _literal(path))


def read(
    spark: SparkSession, path: str, catalog_table: str | None, version: int | None = None
) -> DataFrame:
    """The table's rows read by Spark's Delta (at ``version``, else the latest)."""
    if catalog_table is None:
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(path)
    at = "" if version is None else f" VERSION AS OF {int(version)}"
    return spark.sql(f"SELECT * FROM {sql_table(path, catalog_table)}{at}")
