"""The full reload: what a table would hold if the whole source were loaded at once.

Used to prove incremental loads right (the demo and tests compare against it) and as the
baseline the benchmark times incremental runs against.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import changes, transforms
from incremental_assets.engine.delta_store import DeltaTarget
from incremental_assets.engine.load import prepared_rows
from incremental_assets.engine.sources import open_source
from incremental_assets.specs import TableSpec
from incremental_assets.specs.strategies import CdcStrategy


def full_reload_frame(
    spark: SparkSession, spec: TableSpec, source_storage: dict | None = None
) -> DataFrame:
    """Every source row from the table's history start on, one row per key."""
    source = open_source(spark, spec.name, spec.source, dict(source_storage or {}))
    wm = spec.watermark.column
    df = source.read().transform(prepared_rows(spec))
    if spec.watermark.is_time:
        df = df.filter(F.col(transforms.quote(wm)) >= F.lit(spec.partitioning.start))
    # For 'append' (insert-only sources) a key has one version, so this is the same rule.
    newest = df.transform(transforms.newest_per_key(spec.keys, wm))
    if not isinstance(spec.strategy, CdcStrategy):
        return newest
    if spec.strategy.deletes == "hard":
        newest = newest.filter(F.col(changes.OP) != "D")
    return newest.drop(changes.OP)


def business_columns(df: DataFrame) -> DataFrame:
    return df.select(*[c for c in df.columns if c not in transforms.SYSTEM_COLUMNS])


def differences(spark: SparkSession, spec: TableSpec, target: DeltaTarget) -> tuple[int, int]:
    """Rows only in the target, and rows only in the full reload (both 0 when equal)."""
    expected = business_columns(full_reload_frame(spark, spec))
    actual = business_columns(target.to_spark(spark)).select(*expected.columns)
    return actual.exceptAll(expected).count(), expected.exceptAll(actual).count()
