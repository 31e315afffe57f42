"""How an increment lands in the target: the merge of a staged increment, with the
clauses its strategy gives (``engine.strategies``).

All strategies are idempotent and order-independent, so re-running a window, replaying a
backfill or loading windows out of order converges to the same table.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine.delta_lake.catalog import sql_table
from incremental_assets.engine.delta_lake.io import KeySet, may_hold_sql
from incremental_assets.engine.transforms import ROW_HASH, quote

Deletes = Literal["hard", "soft"]
# A column the target's rows carry in ``acting_rows``: null in ``t`` when no row matched.
PRESENT = "_ia_present"
MATCHED = f"t.{PRESENT} IS NOT NULL"
UNMATCHED = f"t.{PRESENT} IS NULL"


@dataclass(frozen=True)
class Clause:
    """One ``WHEN`` clause of a MERGE: ``matched`` target rows are updated (every column
    from ``s``) or deleted, ``not_matched`` staged rows inserted, where ``condition``
    holds (SQL over ``s`` and ``t``)."""

    when: Literal["matched", "not_matched"]
    action: Literal["update", "delete", "insert"]
    condition: str | None = None

    def sql(self, columns: Sequence[str]) -> str:
        head = "WHEN MATCHED" if self.when == "matched" else "WHEN NOT MATCHED"
        if self.condition:
            head += f" AND ({self.condition})"
        names = [quote(c) for c in columns]
        if self.action == "delete":
            return f"{head} THEN DELETE"
        if self.action == "update":
            return f"{head} THEN UPDATE SET " + ", ".join(f"{n} = s.{n}" for n in names)
        values = ", ".join(f"s.{n}" for n in names)
        return f"{head} THEN INSERT ({', '.join(names)}) VALUES ({values})"


def update(condition: str | None = None) -> Clause:
    return Clause("matched", "update", condition)


def delete(condition: str | None = None) -> Clause:
    return Clause("matched", "delete", condition)


def insert(condition: str | None = None) -> Clause:
    return Clause("not_matched", "insert", condition)


@dataclass(frozen=True)
class MergePlan:
    """The merge of a staged increment: join predicate and clauses, given the target's
    columns (the staged columns without ``staged_only_columns``, such as ``_ia_op``)."""

    keys: tuple[str, ...]
    watermark: str
    predicate: str
    newer: str
    clauses: tuple[Clause, ...]
    deletes: Deletes = "hard"
    # Loader columns of a change set that the target does not keep.
    staged_only_columns: tuple[str, ...] = ()
    # Hard deletes are recorded beside the target (``Tombstones``).
    tombstones: bool = False
    # When a staged row ``s`` changes the target, given its matching row ``t`` (``MATCHED``
    # or ``UNMATCHED``): the clauses' conditions, as one SQL condition.
    acts: str = "TRUE"
    identity: tuple[str, ...] = ()
    # A staged row newer than the target's row of its identity always acts (and one that
    # matches none rewrites no file): a run whose rows are all newer than every row of
    # the table merges them in one pass, whatever the table (``DeltaTarget.commit``).
    newer_acts: bool = False
    # Every staged row acts: the increment is the difference between what the target
    # should hold and what it held when it was staged (a history's versions written or
    # removed), so the MERGE reads the staged rows in one pass (``merges_in_one_pass``).
    every_row_acts: bool = False

    @property
    def writes_by_merge_only(self) -> bool:
        """Change sets hold delete rows: even a first load must go through the merge."""
        return bool(self.staged_only_columns)

    @property
    def inserts_only(self) -> bool:
        """Every clause inserts (``append``, landing into bronze): Delta runs such a MERGE
        as an anti join and an append, rewriting no file of the target, so a staged row
        that acts on nothing writes nothing."""
        return all(c.action == "insert" for c in self.clauses)

    def acting_rows(self, staged: DataFrame, current: DataFrame) -> DataFrame:
        """The staged rows a merge would act on, given the target's ``current`` rows (at
        least those that may match): the others (older or identical re-reads) are left
        out, so the merge rewrites no file for them, and a window with none commits no
        data at all."""
        present = current.withColumn(PRESENT, F.lit(True))
        joined = staged.alias("s").join(present.alias("t"), F.expr(self.predicate), "left")
        return joined.filter(F.expr(self.acts)).select("s.*")

    def merge(
        self,
        spark: SparkSession,
        path: str,
        staged: DataFrame,
        columns: Sequence[str],
        holding: KeySet | None = None,
        schema_evolution: bool = False,
        table: str | None = None,
    ) -> None:
        """Merge ``staged`` (alias ``s``) into the Delta table at ``path`` (alias ``t``)
        with the strategy's clauses over ``columns``. ``holding`` (the staged rows' first-key
        values) narrows the target side of the join to the files whose statistics may hold
        them: without it, Delta's merge reads every file's keys to find the ones it
        touches. With ``table``, the merge names that catalog table instead of the path."""
        condition = self.predicate
        if holding is not None:
            condition = f"{may_hold_sql(holding, alias='t')} AND ({condition})"
        run_merge(
            spark, path, staged, condition, self.clauses, columns, schema_evolution, table=table
        )


def run_merge(
    spark: SparkSession,
    path: str,
    source: DataFrame,
    condition: str,
    clauses: Sequence[Clause],
    columns: Sequence[str],
    schema_evolution: bool = False,
    table: str | None = None,
) -> dict[str, int] | None:
    """``MERGE INTO`` the Delta table at ``path`` (or the catalog table ``table``; alias
    ``t``) from ``source`` (alias
    ``s``), in Delta's SQL: the same statement through a local session, a cluster or Spark
    Connect (whose clients have no DeltaTable API without Delta's server plugin). The
    session's settings at the time (``engine.delta_lake.commits.idempotent``) make it an
    idempotent write with the loader's record.

    Returns the statement's row counts (``num_inserted_rows``, ``num_updated_rows``,
    ``num_deleted_rows``, ...), or None when Delta skipped it (its idempotent write was
    already committed)."""
    view = f"ia_merge_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    evolution = " WITH SCHEMA EVOLUTION" if schema_evolution else ""
    statement = (
        f"MERGE{evolution} INTO {sql_table(path, table)} AS t USING {view} AS s ON {condition} "
        + " ".join(clause.sql(columns) for clause in clauses)
    )
    try:
        # A command runs when it is parsed; collecting reads the counts it returned.
        counts = spark.sql(statement).collect()
    finally:
        spark.catalog.dropTempView(view)
    return {k: int(v or 0) for k, v in counts[0].asDict().items()} if counts else None


def same_keys(keys: Sequence[str]) -> str:
    """A merge's join predicate by ``keys``, null-safe: a group whose key is null is still
    one group (the declared layers' tables)."""
    return " AND ".join(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys)


def matching(columns: Sequence[str]) -> str:
    """A merge's join predicate: target ``t`` and source ``s`` equal on ``columns``."""
    return " AND ".join(f"t.{quote(c)} = s.{quote(c)}" for c in columns)


def merge_plan(
    keys: Sequence[str],
    watermark: str,
    clauses: Callable[[str], Sequence[Clause]],
    *,
    deletes: Deletes = "hard",
    staged_only_columns: tuple[str, ...] = (),
    tombstones: bool = False,
    identity: Sequence[str] | None = None,
    acts: str = "TRUE",
    newer_acts: bool = False,
    every_row_acts: bool = False,
) -> MergePlan:
    """A plan matching target rows by ``identity`` (default: the keys), with the
    ``clauses`` given the condition under which a staged row is newer: the watermark
    order, ties broken by the larger content hash (an arbitrary but fixed rule, so two
    versions stamped with the same time converge whatever the order)."""
    wm, h = quote(watermark), quote(ROW_HASH)
    newer = f"s.{wm} > t.{wm} OR (s.{wm} = t.{wm} AND s.{h} > t.{h})"
    identity = tuple(identity or keys)
    return MergePlan(
        keys=tuple(keys),
        watermark=watermark,
        predicate=matching(list(identity)),
        newer=newer,
        clauses=tuple(clauses(f"({newer})")),
        deletes=deletes,
        staged_only_columns=staged_only_columns,
        tombstones=tombstones,
        acts=acts.format(newer=f"({newer})", matched=MATCHED, unmatched=UNMATCHED),
        identity=identity,
        newer_acts=newer_acts,
        every_row_acts=every_row_acts,
    )
