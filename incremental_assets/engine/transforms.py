"""DataFrame -> DataFrame steps of a load: time zones, row hashes, newest version per key."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    DataType,
    MapType,
    StructType,
    TimestampNTZType,
    VariantType,
)

from incremental_assets.engine.errors import SchemaMismatchError

ROW_HASH = "_ia_row_hash"
"""Content hash of a row's source columns: detects unchanged rows and breaks watermark ties."""

ROW_HASH_VERSION = "incremental_assets.row_hash"
"""The key, in the row hash column's metadata, of the way a table's hashes were computed."""

LATEST_ROW_HASH = 2
"""1: the row's JSON hashed (tables created before version 2 keep it: their hashes are
compared with new rows' ones); 2: the values hashed directly, about 3x cheaper."""

KEY_RANGE = "_ia_key_range"
"""The range of the first key a created table's rows are shuffled by (engine/spark/
key_ranges.py); never written."""

SYSTEM_COLUMNS = (ROW_HASH, KEY_RANGE)


def naive_timestamp_columns(df: DataFrame) -> list[str]:
    return [f.name for f in df.schema.fields if isinstance(f.dataType, TimestampNTZType)]


def to_utc_instants(source_timezone: str):
    """Interpret every zone-less timestamp column as wall-clock time in ``source_timezone``.

    Spark's session zone is UTC, so casting a naive value to ``timestamp`` reads it as UTC;
    ``to_utc_timestamp`` then shifts it from the source's zone. Columns that already hold
    instants are left alone.
    """

    def transform(df: DataFrame) -> DataFrame:
        for name in naive_timestamp_columns(df):
            instant = F.col(_quote(name)).cast("timestamp")
            if source_timezone != "UTC":
                instant = F.to_utc_timestamp(instant, source_timezone)
            df = df.withColumn(name, instant)
        return df

    return transform


def row_hash_version(fields: Iterable | None, table: str = "") -> int:
    """The row hash of a table (``table``) whose schema's fields are ``fields`` (Spark's
    or delta-rs's: each has a name and metadata): the version its creating run recorded in
    the hash column's metadata, 1 for a table created before it was recorded, the latest
    for a table not created yet (``fields`` None) or one without hashes.

    Raises:
        SchemaMismatchError: a version this release does not know (a table created by a
            later release): its rows would be compared with hashes computed another way.
    """
    for field in fields or ():
        if field.name != ROW_HASH:
            continue
        recorded = (field.metadata or {}).get(ROW_HASH_VERSION, 1)
        try:
            version = int(recorded)
        except (TypeError, ValueError):
            version = 0
        if not 1 <= version <= LATEST_ROW_HASH:
            raise SchemaMismatchError(
                table,
                ROW_HASH,
                f"its {ROW_HASH} column records row hash version {recorded!r} (in the "
                f"column's metadata, {ROW_HASH_VERSION}); this release hashes rows by "
                f"versions 1 to {LATEST_ROW_HASH} only, and its runs compare stored hashes "
                "with their own.",
                "load the table with the release that created it, or drop the table and "
                "its side tables and load it again.",
            )
        return version
    return LATEST_ROW_HASH


def with_row_hash(exclude: Sequence[str] = (), version: int = LATEST_ROW_HASH):
    """Add a 64-bit hash of the row's source columns. A null column adds nothing to it, so
    a column added to the source (null in earlier rows) leaves earlier rows' hashes as they
    were; a non-null one adds its name's checksum and its value, so nulls in different
    columns hash differently. Version 1 hashed the row's JSON (which leaves out null
    fields): the same rule, 3-4x the cost. The column records its version in its metadata,
    so the table a run creates keeps it (``row_hash_version``)."""

    def transform(df: DataFrame) -> DataFrame:
        columns = [c for c in df.columns if c not in exclude and c not in SYSTEM_COLUMNS]
        if version == 1:
            payload = F.to_json(F.struct(*[F.col(_quote(c)) for c in columns]))
            return df.withColumn(ROW_HASH, F.xxhash64(payload))
        schema, parts = df.schema, []
        for name in columns:
            value = F.col(_quote(name))
            if _nested(schema[name].dataType):
                value = F.to_json(value)
            # xxhash64 skips nulls: a null column adds neither its name nor its value.
            parts += [F.when(value.isNotNull(), F.lit(zlib.crc32(name.encode()))), value]
        hashed = df.withColumn(ROW_HASH, F.xxhash64(*parts) if parts else F.lit(0).cast("long"))
        return hashed.withMetadata(ROW_HASH, {ROW_HASH_VERSION: version})

    return transform


def _nested(data_type: DataType) -> bool:
    """A value Spark's hash functions refuse (maps, variants), or whose null elements or
    fields they would skip ((1, null) and (null, 1) alike): hashed as its JSON."""
    return isinstance(data_type, (ArrayType, MapType, StructType, VariantType))


def newest_per_key(keys: Sequence[str], order_by: str):
    """Keep one row per key: the highest ``order_by`` value, ties broken by the row hash so
    the choice does not depend on the order rows arrived in."""

    def transform(df: DataFrame) -> DataFrame:
        rank = Window.partitionBy(*[F.col(_quote(k)) for k in keys]).orderBy(
            F.col(_quote(order_by)).desc(), F.col(ROW_HASH).desc()
        )
        return (
            df.withColumn("_ia_rank", F.row_number().over(rank))
            .filter(F.col("_ia_rank") == 1)
            .drop("_ia_rank")
        )

    return transform


def ordered_columns(keys: Sequence[str], watermark: str):
    """Keys first, then the watermark: Delta keeps min/max statistics for leading columns,
    which is what lets a merge skip files."""

    def transform(df: DataFrame) -> DataFrame:
        lead = [*keys, *([watermark] if watermark not in keys else [])]
        rest = [c for c in df.columns if c not in lead]
        return df.select(*[F.col(_quote(c)) for c in [*lead, *rest]])

    return transform


def null_count(column: str) -> Column:
    return F.sum(F.when(F.col(_quote(column)).isNull(), 1).otherwise(0))


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


quote = _quote
