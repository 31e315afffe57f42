"""Gaps in an insert-only log's sequence: reported, never treated as errors (a rolled-back
transaction or a skipped id leaves one)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Gaps:
    missing: int
    ranges: tuple[tuple[int, int], ...]  # inclusive, the first ``limit`` of them

    def describe(self) -> str:
        if not self.missing:
            return "none"
        shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self.ranges)
        more = " ..." if sum(b - a + 1 for a, b in self.ranges) < self.missing else ""
        return shown + more


def sequence_gaps(ids: pa.ChunkedArray | pa.Array, after: int | None, limit: int = 20) -> Gaps:
    """Ids missing from ``ids`` above ``after`` (the previous cursor) up to their maximum."""
    values = pc.unique(pc.drop_null(ids))
    if after is not None:
        values = pc.filter(values, pc.greater(values, after))
    if len(values) == 0:
        return Gaps(0, ())
    ordered = pc.take(values, pc.array_sort_indices(values))
    if after is not None:
        ordered = pa.concat_arrays([pa.array([after], ordered.type), ordered])
    lower, upper = ordered.slice(0, len(ordered) - 1), ordered.slice(1)
    step = pc.subtract(upper, lower)
    holes = pc.greater(step, 1)
    missing = pc.sum(pc.subtract(pc.filter(step, holes), 1)).as_py() or 0
    starts = pc.add(pc.filter(lower, holes), 1).slice(0, limit).to_pylist()
    ends = pc.subtract(pc.filter(upper, holes), 1).slice(0, limit).to_pylist()
    return Gaps(int(missing), tuple(zip(starts, ends, strict=True)))
