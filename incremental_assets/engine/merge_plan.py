"""How an increment lands in the target: the merge clauses of each strategy.

All strategies are idempotent and order-independent, so re-running a window, replaying a
backfill or loading windows out of order converges to the same table:

- ``upsert``: a row replaces the target's row of the same key only if it is newer by the
  watermark; on equal watermarks the larger content hash wins (an arbitrary but fixed
  rule, so two different versions stamped with the same time converge whatever the
  order). An identical row writes nothing.
- ``append``: a key not yet in the target is inserted; later versions of existing keys
  are ignored (insert-only sources, such as event logs).
- ``cdc``: as upsert, ordered by the change sequence (the watermark column), with deletes:
  hard (the row is removed; a tombstone kept beside the table stops older changes from
  bringing it back) or soft (``is_deleted``/``deleted_at``, with the delete's own values;
  the row itself is the tombstone).
- ``snapshot``: a snapshot diffed against the target (``engine.snapshots``) lands as a CDC
  change set ordered by the snapshot time.
- ``scd2``: the versions of touched keys, recomputed (``engine.history``), are matched by
  key and ``valid_from``: written where they differ, removed where history no longer has
  them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from deltalake.table import TableMerger

from incremental_assets.engine.changes import OP
from incremental_assets.engine.snapshots import CHANGE
from incremental_assets.engine.transforms import ROW_HASH, quote

StrategyKind = Literal["append", "upsert", "cdc", "snapshot", "scd2"]
Deletes = Literal["hard", "soft"]


@dataclass(frozen=True)
class MergePlan:
    """The merge of a staged increment: join predicate and clauses, given the target's
    columns (the staged columns without the loader's ``_ia_op``)."""

    strategy: StrategyKind
    keys: tuple[str, ...]
    watermark: str
    predicate: str
    newer: str
    deletes: Deletes = "hard"

    @property
    def tombstones(self) -> bool:
        return self.strategy == "cdc" and self.deletes == "hard"

    @property
    def writes_by_merge_only(self) -> bool:
        """Change sets hold delete rows: even a first load must go through the merge."""
        return bool(self.staged_only_columns)

    @property
    def staged_only_columns(self) -> tuple[str, ...]:
        if self.strategy == "cdc":
            return (OP,)
        if self.strategy in ("snapshot", "scd2"):
            return (OP, CHANGE)
        return ()

    def apply(self, merger: TableMerger, columns: Sequence[str]) -> TableMerger:
        # Every column by name, quoted for delta-rs's SQL (double quotes): its *_all clauses
        # cannot take a column whose name holds a backtick, nor may a name be a bare key.
        every = {_named(c): f"s.{_named(c)}" for c in columns}
        if self.strategy == "scd2":
            return (
                merger.when_matched_delete(predicate=f"s.{OP} = 'D'")
                .when_matched_update(updates=every, predicate=f"s.{OP} = 'U'")
                .when_not_matched_insert(updates=every, predicate=f"s.{OP} = 'U'")
            )
        if self.strategy == "append":
            return merger.when_not_matched_insert(updates=every)
        if self.strategy == "upsert":
            return merger.when_matched_update(
                updates=every, predicate=self.newer
            ).when_not_matched_insert(updates=every)
        is_delete, is_upsert = f"s.{OP} = 'D'", f"s.{OP} = 'U'"
        if self.deletes == "hard":
            return (
                merger.when_matched_delete(predicate=f"{is_delete} AND ({self.newer})")
                .when_matched_update(updates=every, predicate=f"{is_upsert} AND ({self.newer})")
                .when_not_matched_insert(updates=every, predicate=is_upsert)
            )
        # Soft: the row stays, flagged; it is the tombstone. The delete's own values win
        # (an image of the row at deletion, or nulls): never blended with older values, so
        # the result does not depend on the order changes arrive in.
        return merger.when_matched_update(
            updates=every, predicate=self.newer
        ).when_not_matched_insert(updates=every)


def _named(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


def matching(columns: Sequence[str]) -> str:
    """A merge's join predicate: target ``t`` and source ``s`` equal on ``columns``."""
    return " AND ".join(f"t.{quote(c)} = s.{quote(c)}" for c in columns)


def merge_plan(
    strategy: StrategyKind,
    keys: Sequence[str],
    watermark: str,
    deletes: Deletes = "hard",
    valid_from: str | None = None,
) -> MergePlan:
    """``valid_from``: for scd2, the column that, with the keys, identifies a version."""
    identity = [*keys, valid_from] if strategy == "scd2" and valid_from else list(keys)
    predicate = matching(identity)
    wm, h = quote(watermark), quote(ROW_HASH)
    newer = f"s.{wm} > t.{wm} OR (s.{wm} = t.{wm} AND s.{h} > t.{h})"
    return MergePlan(
        strategy=strategy,
        keys=tuple(keys),
        watermark=watermark,
        predicate=predicate,
        newer=newer,
        deletes=deletes,
    )
