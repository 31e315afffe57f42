"""Asset checks on every table, evaluated in the materializing step (one Spark session)."""

from __future__ import annotations

from contextlib import nullcontext

import dagster as dg

from incremental_assets.engine import checks, quality
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.load import LoadResult
from incremental_assets.engine.load.interpreted import interpreted
from incremental_assets.engine.strategies import strategy_for
from incremental_assets.specs import TableSpec

KEYS_UNIQUE = "keys_unique"
WATERMARK_MONOTONIC = "watermark_never_moves_backwards"
COUNTS_MATCH = "counts_match_table"
KEYS_NOT_NULL = "keys_not_null"
ROWS_RECONCILED = "rows_reconciled"
SCHEMA_MATCHES = "schema_matches_spec"


DELETES_WITHIN_LIMIT = "deletes_within_limit"
WATERMARK_IN_RANGE = "watermark_in_range"
HISTORY_CONSISTENT = "history_consistent"
QUALITY_SCORE = "quality_score"
RULES_NOT_NULL = "quality_rules_not_null"
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
            ),
            dg.AssetCheckSpec(
                RULES_NOT_NULL,
                asset=spec.name,
                blocking=True,
                description="No quality rule was NULL for every row a run checked (such a "
                "rule judges nothing, and every row fails it).",
            ),
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
    guarded = (
        [
            dg.AssetCheckSpec(
                DELETES_WITHIN_LIMIT,
                asset=spec.name,
                description="The run deleted at most strategy.max_delete_share "
                f"({spec.strategy.max_delete_share:.0%}) of the target's live rows; a run "
                "over it (or an empty snapshot) fails before writing.",
            )
        ]
        if _guarded(spec)
        else []
    )
    in_range = (
        [
            dg.AssetCheckSpec(
                WATERMARK_IN_RANGE,
                asset=spec.name,
                description="No source row has a watermark before partitioning.start or more "
                "than a day ahead of the source clock (no window would ever load it).",
            )
        ]
        if _time_windowed(spec)
        else []
    )
    return [
        *history,
        *scored,
        *fresh,
        *guarded,
        *in_range,
        dg.AssetCheckSpec(
            KEYS_UNIQUE,
            asset=spec.name,
            blocking=True,
            description=f"No key ({', '.join(spec.row_identity)}) appears twice in the target.",
        ),
        dg.AssetCheckSpec(
            KEYS_NOT_NULL,
            asset=spec.name,
            blocking=True,
            description=f"No key column ({', '.join(spec.row_identity)}) is null in the "
            "target (from the Delta log's null counts; files without them counted by Spark).",
        ),
        dg.AssetCheckSpec(
            ROWS_RECONCILED,
            asset=spec.name,
            description=_reconciled_description(spec),
        ),
        dg.AssetCheckSpec(
            SCHEMA_MATCHES,
            asset=spec.name,
            description="The target has every column the spec names (keys, watermark, "
            "partition and strategy columns, a declared source.schema) with a compatible "
            "type; with source.schema, undeclared target columns fail under "
            "on_schema_change: fail and warn under append_new_columns.",
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
    # Interpreted when the run was (engine/load/interpreted.py): the same small table.
    with interpreted(spark, True) if result.interpreted else nullcontext():
        return as_results(_outcomes(spark, spec, target, result))


def _outcomes(
    spark, spec: TableSpec, target: DeltaTarget, result: LoadResult
) -> dict[str, checks.CheckOutcome]:
    version = result.delta_version if result.committed else None
    outcomes = {
        KEYS_UNIQUE: checks.keys_unique(spark, target, spec.row_identity, written_by=version),
        WATERMARK_MONOTONIC: checks.watermark_monotonic(target, spec.watermark.kind),
        COUNTS_MATCH: checks.counts_match_table(
            target, version, result.rows_inserted, result.rows_updated, result.rows_deleted
        ),
        KEYS_NOT_NULL: checks.keys_not_null(spark, target, spec.row_identity),
        ROWS_RECONCILED: checks.rows_reconciled(spec, result),
        SCHEMA_MATCHES: checks.schema_matches_spec(target, spec),
    }
    if spec.max_lag is not None:
        outcomes[FRESH] = _freshness(result, spec.max_lag.total_seconds())
    if spec.quality.rules:
        outcomes[QUALITY_SCORE] = quality.score_check(result.quality, spec.quality.min_score)
        outcomes[RULES_NOT_NULL] = quality.rules_not_null_check(result.quality)
    if _guarded(spec):
        outcomes[DELETES_WITHIN_LIMIT] = checks.deletes_within_limit(spec, result)
    if _time_windowed(spec):
        outcomes[WATERMARK_IN_RANGE] = checks.watermark_in_range(result)
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
    return outcomes


def as_results(outcomes: dict[str, checks.CheckOutcome]) -> list[dg.AssetCheckResult]:
    return [
        dg.AssetCheckResult(
            check_name=name,
            passed=outcome.passed,
            description=outcome.description,
            metadata=outcome.metadata,
        )
        for name, outcome in outcomes.items()
    ]


def layer_check_specs(asset: str, keys: tuple[str, ...]) -> list[dg.AssetCheckSpec]:
    """The key checks of a layer built from the tables (silver, gold, a user's own): the
    same ``keys_unique`` and ``keys_not_null`` the tables have, blocking."""
    named = ", ".join(keys)
    return [
        dg.AssetCheckSpec(
            KEYS_UNIQUE,
            asset=asset,
            blocking=True,
            description=f"No key ({named}) appears twice in the table.",
        ),
        dg.AssetCheckSpec(
            KEYS_NOT_NULL,
            asset=asset,
            blocking=True,
            description=f"No key column ({named}) is null (from the Delta log's null counts).",
        ),
    ]


def _guarded(spec: TableSpec) -> bool:
    """Tables whose runs delete target rows, under the vanished-source guard."""
    return strategy_for(spec).guards_deletes


def _time_windowed(spec: TableSpec) -> bool:
    """Tables read by windows of a time watermark (landing and snapshot tables are not)."""
    return spec.watermark.is_time and not spec.takes_snapshots and spec.landing is None


def _reconciled_description(spec: TableSpec) -> str:
    """The equation the check verifies for this table's strategy."""
    if spec.history:
        return (
            "Every extracted change event is new or already logged, and the versions written "
            "match the merge: inserted = opened, updated = closed + updated in place, deleted "
            "= replaced. (A change may write several versions, so extracted rows do not "
            "partition into written rows.)"
        )
    if spec.takes_snapshots:
        return (
            "The snapshot's rows = new + changed + unchanged, and the merge's inserted + "
            "updated + deleted = new + changed + vanished staged changes."
        )
    deleted = " + deleted" if spec.strategy.kind == "cdc" else ""
    return (
        f"Rows extracted = inserted + updated{deleted} + unchanged + superseded + quarantined "
        "(unchanged: staged rows the merge left alone; superseded: older versions of a key in "
        "the batch, or changes older than a recorded delete). Both are remainders of "
        "independently counted totals, so the check fails when either would be negative."
    )


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
