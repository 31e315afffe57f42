"""One refresh of a declared layer, whichever its kind."""

from __future__ import annotations

from pyspark.sql import SparkSession

from incremental_assets.engine.declared_layers.aggregate_layer import refresh_aggregate_layer
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.declared_layers.result import LayerResult
from incremental_assets.engine.declared_layers.row_layer import refresh_row_layer
from incremental_assets.engine.errors import LayerError

_REFRESH = {"row": refresh_row_layer, "aggregate": refresh_aggregate_layer}


def refresh_layer(spark: SparkSession, inputs: LayerInputs) -> LayerResult:
    """Refresh ``inputs.layer`` from what its upstream changed since the version it last
    covered, in one Delta commit that records the version it covers now (nothing is
    committed when the upstream has no new version)."""
    if not inputs.upstream.exists():
        raise LayerError(
            inputs.layer.name,
            "from",
            f"the upstream '{inputs.layer.upstream}' has no Delta table yet at "
            f"{inputs.upstream.path}",
            f"materialize '{inputs.layer.upstream}' first",
        )
    return _REFRESH[inputs.layer.kind](spark, inputs)
