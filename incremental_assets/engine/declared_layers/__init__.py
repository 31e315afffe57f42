"""Declared layers (specs/layers.py) refreshed from what changed upstream.

- ``inputs``: a layer's target, its upstream and the tables its SELECT may name;
- ``changes``: the upstream rows whose keys changed since the version a layer covered
  (the change data feed where the upstream has one, else the files the versions added
  and removed), as they were then and as they are now;
- ``commit``: the merge of a layer's upserts and deletes by key, with the covered
  upstream version in the same Delta commit (exactly once);
- ``row_layer`` and ``aggregate_layer``: the two kinds; ``run.refresh_layer`` picks one;
- ``streaming_layer``: an aggregate layer declared ``run: streaming``, a Structured
  Streaming query over its upstream table's folder of files or Delta table
  (``stream_layer``); ``streaming_rows``: a row layer declared so, over its upstream's
  Delta table;
- ``checks``: a row layer's count against its SELECT over the upstream, and a sample of
  an aggregate layer's groups against a from-scratch aggregation.

No Dagster import: the Dagster layer wraps ``refresh_layer`` and ``stream_layer``
(dagster_layer/declared.py).
"""

from incremental_assets.engine.declared_layers.inputs import LayerInputs, layer_inputs
from incremental_assets.engine.declared_layers.result import LayerResult
from incremental_assets.engine.declared_layers.run import refresh_layer
from incremental_assets.engine.declared_layers.streaming_layer import stream_layer
from incremental_assets.engine.streaming import StreamResult

__all__ = [
    "LayerInputs",
    "LayerResult",
    "StreamResult",
    "layer_inputs",
    "refresh_layer",
    "stream_layer",
]
