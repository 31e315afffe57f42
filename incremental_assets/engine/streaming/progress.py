"""What one run of a streaming query did, from Spark's own progress reports
(``StreamingQuery.recentProgress``): no extra Spark job counts anything."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Progress reports a query keeps in memory (Spark's default, 100, would lose the first
# batches of a run that catches up on many files one trigger's worth at a time).
KEPT_REPORTS = "10000"


@dataclass(frozen=True)
class StreamResult:
    """One run of a streaming layer.

    ``batches``: micro-batches run (0: the folder had no new file); ``batch_ids``: the
    first and last of them; ``rows_in``: source rows read; ``rows_out``: groups (windows)
    the query emitted to the layer, new or updated; ``late_rows_dropped``: rows behind the
    watermark, left out (Spark counts them at its state store, after combining a batch's
    late rows of one group in one task: exact when late rows fall in distinct groups, a
    lower bound otherwise); ``offsets_from``/``offsets_to``: the source's offsets the run
    covered (JSON, as Spark reports them); ``checkpoint``: where the query keeps its state;
    ``version``: the layer's Delta version after the run (None: no table yet);
    ``committed``: whether the run added a commit to the layer; ``upstream_version``: the
    upstream Delta version a row layer's query has read up to (None: an aggregate's). A
    row layer's ``rows_out`` counts the rows its commits inserted, updated and deleted."""

    checkpoint: str
    query_id: str | None = None
    batches: int = 0
    batch_ids: tuple[int, int] | None = None
    rows_in: int = 0
    rows_out: int = 0
    late_rows_dropped: int = 0
    offsets_from: str | None = None
    offsets_to: str | None = None
    version: int | None = None
    committed: bool = False
    upstream_version: int | None = None


def summarize(
    checkpoint: str, query_id: str, reports: Sequence[Any], version: int | None, committed: bool
) -> StreamResult:
    """A run's result from its progress ``reports``: only those of batches that ran (a
    query that finds nothing to do reports an idle progress without a batch)."""
    ran = [r for r in reports if "addBatch" in (r.durationMs or {})]
    if not ran:
        return StreamResult(checkpoint, query_id, version=version, committed=committed)
    operators = [op for r in ran for op in (r.stateOperators or [])]
    sources = [s for r in ran for s in (r.sources or [])]
    return StreamResult(
        checkpoint=checkpoint,
        query_id=query_id,
        batches=len(ran),
        batch_ids=(ran[0].batchId, ran[-1].batchId),
        rows_in=sum(int(r.numInputRows or 0) for r in ran),
        rows_out=sum(int(op.numRowsUpdated or 0) for op in operators),
        late_rows_dropped=sum(int(op.numRowsDroppedByWatermark or 0) for op in operators),
        offsets_from=_offset(sources[0].startOffset) if sources else None,
        offsets_to=_offset(sources[-1].endOffset) if sources else None,
        version=version,
        committed=committed,
    )


def _offset(value: Any) -> str | None:
    # PySpark gives offsets as text, a first batch's missing start as "None".
    return None if value is None or str(value) in ("None", "null") else str(value)
