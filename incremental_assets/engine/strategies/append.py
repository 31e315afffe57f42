"""``append``: a key not yet in the target is inserted; later versions of existing keys
are ignored (insert-only sources, such as event logs)."""

from __future__ import annotations

from collections.abc import Sequence

from incremental_assets.engine.delta_lake.merge_plan import Clause, MergePlan, insert, merge_plan
from incremental_assets.engine.strategies.base import Strategy


class Append(Strategy):
    kind = "append"
    creates_in_one_write = True

    def merge_plan(self) -> MergePlan:
        return append_plan(self.spec.keys, self.spec.watermark.column)


def append_plan(keys: Sequence[str], watermark: str) -> MergePlan:
    """The merge of an insert-only increment (also landing files into bronze)."""
    return merge_plan(keys, watermark, _insert_new, acts="{unmatched}")


def _insert_new(newer: str) -> tuple[Clause, ...]:
    return (insert(),)
