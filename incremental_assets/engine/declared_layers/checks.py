"""Verifications of a declared layer, for its asset checks: each compares the layer at its
latest version with a from-scratch computation over the upstream at the version the layer
covers (so a refresh that lost or doubled a change fails them)."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine.checks import CheckOutcome
from incremental_assets.engine.declared_layers.aggregate_layer import aggregate, near, placed
from incremental_assets.engine.declared_layers.changes import having_keys
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.declared_layers.row_layer import layer_rows
from incremental_assets.engine.declared_layers.versions import emptied_files
from incremental_assets.engine.delta_lake.store import row_count
from incremental_assets.engine.layers import covered_version
from incremental_assets.specs.layers import AggregateLayerSpec

SAMPLE_GROUPS = 20


def counts_reconciled(
    spark: SparkSession, inputs: LayerInputs, covered: int | None = None
) -> CheckOutcome:
    """A row layer holds as many rows as its SELECT gives over the upstream at the version
    the layer covers (one count of the SELECT over the whole upstream; with ``newest``, of
    its newest versions). ``covered``: the version a streaming layer's run read up to (a
    batch layer's commits record theirs)."""
    if covered is None:
        covered = covered_version(inputs.target, inputs.upstream)
    if covered < 0:
        return CheckOutcome(True, "nothing covered yet", {"layer_rows": 0, "select_rows": 0})
    held = row_count(inputs.target.open()) if inputs.target.exists() else 0
    upstream = inputs.upstream.to_spark(spark, version=covered)
    emptied = emptied_files(inputs, -1, covered)
    expected = layer_rows(spark, inputs, upstream, emptied).count()
    metadata = {"layer_rows": held, "select_rows": expected, "upstream_version": covered}
    if held != expected:
        return CheckOutcome(
            False,
            f"the layer holds {held} rows; its select over '{inputs.layer.upstream}' at "
            f"version {covered} gives {expected}",
            metadata,
        )
    return CheckOutcome(True, f"{held} rows, as the select gives at version {covered}", metadata)


def sample_matches(
    spark: SparkSession, inputs: LayerInputs, sample: int = SAMPLE_GROUPS
) -> CheckOutcome:
    """Up to ``sample`` groups of an aggregate layer, drawn at random, equal the same groups
    aggregated from scratch over the upstream at the version the layer covers. Only the
    upstream rows of the drawn groups are aggregated (within their windows' span, Delta
    skipping the other files), so the check's cost follows the sample, not the upstream."""
    layer = inputs.layer
    assert isinstance(layer, AggregateLayerSpec)
    covered = covered_version(inputs.target, inputs.upstream)
    if covered < 0:
        return CheckOutcome(True, "nothing covered yet", {"groups_compared": 0})
    keys = list(layer.keys_of_layer)
    held = inputs.target.to_spark(spark).orderBy(F.rand()).limit(sample).collect()
    if not held:
        return CheckOutcome(True, "the layer holds no group", {"groups_compared": 0})
    chosen = spark.createDataFrame(
        [tuple(r[k] for k in keys) for r in held], _schema(spark, inputs)
    )
    upstream = inputs.upstream.to_spark(spark, version=covered)
    rows = having_keys(placed(layer, near(layer, upstream, chosen)), chosen, keys)
    fresh = aggregate(layer, rows, placed_already=True).collect()
    columns = [*keys, *[a.name for a in layer.aggregates]]
    differ = list(set(map(_comparable(columns), held)) ^ set(map(_comparable(columns), fresh)))
    metadata = {"groups_compared": len(held), "groups_differing": len(differ)}
    if differ:
        metadata["sample"] = ", ".join(str(d) for d in sorted(differ, key=str)[:5])
        return CheckOutcome(
            False,
            f"{len(differ)} of {len(held)} sampled groups differ from a from-scratch "
            f"aggregation at version {covered} of '{layer.upstream}'",
            metadata,
        )
    return CheckOutcome(
        True, f"{len(held)} sampled groups equal a from-scratch aggregation", metadata
    )


def _schema(spark: SparkSession, inputs: LayerInputs):
    keys = inputs.layer.keys_of_layer
    table = inputs.target.to_spark(spark)
    return table.select(*[table[k] for k in keys]).schema


def _comparable(columns: list[str]):
    def row(r) -> tuple:
        return tuple(round(v, 6) if isinstance(v, float) else v for v in (r[c] for c in columns))

    return row
