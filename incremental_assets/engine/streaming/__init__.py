"""Structured Streaming as a runner: one query per materialization with
``trigger(availableNow=True)``, its checkpoint on the warehouse beside its table
(``checkpoint``), ``foreachBatch`` merges made idempotent by Delta's transaction ids
(``batches``), and what a run did from Spark's progress reports (``progress``, ``query``).

What is streamed is the caller's: a declared layer's query is built in
engine/declared_layers/streaming_layer.py.
"""

from incremental_assets.engine.streaming.progress import StreamResult

__all__ = ["StreamResult"]
