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
a type Delta keeps no minimum and maximum of (a boolean)."""

from __future__ import annotations

from collections.abc import Sequence

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


def stats_options(
    schema: StructType, needed: Sequence[str], partition_by: Sequence[str] = ()
) -> dict[str, str]:
    """The table property that keeps statistics of the ``needed`` columns of a new table of
    ``schema`` (partitioned by ``partition_by``), when Delta's first 32 leaf columns leave
    one out; else nothing. Only columns whose type Delta keeps statistics of are named
    (Delta refuses the property otherwise), so a needed column of another type keeps
    Delta's default. Other columns of those types, named or not, lose their statistics
    (a boolean its null count) once the property is set."""
    partitions = {c.lower() for c in partition_by}  # Delta compares them so
    fields = [f for f in schema.fields if f.name.lower() not in partitions]
    indexed, leaves = set(), 0
    for f in fields:
        leaves += _leaves(f.dataType)
        if leaves > INDEXED_LEAVES:
            break
        indexed.add(f.name)
    eligible = {f.name for f in fields if _eligible(f.dataType)}
    present = {f.name for f in fields}
    if any(c in present and c not in eligible for c in needed):
        # Named, it would lose what Delta keeps of it by default (a boolean's null count,
        # which the keys_not_null check and Z-ordering read): the default stays.
        return {}
    wanted = [c for c in dict.fromkeys(needed) if c in eligible]
    if all(c in indexed for c in wanted):
        return {}
    named = list(wanted)
    for f in fields:
        if len(named) >= INDEXED_LEAVES:
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
