"""One asset per declared layer (specs/layers.py), downstream of its upstream's asset:
it refreshes the layer from what the upstream changed (engine/declared_layers/), or runs
a streaming layer's query over the upstream's new files or commits, and reports what it read and
wrote, with the layer's checks.

(No ``from __future__ import annotations`` here: Dagster reads the context and resource
annotations.)
"""

import dagster as dg
from dagster_pyspark import PySparkResource

from incremental_assets.dagster_layer.checks import (
    KEYS_NOT_NULL,
    KEYS_UNIQUE,
    as_results,
    layer_check_specs,
)
from incremental_assets.dagster_layer.metadata import table_metadata, table_name_metadata
from incremental_assets.dagster_layer.pools import mark_worker
from incremental_assets.dagster_layer.resources import DeltaWarehouse, spark_session
from incremental_assets.engine import checks
from incremental_assets.engine.declared_layers import (
    LayerResult,
    StreamResult,
    layer_inputs,
    refresh_layer,
    stream_layer,
)
from incremental_assets.engine.declared_layers.checks import counts_reconciled, sample_matches
from incremental_assets.specs import ProjectSpec
from incremental_assets.specs.layers import LayerSpec, WindowSpec

COUNTS_RECONCILED = "counts_reconciled_with_upstream"
SAMPLE_MATCHES = "sample_matches_full_aggregation"
NO_LATE_ROWS = "no_late_rows_dropped"
# Eager, but an unpartitioned layer after a partitioned table must not wait for every
# partition of it to exist.
AUTOMATION = dg.AutomationCondition.eager().without(~dg.AutomationCondition.any_deps_missing())


def layer_assets(project: ProjectSpec) -> list[dg.AssetsDefinition]:
    return [layer_asset(project, layer) for layer in project.layers]


def _group(project: ProjectSpec, layer: LayerSpec) -> str:
    if layer.group:
        return layer.group
    for spec in project.tables:
        if spec.name == layer.upstream:
            return spec.group
    return _group(project, project.layer(layer.upstream))


def _check_specs(layer: LayerSpec) -> list[dg.AssetCheckSpec]:
    keys = layer.keys_of_layer
    if layer.kind == "row" and _reads_files(layer):
        # Its rows come from the folder's files, not the upstream's Delta table.
        return layer_check_specs(layer.name, keys)
    if layer.kind == "row":
        return [
            *layer_check_specs(layer.name, keys),
            dg.AssetCheckSpec(
                COUNTS_RECONCILED,
                asset=layer.name,
                description=f"The layer holds as many rows as its select gives over "
                f"'{layer.upstream}' at the version it covers (counts the select over the "
                "whole upstream).",
            ),
        ]
    # A group's key may be null (a null group is a group), so keys_not_null does not apply.
    unique = [c for c in layer_check_specs(layer.name, keys) if c.name == KEYS_UNIQUE]
    if layer.streaming:
        # Its windows are final once the watermark passes them, so a from-scratch
        # aggregation of the files (late rows included) is not what it should equal.
        return [
            *unique,
            dg.AssetCheckSpec(
                NO_LATE_ROWS,
                asset=layer.name,
                description="The run's streaming query dropped no row as late (behind the "
                "window's watermark); fails naming how many it dropped.",
            ),
        ]
    return [
        *unique,
        dg.AssetCheckSpec(
            SAMPLE_MATCHES,
            asset=layer.name,
            description="A sample of the layer's groups equals the same groups aggregated "
            f"from scratch over '{layer.upstream}' at the version it covers.",
        ),
    ]


def _reads_files(layer: LayerSpec) -> bool:
    return getattr(layer, "reads", "table") == "files"


def layer_asset(project: ProjectSpec, layer: LayerSpec) -> dg.AssetsDefinition:
    what = "rows of its select" if layer.kind == "row" else "aggregates per group"
    if _reads_files(layer):
        how = (
            f"run as a Structured Streaming query over the files that arrived in "
            f"{layer.upstream}'s folder since its last run"
        )
    elif layer.streaming:
        how = (
            f"run as a Structured Streaming query over what {layer.upstream} added (or, "
            "with its change data feed, changed) since its last run"
        )
    else:
        how = f"refreshed from what {layer.upstream} changed since the version it last covered"
    path = project.layer_path(layer)

    @dg.asset(
        name=layer.name,
        group_name=_group(project, layer),
        deps=[dg.AssetKey(layer.upstream)],
        automation_condition=AUTOMATION,
        kinds={"spark", "delta"},
        pool=f"incremental_assets_{layer.name}",
        check_specs=_check_specs(layer),
        description=layer.description
        or f"Declared {layer.kind} layer after {layer.upstream}: the {what}, {how}.",
    )
    def _layer(
        context: dg.AssetExecutionContext, spark: PySparkResource, warehouse: DeltaWarehouse
    ) -> dg.MaterializeResult:
        mark_worker(context)
        session = spark_session(spark)
        inputs = layer_inputs(project, layer, warehouse.storage_options())
        target = inputs.target
        keys = layer.keys_of_layer
        if layer.streaming:
            streamed = stream_layer(session, inputs)
            # A run may commit several batches: every key of the table is checked.
            outcomes = {KEYS_UNIQUE: checks.keys_unique(session, target, keys)}
            if layer.kind == "row":
                outcomes[KEYS_NOT_NULL] = checks.keys_not_null(session, target, keys)
                if not _reads_files(layer):
                    outcomes[COUNTS_RECONCILED] = counts_reconciled(
                        session, inputs, streamed.upstream_version
                    )
            else:
                outcomes[NO_LATE_ROWS] = late_rows_outcome(streamed)
            metadata = stream_metadata(streamed)
        else:
            result = refresh_layer(session, inputs)
            outcomes = {KEYS_UNIQUE: checks.keys_unique(session, target, keys, result.version)}
            if layer.kind == "row":
                outcomes[KEYS_NOT_NULL] = checks.keys_not_null(session, target, keys)
                outcomes[COUNTS_RECONCILED] = counts_reconciled(session, inputs)
            else:
                outcomes[SAMPLE_MATCHES] = sample_matches(session, inputs)
            metadata = result_metadata(result, getattr(layer, "window", None))
        return dg.MaterializeResult(
            metadata={
                **metadata,
                **table_name_metadata(path, None),
                **table_metadata(
                    target.open() if target.exists() else None, dict.fromkeys(keys, "key")
                ),
            },
            check_results=as_results(outcomes),
        )

    return _layer


def result_metadata(result: LayerResult, window: WindowSpec | None = None) -> dict:
    """A refresh's metadata (with ``window``, an aggregate layer's: the windows recomputed)."""
    windows = {"windows_recomputed": windows_text(result, window)} if window else {}
    return {
        "upstream_version_from": result.upstream_from,
        "upstream_version_to": result.upstream_to,
        "versions_covered": (
            f"{result.upstream_from + 1}..{result.upstream_to}" if result.committed else "-"
        ),
        "changes_from": result.changes_from,
        "rows_in": result.rows_in,
        "rows_merged": result.rows_merged,
        "rows_inserted": result.rows_inserted,
        "rows_updated": result.rows_updated,
        "rows_deleted": result.rows_deleted,
        "groups_recomputed": result.groups_recomputed,
        "committed": result.committed,
        "delta_version": result.version if result.version is not None else -1,
        **windows,
    }


def windows_text(result: LayerResult, window: WindowSpec) -> str:
    """The windows a refresh recomputed, by their starts (UTC): days for windows of whole
    days, else minutes; '-' when none."""
    if not result.windows:
        return "-"
    days = window.size.total_seconds() % 86_400 == 0
    shape = "%Y-%m-%d" if days else "%Y-%m-%d %H:%M"
    return ", ".join(w.strftime(shape) for w in result.windows)


def stream_metadata(result: StreamResult) -> dict:
    first, last = result.batch_ids or (-1, -1)
    return {
        "run": "streaming",
        "batches": result.batches,
        "batch_ids": f"{first}..{last}" if result.batches else "-",
        "rows_in": result.rows_in,
        "rows_out": result.rows_out,
        "late_rows_dropped": result.late_rows_dropped,
        "source_offsets_from": result.offsets_from or "-",
        "source_offsets_to": result.offsets_to or "-",
        "checkpoint": result.checkpoint,
        "query_id": result.query_id or "-",
        "committed": result.committed,
        "delta_version": result.version if result.version is not None else -1,
        **(
            {"upstream_version_to": result.upstream_version}
            if result.upstream_version is not None
            else {}
        ),
    }


def late_rows_outcome(result: StreamResult) -> checks.CheckOutcome:
    dropped = result.late_rows_dropped
    metadata = {"late_rows_dropped": dropped, "batches": result.batches}
    if dropped:
        return checks.CheckOutcome(
            False,
            f"{dropped} {'row' if dropped == 1 else 'rows'} arrived behind the watermark and "
            "were dropped (their windows were final); raise window.watermark to accept later "
            "rows",
            metadata,
        )
    return checks.CheckOutcome(True, "no row arrived behind the watermark", metadata)
