"""Schema checks that fail a run before anything is read or committed."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from pyspark.sql.types import (
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from incremental_assets.engine.errors import SchemaMismatchError
from incremental_assets.engine.transforms import SYSTEM_COLUMNS
from incremental_assets.specs import TableSpec

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_TIMESTAMPS = (TimestampType, TimestampNTZType)


def check_source_columns(spec: TableSpec, schema: StructType) -> None:
    """Keys, watermark and partition column exist and have usable types."""
    names = schema.fieldNames()
    required = [
        *[(k, "keys") for k in spec.keys],
        (spec.watermark.column, "watermark.column"),
        (spec.partition_column, "partitioning.column"),
    ]
    for column, setting in required:
        if column not in names:
            close = difflib.get_close_matches(column, names, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise SchemaMismatchError(
                spec.name,
                column,
                f"column '{column}' ({setting}) is not in the source; source columns: "
                f"{', '.join(names)}.{hint}",
                f"correct {setting} in the table spec, or add the column to the source",
            )
    wm_type = schema[spec.watermark.column].dataType
    tiebreak = spec.watermark.tiebreak
    if tiebreak and tiebreak not in names:
        raise SchemaMismatchError(
            spec.name,
            tiebreak,
            f"tie-break column '{tiebreak}' (watermark.tiebreak) is not in the source; "
            f"source columns: {', '.join(names)}.",
            "correct watermark.tiebreak in the table spec",
        )
    if tiebreak and not isinstance(schema[tiebreak].dataType, _INTEGRAL):
        raise SchemaMismatchError(
            spec.name,
            tiebreak,
            f"tie-break column '{tiebreak}' is {schema[tiebreak].dataType.simpleString()}; "
            "it must be an integer.",
            "set watermark.tiebreak to an integer column (e.g. the row's id)",
        )
    if spec.watermark.is_time and not isinstance(wm_type, _TIMESTAMPS):
        raise SchemaMismatchError(
            spec.name,
            spec.watermark.column,
            f"watermark column '{spec.watermark.column}' is {wm_type.simpleString()}, "
            f"but watermark.kind is '{spec.watermark.kind}'.",
            "use a timestamp column, or set watermark.kind: id for an integer column",
        )
    if spec.watermark.kind in ("id", "sequence") and not isinstance(wm_type, _INTEGRAL):
        raise SchemaMismatchError(
            spec.name,
            spec.watermark.column,
            f"watermark column '{spec.watermark.column}' is {wm_type.simpleString()}, "
            f"but watermark.kind is '{spec.watermark.kind}' (an integer).",
            "use an integer id column, or set watermark.kind: timestamp",
        )
    part_type = schema[spec.partition_column].dataType
    if not isinstance(part_type, _TIMESTAMPS):
        raise SchemaMismatchError(
            spec.name,
            spec.partition_column,
            f"partition column '{spec.partition_column}' is {part_type.simpleString()}; time "
            "partitions need a timestamp column.",
            "set partitioning.column to a timestamp column",
        )
    for column in names:
        if column in SYSTEM_COLUMNS:
            raise SchemaMismatchError(
                spec.name,
                column,
                f"source column '{column}' uses a name reserved for the loader.",
                "rename or drop it in the source",
            )


def check_against_target(
    spec: TableSpec, incoming: StructType, target: StructType, read_by: Sequence[str] = ()
) -> list[str]:
    """Compare the normalized incoming schema with the target's. Returns new column names.
    ``read_by``: tables that read the target as their source (named in the fix).

    Raises:
        SchemaMismatchError: a shared column changed type, a target column vanished from the
            source, or a new column appeared while ``on_schema_change`` is 'fail'.
    """
    target_types = {f.name: f.dataType for f in target.fields}
    incoming_types = {f.name: f.dataType for f in incoming.fields}
    # A catalog table may have been created by someone else: say which one differs.
    named = f" The target is catalog table {spec.target.table}." if spec.target.table else ""
    for name, dtype in incoming_types.items():
        if name in target_types and target_types[name].simpleString() != dtype.simpleString():
            raise SchemaMismatchError(
                spec.name,
                name,
                f"column '{name}' is {dtype.simpleString()} in the source but "
                f"{target_types[name].simpleString()} in the target." + named,
                "cast it back in the source, or migrate the target table (a type change "
                "is never applied silently)",
            )
    missing = [n for n in target_types if n not in incoming_types]
    if missing:
        raise SchemaMismatchError(
            spec.name,
            missing[0],
            f"target columns {missing} are no longer in the source." + named,
            "restore them in the source, or migrate the target table",
        )
    new = [n for n in incoming_types if n not in target_types]
    if new and spec.on_schema_change == "fail":
        raise SchemaMismatchError(
            spec.name,
            new[0],
            f"new source columns {new} are not in the target.{_read_by(read_by)}" + named,
            new_columns_fix(spec, read_by),
        )
    return new


def new_columns_fix(spec: TableSpec, read_by: Sequence[str]) -> str:
    """What to do about new source columns. Adding them to a target that other tables read
    as their source would change those tables' input too, so the fix then is the spec (the
    target or the source), never ``append_new_columns``."""
    if not read_by:
        return "set on_schema_change: append_new_columns in the table spec to add them"
    return (
        f"if target.path of table '{spec.name}' is meant to be another place, correct it "
        "in the spec; otherwise remove the new columns from the source (e.g. in a view), "
        f"or change this table and {_tables(read_by)} together"
    )


def _read_by(read_by: Sequence[str]) -> str:
    if not read_by:
        return ""
    return (
        f" The target is the source of {_tables(read_by)} (source.path): adding columns to "
        "it changes what they read."
    )


def _tables(names: Sequence[str]) -> str:
    quoted = ", ".join(f"'{n}'" for n in names)
    return f"table {quoted}" if len(names) == 1 else f"tables {quoted}"
