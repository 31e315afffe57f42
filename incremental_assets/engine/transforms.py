"""DataFrame -> DataFrame steps of a load: time zones, row hashes, newest version per key."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampNTZType

ROW_HASH = "_ia_row_hash"
"""Content hash of a row's source columns: detects unchanged rows and breaks watermark ties."""

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


def with_row_hash(exclude: Sequence[str] = ()):
    """Add a 64-bit hash of the row's source columns (JSON-encoded, so nulls in different
    columns hash differently)."""

    def transform(df: DataFrame) -> DataFrame:
        columns = [c for c in df.columns if c not in exclude and c not in SYSTEM_COLUMNS]
        payload = F.to_json(F.struct(*[F.col(_quote(c)) for c in columns]))
        return df.withColumn(ROW_HASH, F.xxhash64(payload))

    return transform


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
