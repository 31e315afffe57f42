"""The quarantine: rows a quality rule diverted, kept in ``<target>__quarantine``, and
their replay into the target once the rule or the data is fixed."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import changes, quality, staging, transforms
from incremental_assets.engine.delta_lake.merge_plan import MergePlan
from incremental_assets.engine.delta_lake.store import (
    DeltaTarget,
    SideTable,
    Tombstones,
    row_count,
)
from incremental_assets.engine.watermarks import format_value
from incremental_assets.specs import TableSpec


class Quarantine(SideTable):
    """A Delta table beside the target: the diverted rows as loaded (with the loader's row
    hash), the rules they failed, the run id and the time. Written before the target's
    commit; a row is recorded once however often its window is re-read."""

    SUFFIX = "quarantine"

    def record(self, spark: SparkSession, staged_path: str, identity: list[str]) -> None:
        """Insert the staged diverted rows (the run stages some only when it diverts any)
        that the quarantine does not hold yet."""
        self.insert_missing(staging.read(spark, staged_path), identity)

    def rows(self) -> int:
        if not self.location.exists():
            return 0
        return row_count(self.location.open())  # from the log's file statistics


@dataclass(frozen=True)
class ReplayResult:
    examined: int
    replayed: int
    still_failing: int
    rows_inserted: int
    rows_updated: int
    delta_version: int | None
    committed: bool = False
    """Whether the replay wrote a Delta version (``delta_version`` is then that version,
    else the table's current one)."""


def replay(
    spark: SparkSession, spec: TableSpec, target: DeltaTarget, plan: MergePlan
) -> ReplayResult:
    """Merge the quarantined rows that now pass every quarantine rule into the target
    (with the table's usual newer-wins merge, so a replay after newer loads changes
    nothing they superseded), then remove them from the quarantine. The watermark stays.
    A replayed hard delete is tombstoned first, as a run's is.

    A replay that dies between the two steps is repeated safely: the merge of rows already
    merged writes nothing."""
    held = Quarantine(target)
    rows = held.to_spark(spark)
    if rows is None:
        return ReplayResult(0, 0, 0, 0, 0, None)
    rules = spec.quality.rules
    business = rows.drop(*quality.QUARANTINE_COLUMNS)
    checked = quality.failed_rules(spec.name, business, rules)
    passing = checked.filter(~quality.diverted(rules)).drop(quality.FAILED)
    root = staging.root_of(spec.name, target.path)
    with staging.run_folder(spark, root, kind="replay") as stage:
        key_columns = [F.col(transforms.quote(k)) for k in spec.keys]
        newest = passing.repartitionByRange(*key_columns).transform(
            transforms.newest_per_key(spec.keys, spec.watermark.column)
        )
        marks = Tombstones(target).to_spark(spark) if plan.tombstones else None
        if marks is not None:  # a change older than a hard delete stays deleted
            newest = changes.not_older_than_tombstones(
                newest, marks, spec.keys, spec.watermark.column
            )
        replaying = newest.sortWithinPartitions(*key_columns)
        # A hard-delete table's deletes counted as they are staged, for their tombstones.
        deletes = [F.count(F.when(F.col(changes.OP) == "D", 1)).alias("deletes")]
        written = staging.write_counted(
            replaying, f"{stage}/replay", *(deletes if plan.tombstones else [])
        )
        staged_rows = written["rows"]
        released = staging.write_counted(passing.select(*identity_of(spec)), f"{stage}/released")[
            "rows"
        ]
        examined = held.rows()
        state = target.state(spec.watermark.kind)
        commit = None
        if released:
            cursor = format_value(state.cursor)
            if plan.tombstones:
                # Before the target's commit, as a run records its hard deletes: a change
                # older than a replayed delete stays deleted (a replay that dies after this
                # leaves a tombstone the repeated replay writes again, harmless).
                Tombstones(target).record(
                    staging.read(spark, f"{stage}/replay"),
                    list(plan.keys),
                    plan.watermark,
                    written["deletes"],
                )
            commit = target.commit(
                spark,
                state,
                f"{stage}/replay",
                plan,
                cursor_before=state.cursor,
                cursor_after=None,  # the watermark stays where it is
                metadata={
                    "mode": "quarantine_replay",
                    "cursor_before": cursor,
                    "cursor_after": cursor,
                    "rows_replayed": released,
                },
                partition_by=list(spec.target.partition_by),
                add_new_columns=False,
                staged_rows=staged_rows,
                file_bytes=spec.target.file_size,
            )
            _release(spark, held, f"{stage}/released", identity_of(spec))
    return ReplayResult(
        examined=examined,
        replayed=released,
        still_failing=examined - released,
        rows_inserted=commit.rows_inserted if commit else 0,
        rows_updated=commit.rows_updated if commit else 0,
        delta_version=commit.version if commit else state.version,
        committed=bool(commit and commit.committed),
    )


def identity_of(spec: TableSpec) -> list[str]:
    """What identifies a quarantined row: its keys, watermark and content hash."""
    return list(dict.fromkeys([*spec.keys, spec.watermark.column, transforms.ROW_HASH]))


def _release(
    spark: SparkSession, held: Quarantine, released_path: str, identity: list[str]
) -> None:
    held.delete_matching(staging.read(spark, released_path), identity, {"released": True})
