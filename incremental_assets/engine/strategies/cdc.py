"""``cdc``: a change feed (insert/update/delete with a sequence, the watermark column),
merged as upsert ordered by the sequence, with deletes: hard (the row is removed; a
tombstone kept beside the table stops older changes from bringing it back) or soft
(``is_deleted``/``deleted_at``, with the delete's own values; the row is the tombstone)."""

from __future__ import annotations

import uuid

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import changes, staging
from incremental_assets.engine.delta_lake.merge_plan import (
    Clause,
    MergePlan,
    delete,
    insert,
    merge_plan,
    update,
)
from incremental_assets.engine.delta_lake.store import DeltaTarget, TargetState, Tombstones
from incremental_assets.engine.guards import DeleteGuard, GuardReport
from incremental_assets.engine.strategies.base import Strategy, Transform
from incremental_assets.engine.strategies.deletes import judge_deletes
from incremental_assets.engine.strategies.rows import RENEWED
from incremental_assets.engine.transforms import LATEST_ROW_HASH, quote
from incremental_assets.specs import TableSpec
from incremental_assets.specs.strategies import CdcStrategy

# The window's delete changes, counted before a first load writes (hard deletes).
_WINDOW_DELETES = "window_deletes"
# Tombstones above which a run groups only those of its window's keys (a semi join that
# reads the window's keys once more): cdc_hard at 5M, a 50,000-change increment, warm
# runs, level at 200,000 tombstones (3.24 s median either way), 4.74 s -> 3.57 s at
# 2,000,000 (docs/benchmark.md, "Hard deletes: the window's tombstones only").
TOUCHED_ONLY_ABOVE = 200_000


class Cdc(Strategy):
    kind = "cdc"
    guards_deletes = True
    creates_in_one_write = True

    def __init__(self, spec: TableSpec, row_hash: int = LATEST_ROW_HASH) -> None:
        super().__init__(spec, row_hash)
        # The feed's settings: the strategy itself, or an scd2 table's ``changes``.
        feed = spec.feed
        assert isinstance(feed, CdcStrategy)
        self.options = feed
        # The run's deletes of keys that have a tombstone, counted as they are staged
        # (``held_back``; None: no tombstone was read).
        self._renewed: Observation | None = None

    def shape(self, taken_at=None) -> Transform:
        """Feed rows become rows plus an operation."""
        spec = self.spec
        keep = (spec.watermark.column, spec.partition_column)
        return changes.normalize(spec.name, self.options, keep)

    def flagged(self, df: DataFrame) -> DataFrame:
        """Soft deletes: the flags, added after the hash so a replay hashes the same."""
        if self.options.deletes == "soft":
            return df.transform(changes.soft_delete_columns(self.spec.partition_column))
        return df

    def counted_while_staged(self) -> dict:
        """Hard deletes: the staged deletes of keys with a tombstone (``held_back``), when
        the tombstones were read."""
        if self._renewed is None:
            return {}
        found = self._renewed.get.get("rows")
        return {RENEWED: int(found)} if found is not None else {}

    def held_back(
        self, spark: SparkSession, target: DeltaTarget, increment: DataFrame
    ) -> DataFrame:
        """Hard deletes: the changes older than a key's tombstone dropped, and the deletes
        of keys that have one counted as the increment is staged (``record_beside_target``
        appends the tombstones when there are none)."""
        tombstones = Tombstones(target)
        marks = tombstones.to_spark(spark) if self.options.deletes == "hard" else None
        if marks is None:
            return increment
        spec = self.spec
        self._renewed = Observation(f"renewed_{uuid.uuid4().hex}")
        return changes.not_older_than_tombstones(
            increment,
            marks,
            spec.keys,
            spec.watermark.column,
            self._renewed,
            touched=self._window_keys if self._many(tombstones) else None,
        )

    def _many(self, tombstones: Tombstones) -> bool:
        """Whether the run reads only its window's tombstones: the keys are at hand, and
        the tombstones are many (counted from their log's statistics)."""
        return self._window_keys is not None and tombstones.rows() > TOUCHED_ONLY_ABOVE

    def once_counters(self) -> list[Column]:
        """Hard deletes: the window's deletes (none: no tombstone to find)."""
        if self.options.deletes != "hard":
            return []
        return [F.count(F.when(F.col(changes.OP) == "D", 1)).alias(_WINDOW_DELETES)]

    def once_beside(self, rows: DataFrame, counted: dict) -> DataFrame | None:
        """Hard deletes in the window of a run that writes once: a tombstone for each key
        the window deletes, at its newest delete, found in a pass of its own over the
        window's keys, watermarks and operations (the table's rows are written once).

        A key the window deletes and then inserts again (at a higher watermark) keeps its
        tombstone, as when the two changes come in two runs: it only holds back changes
        older than the delete, which the newer row in the table holds back too, so the
        table is the same."""
        if self.options.deletes != "hard" or not counted.get(_WINDOW_DELETES):
            return None
        spec = self.spec
        wm = spec.watermark.column
        return (
            rows.filter(F.col(changes.OP) == "D")
            .groupBy(*[F.col(quote(k)) for k in spec.keys])
            .agg(F.max(F.col(quote(wm))).alias(wm))
        )

    def record_once_beside_target(
        self, spark: SparkSession, target: DeltaTarget, rows: DataFrame, sequence: int = 0
    ) -> int | None:
        Tombstones(target).record_deletes(rows, list(self.spec.keys), self.spec.watermark.column)
        return None

    def merge_plan(self) -> MergePlan:
        spec = self.spec
        deletes = self.options.deletes
        return merge_plan(
            spec.keys,
            spec.watermark.column,
            change_set_clauses(deletes),
            deletes=deletes,
            staged_only_columns=(changes.OP,),
            tombstones=deletes == "hard",
            acts=change_set_acts(deletes),
            newer_acts=True,
        )

    def record_beside_target(
        self,
        spark: SparkSession,
        target: DeltaTarget,
        staged_path: str,
        logged_path: str | None,
        staged_deletes: int | None = None,
        sequence: int = 0,
        renewed: int | None = None,
        beside: DataFrame | None = None,
    ) -> None:
        """Hard deletes: their tombstones (none to write, and no job to find it, when the
        increment's write counted no delete)."""
        plan = self.merge_plan()
        if plan.tombstones and staged_deletes != 0:
            staged = staging.read(spark, staged_path)
            # 0 when no delete is of a key with a tombstone: the new ones are appended, one
            # row per key still (None, not counted: merged).
            Tombstones(target).record(
                staged, list(plan.keys), plan.watermark, staged_deletes, renewed
            )

    def delete_guard(
        self,
        spark: SparkSession,
        state: TargetState,
        target: DeltaTarget,
        rows_extracted: int,
        staged_path: str,
        staged_deletes: int,
    ) -> GuardReport | None:
        guard = DeleteGuard(self.options.max_delete_share)
        soft = self.options.deletes == "soft"
        return judge_deletes(
            spark,
            self.spec,
            guard,
            state,
            target,
            rows_extracted,
            staged_path,
            staged_deletes,
            soft=soft,
            deleted_from=self.spec.partition_column,
            upper_bound=True,
        )


def change_set_acts(deletes: str) -> str:
    """When a staged change acts (see ``change_set_clauses``): a newer change of a row the
    target holds, or (hard deletes) an upsert of a row it does not."""
    if deletes == "hard":
        return f"({{matched}} AND {{newer}}) OR ({{unmatched}} AND s.{changes.OP} = 'U')"
    return "{unmatched} OR {newer}"


def change_set_clauses(deletes: str):
    """A change set's clauses (upserts and deletes by ``_ia_op``), newer changes winning,
    given the condition that a staged change is newer."""
    is_delete, is_upsert = f"s.{changes.OP} = 'D'", f"s.{changes.OP} = 'U'"

    def clauses(newer: str) -> tuple[Clause, ...]:
        if deletes == "hard":
            return (
                delete(f"{is_delete} AND {newer}"),
                update(f"{is_upsert} AND {newer}"),
                insert(is_upsert),
            )
        # Soft: the row stays, flagged; it is the tombstone. The delete's own values win
        # (an image of the row at deletion, or nulls): never blended with older values, so
        # the result does not depend on the order changes arrive in.
        return (update(newer), insert())

    return clauses
