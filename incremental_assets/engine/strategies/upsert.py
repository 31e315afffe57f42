"""``upsert`` (SCD type 1): a row replaces the target's row of the same key only if it is
newer by the watermark; on equal watermarks the larger content hash wins. An identical row
writes nothing."""

from __future__ import annotations

from incremental_assets.engine.delta_lake.merge_plan import (
    Clause,
    MergePlan,
    insert,
    merge_plan,
    update,
)
from incremental_assets.engine.strategies.base import Strategy


class Upsert(Strategy):
    kind = "upsert"
    creates_in_one_write = True

    def merge_plan(self) -> MergePlan:
        return merge_plan(
            self.spec.keys,
            self.spec.watermark.column,
            _newer_wins,
            acts="{unmatched} OR {newer}",
            newer_acts=True,
        )


def _newer_wins(newer: str) -> tuple[Clause, ...]:
    return (update(newer), insert())
