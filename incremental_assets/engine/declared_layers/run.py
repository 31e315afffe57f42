"""One refresh of a declared layer, whichever its kind."""

from __future__ import annotations

import re

from pyspark.sql import SparkSession

from incremental_assets.engine.declared_layers.aggregate_layer import refresh_aggregate_layer
from incremental_assets.engine.declared_layers.inputs import LayerInputs
from incremental_assets.engine.declared_layers.result import LayerResult
from incremental_assets.engine.declared_layers.row_layer import refresh_row_layer
from incremental_assets.engine.errors import LayerError
from incremental_assets.engine.layers import covered_version

_REFRESH = {"row": refresh_row_layer, "aggregate": refresh_aggregate_layer}


def refresh_layer(spark: SparkSession, inputs: LayerInputs) -> LayerResult:
    """Refresh ``inputs.layer`` from what its upstream changed since the version it last
    covered, in one Delta commit that records the version it covers now (nothing is
    committed when the upstream has no new version). A streaming layer runs with
    ``stream_layer`` instead."""
    if inputs.layer.streaming:
        raise LayerError(
            inputs.layer.name,
            "run",
            "the layer runs as a streaming query, not by a batch refresh",
            "run it with engine.declared_layers.stream_layer (its Dagster asset does)",
        )
    inputs.require_upstream()
    since = covered_version(inputs.target, inputs.upstream)
    try:
        return _REFRESH[inputs.layer.kind](spark, inputs)
    except LayerError:
        raise
    except Exception as exc:
        lost = _history_lost(exc) if since >= 0 else None
        if lost is None:
            raise
        raise LayerError(
            inputs.layer.name,
            "from",
            f"the upstream '{inputs.layer.upstream}' no longer holds its history since "
            f"version {since}, the version this layer last covered (its log retention or a "
            f"VACUUM removed it): {lost}",
            f"delete the layer's table at {inputs.target.path}; its next run rebuilds it "
            "from the whole upstream. Nothing was committed",
        ) from exc


# What Spark and delta-rs say when a version's log entries or data files are gone.
_LOST = re.compile(
    r"^.*(FileNotFoundException|FILE_NOT_FOUND|VersionNotFound|VERSION_NOT_FOUND|"
    r"not reconstruct state at version|No such file or directory|does not exist).*$",
    re.MULTILINE,
)


def _history_lost(exc: BaseException) -> str | None:
    """The line of ``exc`` saying a past version's files are gone, else None."""
    found = _LOST.search(str(exc))
    return found.group(0).strip()[:300] if found else None
