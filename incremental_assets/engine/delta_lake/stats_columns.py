"""Which columns a new table keeps file statistics of.

Delta keeps statistics for a table's first 32 leaf columns, partition columns not counted
(``delta.dataSkippingNumIndexedCols``). The engine reads the statistics of a few columns
to avoid a Spark job: the keys (the files a merge may touch, the keys_not_null check), the
watermark, the partition column and a soft-delete table's ``deleted_at`` (the delete
guard's live rows). Keys and watermark come first in a target, but a wide table's
partition column may not, and ``deleted_at`` comes last: past the 32nd column they get no
statistics, and each of those shortcuts falls back to reading the table.

For such a table, ``delta.dataSkippingStatsColumns`` names the columns instead: the ones
the engine reads, then the leading columns up to 32. A table whose needed columns are
among its first 32 gets no property (Delta's default holds), and so does one with a key of
a type Delta keeps no minimum and maximum of (a boolean).

A session default (``spark.databricks.delta.properties.defaults.*``) is Delta's default
for the tables the session creates: a count of indexed columns there replaces the 32 (-1:
every column), and a list of statistics columns there is left to rule alone."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import SparkSession
from pyspark.sql.types import (
    DataType,
    DateType,
    NumericType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

STATS_COLUMNS = "delta.dataSkippingStatsColumns"
# Delta's default delta.dataSkippingNumIndexedCols.
INDEXED_LEAVES = 32
# Where a Spark session sets the table properties of the Delta tables it creates.
_DEFAULTS = "spark.databricks.delta.properties.defaults."


def session_indexed(spark: SparkSession) -> int | None:
    """How many leading leaf columns a table created in this session keeps statistics of:
    Delta's 32, or the session's default ``dataSkippingNumIndexedCols`` (-1: all of them);
    None when the session's default names the statistics columns itself."""
    conf = spark.conf
    if (conf.get(_DEFAULTS + "dataSkippingStatsColumns", None) or "").strip():
        return None
    value = conf.get(_DEFAULTS + "dataSkippingNumIndexedCols", None)
    try:
        return INDEXED_LEAVES if value is None else int(str(value).strip())
    except ValueError:  # Delta refuses it when the table is created: its error says why
        return INDEXED_LEAVES


def stats_options(
    schema: StructType,
    needed: Sequence[str],
    partition_by: Sequence[str] = (),
    indexed: int | None = INDEXED_LEAVES,
) -> dict[str, str]:
    """The table property that keeps statistics of the ``needed`` columns of a new table of
    ``schema`` (partitioned by ``partition_by``), when the first ``indexed`` leaf columns
    (``session_indexed``) leave one out; else nothing (also when ``indexed`` is None or
    negative: the session's defaults rule). Only columns whose type Delta keeps
    statistics of are named (Delta refuses the property otherwise), so a needed column
    of another type keeps Delta's default. Other columns of those types, named or not,
    lose their statistics (a boolean its null count) once the property is set."""
    if indexed is None or indexed < 0:
        return {}
    partitions = {c.lower() for c in partition_by}  # Delta compares them so
    fields = [f for f in schema.fields if f.name.lower() not in partitions]
    covered, leaves = set(), 0
    for f in fields:
        leaves += _leaves(f.dataType)
        if leaves > indexed:
            break
        covered.add(f.name)
    eligible = {f.name for f in fields if _eligible(f.dataType)}
    present = {f.name for f in fields}
    if any(c in present and c not in eligible for c in needed):
        # Named, it would lose what Delta keeps of it by default (a boolean's null count,
        # which the keys_not_null check and Z-ordering read): the default stays.
        return {}
    wanted = [c for c in dict.fromkeys(needed) if c in eligible]
    if all(c in covered for c in wanted):
        return {}
    named = list(wanted)
    for f in fields:
        if len(named) >= indexed:
            break
        if f.name in eligible and f.name not in named:
            named.append(f.name)
    return {STATS_COLUMNS: ",".join(_quoted(c) for c in named)}


def _leaves(kind: DataType) -> int:
    if isinstance(kind, StructType):
        return sum(_leaves(f.dataType) for f in kind.fields)
    return 1


def _eligible(kind: DataType) -> bool:
    """Delta's SkippingEligibleDataType, for a top-level column (a struct is left out:
    Delta refuses it when any of its fields is not eligible)."""
    return isinstance(kind, NumericType | DateType | TimestampType | TimestampNTZType | StringType)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
