"""What every strategy does to a window's rows on their way to the stage: quality rules,
counts observed as the rows are written, quarantine diversion, staged copies."""

from __future__ import annotations

import pyarrow.dataset as pads
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import changes, quality, transforms
from incremental_assets.engine.errors import IncrementalLoadError, NullValuesError
from incremental_assets.engine.snapshots import CHANGE
from incremental_assets.engine.time_limits import time_limited
from incremental_assets.specs import TableSpec


def checked(spec: TableSpec, rows: DataFrame) -> DataFrame:
    """The rows with each quality rule's result and the names of the rules each fails
    (when there are rules); ``observed`` counts the results and drops them."""
    if not spec.quality.rules:
        return rows
    return quality.judged(spec.name, rows, spec.quality.rules)


def observed(spec: TableSpec, rows: DataFrame) -> tuple[DataFrame, Observation]:
    """Count rows, null keys, unknown CDC operations, quality-rule failures (and null
    results) and the partition column's maximum as the rows are written (no second pass
    over the source). The rules' results are dropped after counting; the names of the
    rules a row fails are kept for the quarantine."""
    observation = Observation(f"extract_{spec.name}")
    rules = spec.quality.rules if quality.FAILED in rows.columns else []
    nulls = quality.RESULTS in rows.columns
    checked = [*spec.keys, *([spec.effective_column] if spec.history else [])]
    observed = rows.observe(
        observation,
        F.count(F.lit(1)).alias("rows"),
        *[transforms.null_count(k).alias(f"null:{k}") for k in dict.fromkeys(checked)],
        F.max(F.unix_micros(F.col(transforms.quote(spec.partition_column)))).alias("pc_max"),
        *([transforms.null_count(changes.OP).alias("unknown_ops")] if spec.feed else []),
        *(quality.counters(rules, nulls=nulls) if rules else []),
    )
    return observed.drop(quality.RESULTS), observation


def checked_in_time(
    spark: SparkSession, spec: TableSpec, rows: DataFrame, stage_root: str, name: str
) -> tuple[DataFrame, Observation]:
    """The rows checked against the quality rules and counted (``observed``), staged at
    ``<stage_root>/<name>`` by one Spark job that runs under ``quality.rule_timeout``.

    Raises:
        RuleTimeoutError: the job ran past the limit and was cancelled.
    """
    with time_limited(spark, spec.quality.rule_timeout, lambda: quality.timed_out(spec)):
        rows, observation = observed(spec, checked(spec, rows))
        return staged(rows, stage_root, name), observation


def divert(spec: TableSpec, checked: DataFrame, stage_root: str, run_id: str) -> DataFrame:
    """Stage the rows that fail a quarantine rule apart (with the rules they failed, the run
    and the time) and return the others, without the rule names. ``checked`` is a staged
    copy (``checked_in_time``): both parts come from it, so the window is read once."""
    rules = spec.quality.rules
    if not any(r.action == "quarantine" for r in rules):
        return checked.drop(quality.FAILED)
    diverted = quality.diverted(rules)
    (
        checked.filter(diverted)
        .withColumn(quality.RUN_ID, F.lit(run_id))
        .withColumn(quality.QUARANTINED_AT, F.current_timestamp())
        .write.mode("overwrite")
        .parquet(f"{stage_root}/quarantine")
    )
    return checked.filter(~diverted).drop(quality.FAILED)


def staged(rows: DataFrame, stage_root: str, name: str) -> DataFrame:
    path = f"{stage_root}/{name}"
    rows.write.mode("overwrite").parquet(path)
    return rows.sparkSession.read.parquet(path)


def fail_on_bad_rows(spec: TableSpec, observed: dict) -> None:
    _fail_on_null_keys(spec, observed)
    _fail_on_unknown_operations(spec, observed)
    rules = spec.quality.rules
    if rules:
        quality.fail_on_failed_rules(spec.name, rules, quality.report(rules, observed, 0))


def _fail_on_unknown_operations(spec: TableSpec, observed: dict) -> None:
    unknown = int(observed.get("unknown_ops") or 0)
    if unknown:
        feed = spec.feed
        assert feed is not None
        raise IncrementalLoadError(
            spec.name,
            f"{unknown} change rows carry an operation code that is not one of "
            f"{changes.EXPECTED[feed.encoding]} (column "
            f"'{feed.operation_column}', encoding '{feed.encoding}').",
            "correct strategy.encoding / strategy.operation, or fix the feed",
        )


def _fail_on_null_keys(spec: TableSpec, observed: dict) -> None:
    counts = {k: int(observed[f"null:{k}"]) for k in spec.keys if observed[f"null:{k}"]}
    if counts:
        raise NullValuesError(
            spec.name,
            counts,
            "fill the key columns in the source, or choose keys that are never null",
        )
    effective = spec.effective_column if spec.history else None
    if effective and observed.get(f"null:{effective}"):
        raise NullValuesError(
            spec.name,
            {effective: int(observed[f"null:{effective}"])},
            f"fill '{effective}' (the time a change took effect), or set "
            "strategy.effective to a column that is never null",
        )


def count_staged(path: str) -> int:
    return pads.dataset(path, format="parquet").count_rows()


def change_counts(staged_path: str, names: tuple[str, ...]) -> dict[str, int]:
    """Staged rows per kind of change (``names``), for snapshot and history tables."""
    kinds = pads.dataset(staged_path, format="parquet").to_table(columns=[CHANGE]).column(0)
    counts = {str(v["values"]): int(v["counts"]) for v in kinds.value_counts().to_pylist()}
    return {name: counts.get(name, 0) for name in names}
