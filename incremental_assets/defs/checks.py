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
    return [
        *history,
        *scored,
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
