"""``upsert`` (SCD type 1): a row replaces the target's row of the same key only if it is
newer by the watermark; on equal watermarks the larger content hash wins. An identical row
writes nothing."""

from __future__ import annotations

from deltalake.table import TableMerger

from incremental_assets.engine.merge_plan import MergePlan, merge_plan
from incremental_assets.engine.strategies.base import Strategy


class Upsert(Strategy):
    kind = "upsert"

    def merge_plan(self) -> MergePlan:
        return merge_plan(self.spec.keys, self.spec.watermark.column, _newer_wins)


def _newer_wins(plan: MergePlan, merger: TableMerger, every: dict[str, str]) -> TableMerger:
    return merger.when_matched_update(updates=every, predicate=plan.newer).when_not_matched_insert(
        updates=every
    )
