"""Schema evolution of landing files: which columns the pending files bring, before any read.

The schema a landing run reads with is ``source.schema`` (for Parquet without one: bronze's
columns, else the first file's), plus the columns bronze gained from earlier files, plus
the new columns of the pending files when the table's ``on_schema_change`` is
``append_new_columns``. A new column under ``fail``, or a column whose type changed, fails
the run before anything is read into bronze or recorded in the file index, naming the file.

How each format tells its columns:

- Parquet: each file's footer (exact, per file).
- CSV: each file's header line (files are read per header and lined up by name); a new
  column lands as STRING. A value that no longer parses is a malformed row (the file is
  quarantined), not a type change.
- JSON lines: one Spark schema inference over the pending files (fields that are null in
  every row are left out, so a missing value is not a change); only when it finds a
  change, one inference per file names the files that bring it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import BinaryIO

import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    MapType,
    NullType,
    NumericType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    _parse_datatype_string,
)

from incremental_assets.engine.errors import SchemaMismatchError
from incremental_assets.engine.landing_folder import spark_path
from incremental_assets.engine.validation import new_columns_fix
from incremental_assets.specs import TableSpec
from incremental_assets.specs.landing import FILE_KEYS, INGESTED_AT

_LOADER_COLUMNS = (*FILE_KEYS, INGESTED_AT)
_INFERRED_CORRUPT = "_corrupt_record"


Opener = Callable[[str], BinaryIO]
"""Opens a file read by a run as bytes (a local file, or an object through the landing
folder's handler)."""


@dataclass(frozen=True)
class Change:
    """A column of one file that the table does not have yet, or has with another type."""

    file: str
    column: str
    old: DataType | None
    new: DataType

    @property
    def is_new(self) -> bool:
        return self.old is None


def declared_schema(spec: TableSpec) -> StructType | None:
    ddl = spec.source.schema_ddl
    if not ddl:
        return None
    parsed = _parse_datatype_string(ddl)
    assert isinstance(parsed, StructType)
    return parsed


def known_schema(spec: TableSpec, bronze: StructType | None) -> StructType | None:
    """What the table reads today: the declared columns, then those bronze gained since."""
    declared = declared_schema(spec)
    data = [f for f in bronze.fields if f.name not in _LOADER_COLUMNS] if bronze else []
    if declared is None:
        return StructType(data) if data else None
    names = set(declared.fieldNames())
    return StructType([*declared.fields, *[f for f in data if f.name not in names]])


def read_schema(
    spark: SparkSession,
    spec: TableSpec,
    bronze: StructType | None,
    paths: list[str],
    names: Mapping[str, str] | None = None,
    read_by: Sequence[str] = (),
    opener: Opener | None = None,
) -> StructType:
    """The schema to read ``paths`` with; ``names`` maps a path read to the file it is a
    copy of (an object-store file), for messages; ``read_by``: tables that read bronze as
    their source (named in the fix for new columns); ``opener``: opens a path read as
    bytes (a Parquet footer, a CSV header; default: the local file).

    Raises:
        SchemaMismatchError: a column changed type, or a new column appeared while
            ``on_schema_change`` is 'fail'.
    """
    known = known_schema(spec, bronze)
    fmt = spec.source.format
    if fmt == "parquet":
        opened = opener or _open_local
        per_file = {p: from_arrow_schema(pq.read_schema(opened(p))) for p in paths}
        if known is None and paths:
            known = per_file[paths[0]]
        assert known is not None
        changes = [c for p, s in per_file.items() for c in compare(p, known, s)]
    elif fmt == "csv":
        assert known is not None
        changes = _csv_changes(spec, known, paths, opener)
    else:
        assert known is not None
        changes = _json_changes(spark, spec, known, paths)
    if names:
        changes = [replace(c, file=names.get(c.file, c.file)) for c in changes]
    return evolve(spec, known, changes, read_by)


def evolve(
    spec: TableSpec, known: StructType, changes: list[Change], read_by: Sequence[str] = ()
) -> StructType:
    """``known`` plus the new columns, or the error that the changes call for."""
    changed = [c for c in changes if not c.is_new]
    if changed:
        first = changed[0]
        others = sorted({c.file for c in changed if c.column == first.column} - {first.file})
        also = f" (also in {len(others)} other files: {', '.join(others[:5])})" if others else ""
        raise SchemaMismatchError(
            spec.name,
            first.column,
            f"file {first.file}: column '{first.column}' changed type from "
            f"{first.old.simpleString()} to {first.new.simpleString()}{also}; nothing was "
            "loaded.",
            "write the column with its old type again (or move the file out of the landing "
            "folder), or migrate the table; a type change is never applied silently",
        )
    added: dict[str, Change] = {}
    for change in changes:
        added.setdefault(change.column, change)
    if not added:
        return known
    if spec.on_schema_change == "fail":
        first = next(iter(added.values()))
        raise SchemaMismatchError(
            spec.name,
            first.column,
            f"file {first.file}: new columns {sorted(added)} are not in the table; nothing "
            "was loaded.",
            "set on_schema_change: append_new_columns in the table spec to add them to the "
            "table (earlier rows null), or add them to source.schema"
            if not read_by
            else new_columns_fix(spec, read_by),
        )
    return StructType(
        [*known.fields, *[StructField(c.column, c.new, True) for c in added.values()]]
    )


def compare(file: str, known: StructType, incoming: StructType) -> list[Change]:
    """The columns of ``incoming`` that are new to ``known`` or of a type it cannot read
    as its own (a column missing from the file is not a change: its rows are null)."""
    types = {f.name: f.dataType for f in known.fields}
    changes = []
    for field in incoming.fields:
        if field.name == _INFERRED_CORRUPT or field.name in _LOADER_COLUMNS:
            continue
        old = types.get(field.name)
        if old is None:
            if not isinstance(field.dataType, NullType):
                changes.append(Change(file, field.name, None, field.dataType))
        elif not readable_as(field.dataType, old):
            changes.append(Change(file, field.name, old, field.dataType))
    return changes


def readable_as(found: DataType, declared: DataType) -> bool:
    """Whether values written as ``found`` read as ``declared`` without loss of meaning:
    integers as any number, any scalar as a string, structs field by field (a struct that
    gains a field is a changed type), arrays and maps by their elements."""
    if isinstance(found, NullType) or found == declared:
        return True
    if isinstance(declared, StructType):
        if not isinstance(found, StructType):
            return isinstance(found, MapType)
        types = {f.name: f.dataType for f in declared.fields}
        return all(f.name in types and readable_as(f.dataType, types[f.name]) for f in found)
    if isinstance(declared, ArrayType):
        return isinstance(found, ArrayType) and readable_as(found.elementType, declared.elementType)
    if isinstance(declared, MapType):
        if isinstance(found, StructType):
            return all(readable_as(f.dataType, declared.valueType) for f in found.fields)
        return isinstance(found, MapType) and readable_as(found.valueType, declared.valueType)
    if isinstance(found, (StructType, ArrayType, MapType)):
        return False
    if isinstance(declared, StringType):
        return True
    if isinstance(declared, IntegralType):
        return isinstance(found, IntegralType)
    if isinstance(declared, (FloatType, DoubleType, DecimalType)):
        return isinstance(found, NumericType)
    if isinstance(declared, (TimestampType, TimestampNTZType, DateType)):
        return isinstance(found, (StringType, TimestampType, TimestampNTZType, DateType))
    if isinstance(declared, BooleanType):
        return isinstance(found, BooleanType)
    return type(found) is type(declared)


def _json_changes(
    spark: SparkSession, spec: TableSpec, known: StructType, paths: list[str]
) -> list[Change]:
    if not paths:
        return []
    merged = _infer_json(spark, spec, paths)
    if not compare("", known, merged):
        return []
    # Rare: name the files that bring the change, one inference each.
    return [c for p in paths for c in compare(p, known, _infer_json(spark, spec, [p]))]


def _infer_json(spark: SparkSession, spec: TableSpec, paths: Iterable[str]) -> StructType:
    options: Mapping[str, str] = dict(spec.source.options)
    return (
        spark.read.options(**options)
        .options(mode="PERMISSIVE", dropFieldIfAllNull="true", samplingRatio="1.0")
        .json([spark_path(p) for p in paths])
        .schema
    )


def csv_header(spec: TableSpec, path: str, opener: Opener | None = None) -> list[str] | None:
    """The column names on a CSV file's first line (None without ``header``); ``opener``
    opens ``path`` as bytes (default: the local file)."""
    options = spec.source.options
    if str(options.get("header", "true")).lower() != "true":
        return None  # no header: the columns are positional by definition
    separator = str(options.get("sep", options.get("delimiter", ",")))
    encoding = str(options.get("encoding", "utf-8"))
    with io.TextIOWrapper((opener or _open_local)(path), encoding=encoding, newline="") as text:
        first = text.readline()
    return [h.strip() for h in next(csv.reader(io.StringIO(first), delimiter=separator), [])]


def _open_local(path: str) -> BinaryIO:
    return open(path, "rb")


def _csv_changes(
    spec: TableSpec, known: StructType, paths: list[str], opener: Opener | None
) -> list[Change]:
    names = known.fieldNames()
    changes: list[Change] = []
    for path in paths:
        header = csv_header(spec, path, opener)
        if header is None:
            return []
        unknown = [h for h in header if h not in names]
        if len(set(header)) != len(header):
            raise SchemaMismatchError(
                spec.name,
                header[0],
                f"file {path}: CSV header {header} names a column twice; nothing was loaded.",
                "give each column one name in the file",
            )
        changes += [Change(path, h, None, StringType()) for h in unknown]
    return changes
