"""How an increment lands in the target: the merge clauses of each strategy.

Both strategies are idempotent and order-independent, so re-running a window, replaying a
backfill or loading windows out of order converges to the same table:

- ``upsert``: a row replaces the target's row of the same key only if it is newer by the
  watermark; on equal watermarks the larger content hash wins (an arbitrary but fixed
  rule, so two different versions stamped with the same time converge whatever the
  order). An identical row writes nothing.
- ``append``: a key not yet in the target is inserted; later versions of existing keys
  are ignored (insert-only sources, such as event logs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from deltalake.table import TableMerger

from incremental_assets.engine.transforms import ROW_HASH, quote

Strategy = Literal["append", "upsert"]


@dataclass(frozen=True)
class MergePlan:
    predicate: str
    update_when: str | None  # None: matched rows are never updated

    def apply(self, merger: TableMerger) -> TableMerger:
        if self.update_when is not None:
            merger = merger.when_matched_update_all(predicate=self.update_when)
        return merger.when_not_matched_insert_all()


def merge_plan(strategy: Strategy, keys: Sequence[str], watermark: str) -> MergePlan:
    predicate = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)
    if strategy == "append":
        return MergePlan(predicate=predicate, update_when=None)
    wm, h = quote(watermark), quote(ROW_HASH)
    newer = f"s.{wm} > t.{wm} OR (s.{wm} = t.{wm} AND s.{h} > t.{h})"
    return MergePlan(predicate=predicate, update_when=newer)
