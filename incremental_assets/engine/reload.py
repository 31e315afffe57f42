"""The full reload: what a table would hold if the whole source were loaded at once.

Used to prove incremental loads right (the demo and tests compare against it) and as the
baseline the benchmark times incremental runs against.
"""

from __future__ import annotations

from datetime import datetime, timezone

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import changes, history, transforms
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.load import history_columns, prepared_rows
from incremental_assets.engine.sources import open_source
from incremental_assets.specs import TableSpec
from incremental_assets.specs.models import SNAPSHOT_AT
from incremental_assets.specs.strategies import CdcStrategy


def full_reload_frame(
    spark: SparkSession,
    spec: TableSpec,
    source_storage: dict | None = None,
    row_hash: int = transforms.LATEST_ROW_HASH,
) -> DataFrame:
    """Every source row from the table's history start on, one row per key (a history
    table: every version). A snapshot table's reload is its source's current state; a
    history of snapshots cannot be rebuilt, so its reload is the current versions."""
    source = open_source(spark, spec.name, spec.source, dict(source_storage or {}))
    wm = spec.watermark.column
    # Hashed as the target's rows (``row_hash``): the hash breaks ties of the watermark.
    df = source.read().transform(prepared_rows(spec, datetime.now(timezone.utc), row_hash))
    if spec.watermark.is_time and not spec.takes_snapshots:
        df = df.filter(F.col(transforms.quote(wm)) >= F.lit(spec.partitioning.start))
    if spec.history and not spec.takes_snapshots:
        if changes.OP not in df.columns:
            df = df.withColumn(changes.OP, F.lit("U"))
        return history.versions(df, history_columns(spec, df.columns))
    # For 'append' (insert-only sources) a key has one version, so this is the same rule.
    newest = df.transform(transforms.newest_per_key(spec.keys, wm))
    if not isinstance(spec.strategy, CdcStrategy):
        return newest
    if spec.strategy.deletes == "hard":
        newest = newest.filter(F.col(changes.OP) != "D")
    return newest.drop(changes.OP)


def business_columns(df: DataFrame) -> DataFrame:
    hidden = (*transforms.SYSTEM_COLUMNS, SNAPSHOT_AT)
    return df.select(*[c for c in df.columns if c not in hidden])


def comparable_target(spec: TableSpec, target: DataFrame) -> DataFrame:
    """The target rows a full reload can reproduce: a snapshot table's live rows (without
    soft-delete flags), a snapshot-fed history's current versions."""
    if spec.takes_snapshots and spec.history:
        scd2 = spec.history
        current = target.filter(F.col(transforms.quote(scd2.is_current)))
        return current.drop(scd2.valid_from, scd2.valid_to, scd2.is_current)
    if spec.takes_snapshots and changes.IS_DELETED in target.columns:
        live = target.filter(~F.col(changes.IS_DELETED))
        return live.drop(changes.IS_DELETED, changes.DELETED_AT)
    return target


def differences(spark: SparkSession, spec: TableSpec, target: DeltaTarget) -> tuple[int, int]:
    """Rows only in the target, and rows only in the full reload (both 0 when equal)."""
    row_hash = target.state(spec.watermark.kind).row_hash
    expected = business_columns(full_reload_frame(spark, spec, row_hash=row_hash))
    actual = business_columns(comparable_target(spec, target.to_spark(spark)))
    actual = actual.select(*[F.col(transforms.quote(c)) for c in expected.columns])
    return actual.exceptAll(expected).count(), expected.exceptAll(actual).count()
