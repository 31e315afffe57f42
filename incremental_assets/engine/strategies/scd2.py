"""``scd2``: a history target. The window's changes (delivered as upsert rows, a CDC feed
or a snapshot: the strategy of its ``changes`` reads them) are kept in a change log beside
the target; the versions of touched keys are recomputed from it (``engine.history``) and
matched by key and ``valid_from``: written where they differ, removed where history no
longer has them."""

from __future__ import annotations

import uuid
from datetime import datetime

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType, TimestampType

from incremental_assets.engine import changes, history, quality, staging, transforms, validation
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.merge_plan import (
    Clause,
    MergePlan,
    delete,
    insert,
    merge_plan,
    update,
)
from incremental_assets.engine.delta_lake.store import ChangeLog, DeltaTarget, TargetState
from incremental_assets.engine.guards import OutOfRange
from incremental_assets.engine.snapshots import CHANGE, snapshot_changes
from incremental_assets.engine.sources import Source
from incremental_assets.engine.spark import key_ranges
from incremental_assets.engine.strategies.base import (
    Staged,
    Stated,
    Strategy,
    Transform,
    by_key,
    created_ranges,
)
from incremental_assets.engine.strategies.cdc import Cdc
from incremental_assets.engine.strategies.rows import (
    PartitionKey,
    change_counts,
    checked_in_time,
    extract_counters,
    fail_on_bad_rows,
    increment_counters,
    observed,
    partition_key,
    staged,
    staged_counted,
    write_counted,
)
from incremental_assets.engine.strategies.snapshot import Snapshot, refuse_repeated_keys
from incremental_assets.engine.strategies.upsert import Upsert
from incremental_assets.engine.transforms import LATEST_ROW_HASH
from incremental_assets.engine.watermarks import from_transaction_version
from incremental_assets.engine.windows import LoadRequest, Window
from incremental_assets.specs import TableSpec
from incremental_assets.specs.models import SNAPSHOT_AT
from incremental_assets.specs.strategies import Scd2Strategy

# The strategies that can deliver a history table's changes, by ``changes.kind``.
_DELIVERIES: dict[str, type[Strategy]] = {s.kind: s for s in (Upsert, Cdc, Snapshot)}
HISTORY_KINDS = ("open", "close", "update", "remove")
# A run with at most this many events sorts its new ones in one partition, staged as one
# file (no sampling of the keys' ranges first): one task, and one file of the log, whose
# key range spans the run's keys. Wide rows make it a bound by bytes too (100,000 rows of
# 5 KB: 500 MB).
ONE_PARTITION_EVENTS = 100_000


class Scd2(Strategy):
    kind = "scd2"
    change_kinds = HISTORY_KINDS
    # A run that creates the table writes its versions once, as the table: its change
    # log's new events are appended before the commit (``Staged.beside``: staged, or a
    # first load's, from the window), and the versions are computed from them.
    creates_in_one_write = True

    def __init__(self, spec: TableSpec, row_hash: int = LATEST_ROW_HASH) -> None:
        super().__init__(spec, row_hash)
        options = spec.history
        assert isinstance(options, Scd2Strategy)
        self.options = options
        # How the source delivers the changes: that strategy reads the window's rows.
        self.changes = _DELIVERIES[options.changes.kind](spec, row_hash)
        # The change log's version after a first load's append (None: not appended yet,
        # or its commit not found): what the versions it creates are computed from.
        self._logged_version: int | None = None

    # -- reading: as the strategy of the changes -------------------------------------------

    def plan_window(
        self, source: Source, state: TargetState, request: LoadRequest, clock: datetime
    ) -> tuple[Window, OutOfRange | None]:
        return self.changes.plan_window(source, state, request, clock)

    def shape(self, taken_at: datetime | None = None) -> Transform:
        return self.changes.shape(taken_at)

    def hash_excludes(self, columns: list[str]) -> tuple[str, ...]:
        return self.changes.hash_excludes(columns)

    def flagged(self, df: DataFrame) -> DataFrame:
        return self.changes.flagged(df)

    def window_rows(self, source: Source, window: Window) -> DataFrame:
        return self.changes.window_rows(source, window)

    def late_rows(self, source: Source, window: Window) -> DataFrame:
        return self.changes.late_rows(source, window)

    # -- stage -----------------------------------------------------------------------------

    def stage(
        self,
        spark: SparkSession,
        rows: DataFrame,
        window: Window,
        state: TargetState,
        target: DeltaTarget,
        stage_root: str,
        run_id: str,
        remote: bool,
        stated: Stated | None = None,
        pinned: bool = False,
    ) -> Staged:
        """Stage a history table's run in two steps: the window's change events, then,
        from them, the versions to write (``increment``) and the events new to the change
        log (``new_changes``; not staged when they are few and all follow the log: then
        counted as the increment is written, and the log's append derives them from the
        staged events once more, ``Staged.beside``). A first load (``_first_of_all``)
        stages nothing: its events are counted in the pass that finds the key ranges,
        read once, by the log's append, and its versions are written once, as the table,
        from the log (``_first_load``)."""
        spec = self.spec
        scd2 = self.options
        if self.changes.reads_whole_source:
            current = None
            if state.exists:
                live = target.to_spark(spark).filter(F.col(transforms.quote(scd2.is_current)))
                current = live.drop(scd2.valid_from, scd2.valid_to, scd2.is_current)
            assert isinstance(window.high_water, datetime)
            # The diff reads the snapshot twice (changed rows, vanished keys): stage it once.
            rows = staged(rows, stage_root, "snapshot")
            refuse_repeated_keys(spec, rows)
            rows = snapshot_changes(rows, current, spec.keys, SNAPSHOT_AT, window.high_water)
            rows = rows.drop(CHANGE)
        elif changes.OP not in rows.columns:
            rows = rows.withColumn(changes.OP, F.lit("U"))
        new_columns: list[str] = []
        if state.schema is not None:
            validity = {scd2.valid_from, scd2.valid_to, scd2.is_current}
            held = StructType([f for f in state.schema.fields if f.name not in validity])
            new_columns = validation.check_against_target(
                spec, rows.drop(changes.OP).schema, held, target.read_by
            )
        first_key = spec.keys[0]
        events_written: dict = {}
        ranges: key_ranges.Shuffle | None = None
        if spec.quality.rules:
            # Rules are evaluated in this job, under quality.rule_timeout.
            events, observation = checked_in_time(spark, spec, rows, stage_root, "events")
            events = events.drop(quality.FAILED)
            counts = observation.get
        elif self._first_of_all(state, target, remote):
            # Nothing to compare with, so the events are read only once: counted first, in
            # the pass that finds the key ranges, then shuffled into them (not staged).
            counters = extract_counters(spec, rows.columns)
            ranges, counts = created_ranges(rows, spec.keys, counters, stated)
            events = ranges(rows)
        else:
            observed_rows, observation = observed(spec, rows)
            events, events_written = staged_counted(
                observed_rows,
                stage_root,
                "events",
                *delta_io.range_counters(observed_rows.schema, first_key),
                *_effective_counters(observed_rows.schema, spec.effective_column),
            )
            counts = observation.get
        fail_on_bad_rows(spec, counts)

        columns = history_columns(spec, events.columns)
        if ranges is not None:
            return self._first_load(spark, target, counts, new_columns, events, columns, ranges)
        # Only the files of the log and the target that may hold a touched key are read
        # (both are written in key order): the run's cost follows its keys, not the
        # table. The log's rows of those keys are staged (read twice: which events are
        # new, and every event of the keys), the target's read once, by the comparison
        # with the recomputed versions. The events' write counted their keys' range.
        # Events that all follow the log (``_after_log``) need no row of the log: only
        # each touched key's newest version, found among the table's rows of the key.
        touched = (
            delta_io.touched_keys(
                events,
                spec.keys,
                at_most=events_written.get("rows"),
                counted=delta_io.KeyRange.counted(first_key, events_written),
            )
            if state.exists
            else None
        )
        after_log = _after_log(spec, state, target, events_written)
        stored = target.to_spark(spark, holding=touched) if state.exists else None
        logged = None if after_log else ChangeLog(target).to_spark(spark, holding=touched)
        keys = events.select(*[F.col(transforms.quote(k)) for k in spec.keys]).distinct()
        if stored is not None:
            stored = _of(stored, keys, spec.keys)
        if logged is not None:
            logged = staged(_of(logged, keys, spec.keys), stage_root, "log")
        written_rows: dict[str, int] = {}

        def stage(rows: DataFrame, name: str) -> DataFrame:
            found, counted = staged_counted(rows, stage_root, name)
            written_rows[name] = counted["rows"]
            return found

        extracted = int(counts.get("rows") or 0)
        one_file = extracted <= ONE_PARTITION_EVENTS
        # Few events that all follow the log: their new ones are not staged but counted as
        # the increment is written (``counted_new``), and the log's append sorts them
        # from the staged events once more (one partition: no sampling either time).
        counted_new: Observation | None = None
        unstaged: DataFrame | None = None
        if after_log:
            assert stored is not None
            latest = history.latest_versions(stored, columns)
            keep = stage
            if one_file:
                new_count = counted_new = Observation(f"new_changes_{uuid.uuid4().hex}")

                def keep(rows: DataFrame, _name: str) -> DataFrame:
                    return rows.observe(new_count, F.count(F.lit(1)).alias("rows"))

                unstaged = history.new_events(events, columns, one_file=True, deduplicate=True)
            increment, _ = history.later_changes(events, latest, columns, keep, one_file)
        else:
            increment, _ = history.history_changes(
                events, logged, stored, columns, stage=stage, one_file=one_file
            )
        # A created table's versions are written in ranges of the keys; an existing
        # table's increment stays as the comparison's join left it, for the MERGE
        # shuffles it.
        if not state.exists:
            increment = by_key(increment, spec.keys, creates_table=True)
        ordered = _key_ordered(spec, increment)
        key, counters = self._counters(ordered, merged=not self.writes_once(state))
        if counted_new is not None:
            # An existing table's (``after_log``): its increment is staged below.
            assert not self.writes_once(state)
            written = write_counted(ordered, f"{stage_root}/increment", *counters)
            # Always counted: a count that came back missing fails the run here (it would
            # otherwise skip the log's append), never as 0. The run has events, so at
            # least one is new.
            found = counted_new.get
            if "rows" not in found:
                raise RuntimeError(
                    f"{spec.name}: Spark returned no count of the run's new change-log "
                    "events; nothing was committed. Run the load again."
                )
            return Staged(
                counts,
                new_columns,
                written=written,
                logged_rows=int(found["rows"]),
                partition_key=key,
                beside=unstaged,
            )
        # new_changes is staged (history_changes, later_changes); a run with none appends
        # nothing.
        fresh = written_rows.get("new_changes", 0)
        logged_path = f"{stage_root}/new_changes" if fresh else None
        # Events a run logged and died before committing (whether or not this run has new
        # events of its own): those appended for the table's next commit, of any key; this
        # run writes the versions of the keys it touches. A run that creates the table
        # finds every logged event of its window uncommitted (the table was removed, or
        # its first load killed after the log's append). A run that needs no row of the
        # log (``after_log``) found its newest append made for the table's last commit:
        # nothing awaits a commit.
        recovered = 0
        if logged is not None and extracted:
            recovered = (
                ChangeLog(target).uncommitted(state.next_sequence)
                if state.exists
                else extracted - fresh
            )
        if self.writes_once(state):
            # Nothing reads the versions before the commit, which writes them as the
            # table it creates (the staged ones would be written and read once more).
            return Staged(
                counts,
                new_columns,
                logged_path,
                logged_rows=fresh,
                partition_key=key,
                increment=ordered,
                counters=tuple(counters),
                beside=staging.read(spark, logged_path) if logged_path else None,
                recovered=recovered,
            )
        written = write_counted(ordered, f"{stage_root}/increment", *counters)
        return Staged(
            counts,
            new_columns,
            logged_path,
            written=written,
            logged_rows=fresh,
            partition_key=key,
            recovered=recovered,
        )

    def _first_load(
        self,
        spark: SparkSession,
        target: DeltaTarget,
        counts: dict,
        new_columns: list[str],
        events: DataFrame,
        columns: history.HistoryColumns,
        ranges: key_ranges.Shuffle,
    ) -> Staged:
        """A first load (``_first_of_all``), staged as nothing: its events are written
        once, to the change log, by the commit (deduplicated, in ranges of the keys,
        reading the window as it writes), and the table it creates is written from the
        log as appended, its versions computed on the way (``Staged.increment``, made
        after the log's append). The events' ``counts`` come from the pass that found
        the key ranges; the log's append counts the new ones."""
        fresh = history.first_events(events, columns)
        made = _key_ordered(self.spec, history.first_versions(fresh, columns, ranges))
        # The same plan from the events as read (no job): the columns the write counts.
        key, counters = self._counters(made, merged=False)
        if not int(counts.get("rows") or 0):
            # No event: nothing to log (and no log to read), no version.
            return Staged(
                counts, new_columns, partition_key=key, increment=made, counters=tuple(counters)
            )
        log = ChangeLog(target)

        def from_log() -> DataFrame:
            # The log as this run's append left it (``record_once_beside_target``), not a
            # stray writer's append after it.
            logged = log.to_spark(spark, version=self._logged_version)
            assert logged is not None, "the change log is appended before the table"
            return _key_ordered(self.spec, history.first_versions(logged, columns, ranges))

        return Staged(
            counts,
            new_columns,
            logged_rows=None,
            partition_key=key,
            increment=from_log,
            counters=tuple(counters),
            beside=fresh,
        )

    def _counters(
        self, ordered: DataFrame, merged: bool
    ) -> tuple[PartitionKey | None, list[Column]]:
        """The partition key of the increment's rows and what its write counts: the range
        of their first key only for a merge (``merged``), which reads it to find the
        target's files (a table written once has none to find)."""
        key = partition_key(self.spec, ordered.schema)
        counters = increment_counters(ordered.columns, self.change_kinds, key)
        if merged:
            counters += delta_io.range_counters(ordered.schema, self.spec.keys[0])
        return key, counters

    def _first_of_all(self, state: TargetState, target: DeltaTarget, remote: bool) -> bool:
        """Whether the run creates the table and finds no change log either (a first
        load, not the re-run of one killed after the log's append), and reads its window
        once from files (a database's window is staged first, a snapshot diffed)."""
        return (
            self.writes_once(state)
            and not remote
            and not self.changes.reads_whole_source
            and not ChangeLog(target).location.exists()
        )

    # -- commit and result -----------------------------------------------------------------

    def merge_plan(self) -> MergePlan:
        """Versions matched by key and ``valid_from``."""
        spec = self.spec
        return merge_plan(
            spec.keys,
            spec.watermark.column,
            _versions,
            staged_only_columns=(changes.OP, CHANGE),
            identity=[*spec.keys, self.options.valid_from],
            acts=f"{{matched}} OR s.{changes.OP} = 'U'",
            # The increment is the difference from the versions the table held when it
            # was staged (``history._difference``): each row writes or removes one.
            every_row_acts=True,
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
        """The run's changes new to the change log (staged at ``logged_path``, else not
        staged: ``beside``), appended for the commit at ``sequence`` (a later run that
        finds them there uncommitted says so: Staged.recovered)."""
        if logged_path:
            ChangeLog(target).append(staging.read(spark, logged_path), sequence)
        elif beside is not None:
            ChangeLog(target).append(beside, sequence)

    def record_once_beside_target(
        self, spark: SparkSession, target: DeltaTarget, rows: DataFrame, sequence: int = 0
    ) -> int | None:
        """The change log's new events (staged, or a first load's, read from the window
        as they are written: ``_first_load``), before the versions are written once; how
        many, as the append's commit counted them (None when its commit is not found)."""
        log = ChangeLog(target)
        log.append(rows, sequence)
        events, self._logged_version = log.appended(sequence)
        return events

    def change_counts(self, written: dict) -> dict[str, int]:
        return change_counts(written, HISTORY_KINDS)

    def unchanged(
        self, extracted: int, counts: dict[str, int], logged_rows: int | None
    ) -> int | None:
        """The changes already in the change log (replays, duplicates); None until the
        new ones are counted."""
        return None if logged_rows is None else max(extracted - logged_rows, 0)


def _key_ordered(spec: TableSpec, increment: DataFrame) -> DataFrame:
    return increment.sortWithinPartitions(*[F.col(transforms.quote(k)) for k in spec.keys])


def _versions(newer: str) -> tuple[Clause, ...]:
    """Versions written where they differ, removed where history no longer has them."""
    return (
        delete(f"s.{changes.OP} = 'D'"),
        update(f"s.{changes.OP} = 'U'"),
        insert(f"s.{changes.OP} = 'U'"),
    )


# The earliest effective time among a run's events (microseconds), and its events without
# one, as their write counted them (``_effective_counters``).
EFFECTIVE_FIRST, EFFECTIVE_NULLS = "effective:first", "effective:nulls"


def _effective_counters(schema: StructType, column: str) -> list[Column]:
    """What the events' write counts for ``_after_log``: the earliest effective time and
    the events without one (nothing when the column is not a timestamp)."""
    if column not in schema.names or not isinstance(schema[column].dataType, TimestampType):
        return []
    value = F.col(transforms.quote(column))
    return [
        F.min(F.unix_micros(value)).alias(EFFECTIVE_FIRST),
        F.sum(value.isNull().cast("int")).alias(EFFECTIVE_NULLS),
    ]


def _after_log(spec: TableSpec, state: TargetState, target: DeltaTarget, written: dict) -> bool:
    """Whether every event of the run (as its write counted them: ``written``) takes
    effect after every logged event, and the log's newest commit is the append of the
    table's last commit (``ChangeLog.precedes``): the usual run of a feed, whose events
    come in time order. Off where the events' write counted no effective time (a date
    column; tables with quality rules, whose events are staged by their check)."""
    if not state.exists or not written.get("rows") or written.get(EFFECTIVE_NULLS, 1):
        return False
    try:
        first = from_transaction_version(int(written[EFFECTIVE_FIRST]), "timestamp")
    except OverflowError:  # beyond what Python's datetime holds
        return False
    return ChangeLog(target).precedes(spec.effective_column, first, state.sequence)


def _of(rows: DataFrame, keys: DataFrame, names: list[str]) -> DataFrame:
    """The rows of ``keys`` only."""
    return rows.join(F.broadcast(keys), names, "left_semi")


def history_columns(spec: TableSpec, columns: list[str]) -> history.HistoryColumns:
    scd2 = spec.history
    assert scd2 is not None
    effective = spec.effective_column
    untracked = (*spec.keys, effective, spec.watermark.column, spec.partition_column)
    tracked = tuple(scd2.tracked) if scd2.tracked else history.default_tracked(columns, untracked)
    return history.HistoryColumns(
        keys=tuple(spec.keys),
        effective=effective,
        order=spec.watermark.column,
        tracked=tracked,
        valid_from=scd2.valid_from,
        valid_to=scd2.valid_to,
        is_current=scd2.is_current,
    )
