"""Asset checks on every table, evaluated in the materializing step (one Spark session)."""

from __future__ import annotations

import dagster as dg

from incremental_assets.engine import checks, quality
from incremental_assets.engine.delta_store import DeltaTarget
from incremental_assets.engine.load import LoadResult
from incremental_assets.specs import TableSpec

KEYS_UNIQUE = "keys_unique"
WATERMARK_MONOTONIC = "watermark_never_moves_backwards"
COUNTS_MATCH = "counts_match_table"


HISTORY_CONSISTENT = "history_consistent"
QUALITY_SCORE = "quality_score"
FRESH = "watermark_fresh"


def check_specs(spec: TableSpec) -> list[dg.AssetCheckSpec]:
    history = (
        [
            dg.AssetCheckSpec(
                HISTORY_CONSISTENT,
                asset=spec.name,
                blocking=True,
                description="Versions of each key do not overlap; only the last is open, "
                "and it alone is current.",
            )
        ]
        if spec.history
        else []
    )
    scored = (
        [
            dg.AssetCheckSpec(
                QUALITY_SCORE,
                asset=spec.name,
                blocking=True,
                description=f"The share of rows passing every quality rule is at least "
                f"{spec.quality.min_score}.",
            )
        ]
        if spec.quality.rules
        else []
    )
    fresh = (
        [
            dg.AssetCheckSpec(
                FRESH,
                asset=spec.name,
                description=f"The watermark lags the source clock by at most {spec.max_lag}.",
            )
        ]
        if spec.max_lag is not None
        else []
    )
    return [
        *history,
        *scored,
        *fresh,
        dg.AssetCheckSpec(
            KEYS_UNIQUE,
            asset=spec.name,
            blocking=True,
            description=f"No key ({', '.join(spec.row_identity)}) appears twice in the target.",
        ),
        dg.AssetCheckSpec(
            WATERMARK_MONOTONIC,
            asset=spec.name,
            description="Over the Delta log's load commits the watermark never decreased.",
        ),
        dg.AssetCheckSpec(
            COUNTS_MATCH,
            asset=spec.name,
            description="Reported inserted/updated/deleted counts match the Delta commit and "
            "the change in the table's row count.",
        ),
    ]


def check_results(
    spark, spec: TableSpec, target: DeltaTarget, result: LoadResult
) -> list[dg.AssetCheckResult]:
    version = result.delta_version if result.committed else None
    outcomes = {
        KEYS_UNIQUE: checks.keys_unique(spark, target, spec.row_identity, written_by=version),
        WATERMARK_MONOTONIC: checks.watermark_monotonic(target, spec.watermark.kind),
        COUNTS_MATCH: checks.counts_match_table(
            target, version, result.rows_inserted, result.rows_updated, result.rows_deleted
        ),
    }
    if spec.max_lag is not None:
        outcomes[FRESH] = _freshness(result, spec.max_lag.total_seconds())
    if spec.quality.rules:
        outcomes[QUALITY_SCORE] = quality.score_check(result.quality, spec.quality.min_score)
    scd2 = spec.history
    if scd2:
        outcomes[HISTORY_CONSISTENT] = checks.history_consistent(
            spark,
            target,
            spec.keys,
            scd2.valid_from,
            scd2.valid_to,
            scd2.is_current,
            written_by=version,
        )
    return [
        dg.AssetCheckResult(
            check_name=name,
            passed=outcome.passed,
            description=outcome.description,
            metadata=outcome.metadata,
        )
        for name, outcome in outcomes.items()
    ]


def _freshness(result: LoadResult, limit: float) -> checks.CheckOutcome:
    lag = result.lag_seconds
    metadata = {"lag_seconds": float(lag) if lag is not None else -1.0, "max_lag_seconds": limit}
    if lag is None:
        return checks.CheckOutcome(False, "no watermark yet: nothing loaded", metadata)
    if lag > limit:
        return checks.CheckOutcome(
            False, f"watermark lags {lag:.0f}s behind the source, over {limit:.0f}s", metadata
        )
    return checks.CheckOutcome(True, f"watermark lags {lag:.0f}s (limit {limit:.0f}s)", metadata)
