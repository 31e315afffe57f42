"""``snapshot``: the source gives its whole current state each run; it is diffed against
the target (``engine.snapshots``) and lands as a change set ordered by the snapshot time:
inserted, changed and vanished rows (removed, or kept flagged when deletes are soft)."""

from __future__ import annotations

from datetime import datetime, timezone

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import changes
from incremental_assets.engine.delta_lake.merge_plan import MergePlan, merge_plan
from incremental_assets.engine.delta_lake.store import DeltaTarget, TargetState
from incremental_assets.engine.errors import DuplicateKeysError
from incremental_assets.engine.guards import DeleteGuard, GuardReport, OutOfRange
from incremental_assets.engine.snapshots import CHANGE, repeated_keys, snapshot_changes
from incremental_assets.engine.sources import Source
from incremental_assets.engine.strategies.base import (
    Strategy,
    Transform,
    by_key,
    last_load_time,
)
from incremental_assets.engine.strategies.cdc import change_set_acts, change_set_clauses
from incremental_assets.engine.strategies.deletes import judge_deletes
from incremental_assets.engine.strategies.rows import change_counts, staged
from incremental_assets.engine.transforms import LATEST_ROW_HASH
from incremental_assets.engine.windows import LoadRequest, Window, snapshot_window
from incremental_assets.specs import TableSpec
from incremental_assets.specs.models import SNAPSHOT_AT
from incremental_assets.specs.strategies import SnapshotStrategy

SNAPSHOT_KINDS = ("insert", "change", "vanish")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class Snapshot(Strategy):
    kind = "snapshot"
    reads_whole_source = True
    guards_deletes = True
    change_kinds = SNAPSHOT_KINDS

    def __init__(self, spec: TableSpec, row_hash: int = LATEST_ROW_HASH) -> None:
        super().__init__(spec, row_hash)
        # The snapshot's settings: the strategy itself, or an scd2 table's ``changes``.
        options = spec.change_strategy
        assert isinstance(options, SnapshotStrategy)
        self.options = options

    def plan_window(
        self, source: Source, state: TargetState, request: LoadRequest, clock: datetime
    ) -> tuple[Window, OutOfRange | None]:
        """The snapshot's window: its time is the source's clock (no row is out of reach)."""
        last_end = last_load_time(state, "partition_end")
        return snapshot_window(self.spec.name, state.cursor, request, clock, last_end), None

    def shape(self, taken_at: datetime | None = None) -> Transform:
        """A snapshot's rows are stamped with the time it was taken."""
        stamp = F.lit(taken_at or _EPOCH).cast("timestamp")
        return lambda df: df.withColumn(SNAPSHOT_AT, stamp)

    def hash_excludes(self, columns: list[str]) -> tuple[str, ...]:
        """A snapshot's time (the same row in two snapshots is unchanged), and the
        untracked columns."""
        tracked = self.options.tracked
        if tracked is None:
            return (SNAPSHOT_AT,)
        keep = {*self.spec.keys, *tracked}
        return tuple(c for c in columns if c not in keep)

    def window_rows(self, source: Source, window: Window) -> DataFrame:
        """Every row of the source, stamped (a key held twice is refused when staged)."""
        assert isinstance(window.high_water, datetime)
        return source.read().transform(self.prepared(window.high_water))

    def reduce(
        self,
        spark: SparkSession,
        rows: DataFrame,
        staged_first: bool,
        window: Window,
        state: TargetState,
        target: DeltaTarget,
        stage_root: str,
    ) -> DataFrame:
        """The snapshot diffed against the target."""
        # The diff reads the snapshot twice (changed rows, vanished keys): stage it once.
        snapshot = staged(rows, stage_root, "snapshot")
        refuse_repeated_keys(self.spec, snapshot)
        taken_at = window.high_water
        assert isinstance(taken_at, datetime)
        spec = self.spec
        soft = self.options.deletes == "soft"
        current = target.to_spark(spark) if state.exists else None
        diff = snapshot_changes(
            snapshot,
            current,
            spec.keys,
            SNAPSHOT_AT,
            taken_at,
            deleted_column=changes.IS_DELETED if soft else None,
        )
        if soft:
            diff = diff.transform(changes.soft_delete_columns(SNAPSHOT_AT))
        return by_key(diff, spec.keys, not state.exists)

    def merge_plan(self) -> MergePlan:
        """The diff lands as a change set ordered by the snapshot time."""
        spec = self.spec
        return merge_plan(
            spec.keys,
            spec.watermark.column,
            change_set_clauses(self.options.deletes),
            deletes=self.options.deletes,
            staged_only_columns=(changes.OP, CHANGE),
            acts=change_set_acts(self.options.deletes),
        )

    def change_counts(self, written: dict) -> dict[str, int]:
        return change_counts(written, SNAPSHOT_KINDS)

    def unchanged(
        self, extracted: int, counts: dict[str, int], logged_rows: int | None
    ) -> int | None:
        """Snapshot rows that matched the target exactly."""
        return max(extracted - counts.get("insert", 0) - counts.get("change", 0), 0)

    def delete_guard(
        self,
        spark: SparkSession,
        state: TargetState,
        target: DeltaTarget,
        rows_extracted: int,
        staged_path: str,
        staged_deletes: int,
    ) -> GuardReport | None:
        guard = DeleteGuard(self.options.max_delete_share, self.options.allow_empty)
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
            deleted_from=SNAPSHOT_AT,
            upper_bound=False,
        )


def refuse_repeated_keys(spec: TableSpec, snapshot: DataFrame) -> None:
    """Refuse a snapshot that holds a key more than once, before anything is committed.

    A snapshot is its source's current state, one row per key. Two rows of one key have no
    order to choose by (no watermark), so keeping one would be a guess a later snapshot
    could flip; quarantining them would read as the key vanishing, and delete it from the
    target. The usual cause is keys that do not identify a row, which only the spec or the
    source can fix.

    Raises:
        DuplicateKeysError: naming how many keys repeat and some of them.
    """
    count, sample = repeated_keys(snapshot, spec.keys)
    if not count:
        return
    more = f" and {count - len(sample)} more" if count > len(sample) else ""
    keys = ", ".join(spec.keys)
    raise DuplicateKeysError(
        spec.name,
        count,
        sample,
        f"the snapshot holds {count} key{'s' if count != 1 else ''} ({keys}) more than once: "
        f"{'; '.join(sample)}{more}. A snapshot holds one row per key, and the rows of one "
        "key have no order to choose by. Nothing was committed.",
        "remove the repeated rows in the source, or set keys to columns that identify a row "
        "(add the column in which the repeated rows differ)",
    )
