"""How an increment lands in the target: the merge of a staged increment, with the
clauses its strategy gives (``engine.strategies``).

All strategies are idempotent and order-independent, so re-running a window, replaying a
backfill or loading windows out of order converges to the same table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from deltalake.table import TableMerger

from incremental_assets.engine.transforms import ROW_HASH, quote

Deletes = Literal["hard", "soft"]
# A strategy's merge clauses: (the plan, the merger, every column as ``s.<column>``).
Clauses = Callable[["MergePlan", TableMerger, dict[str, str]], TableMerger]


@dataclass(frozen=True)
class MergePlan:
    """The merge of a staged increment: join predicate and clauses, given the target's
    columns (the staged columns without ``staged_only_columns``, such as ``_ia_op``)."""

    keys: tuple[str, ...]
    watermark: str
    predicate: str
    newer: str
    clauses: Clauses
    deletes: Deletes = "hard"
    # Loader columns of a change set that the target does not keep.
    staged_only_columns: tuple[str, ...] = ()
    # Hard deletes are recorded beside the target (``Tombstones``).
    tombstones: bool = False

    @property
    def writes_by_merge_only(self) -> bool:
        """Change sets hold delete rows: even a first load must go through the merge."""
        return bool(self.staged_only_columns)

    def apply(self, merger: TableMerger, columns: Sequence[str]) -> TableMerger:
        # Every column by name, quoted for delta-rs's SQL (double quotes): its *_all clauses
        # cannot take a column whose name holds a backtick, nor may a name be a bare key.
        every = {_named(c): f"s.{_named(c)}" for c in columns}
        return self.clauses(self, merger, every)


def _named(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


def matching(columns: Sequence[str]) -> str:
    """A merge's join predicate: target ``t`` and source ``s`` equal on ``columns``."""
    return " AND ".join(f"t.{quote(c)} = s.{quote(c)}" for c in columns)


def merge_plan(
    keys: Sequence[str],
    watermark: str,
    clauses: Clauses,
    *,
    deletes: Deletes = "hard",
    staged_only_columns: tuple[str, ...] = (),
    tombstones: bool = False,
    identity: Sequence[str] | None = None,
) -> MergePlan:
    """A plan matching target rows by ``identity`` (default: the keys); ``newer`` is the
    watermark order, ties broken by the larger content hash (an arbitrary but fixed rule,
    so two versions stamped with the same time converge whatever the order)."""
    wm, h = quote(watermark), quote(ROW_HASH)
    newer = f"s.{wm} > t.{wm} OR (s.{wm} = t.{wm} AND s.{h} > t.{h})"
    return MergePlan(
        keys=tuple(keys),
        watermark=watermark,
        predicate=matching(list(identity) if identity else list(keys)),
        newer=newer,
        clauses=clauses,
        deletes=deletes,
        staged_only_columns=staged_only_columns,
        tombstones=tombstones,
    )
