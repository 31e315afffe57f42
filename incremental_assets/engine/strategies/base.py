"""The interface every strategy implements, with the behaviour of a table read by
watermark window and reduced to the newest row per key (append and upsert use it as is).

The run (``engine.load``) calls these methods in phase order and never asks which
strategy it holds: probe (``plan_window``), extract and stage
(``window_rows``, ``stage``), commit (``record_beside_target``, ``merge_plan``) and
result (``change_counts``, ``unchanged``, ``delete_guard``).

Example:
    >>> strategy = strategy_for(spec)  # doctest: +SKIP
    >>> staged = strategy.stage(spark, strategy.window_rows(source, window), ...)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import ClassVar

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import changes, predicates, transforms, validation
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.merge_plan import MergePlan
from incremental_assets.engine.delta_lake.store import DeltaTarget, TargetState
from incremental_assets.engine.guards import (
    GuardReport,
    OutOfRange,
    probe_source,
)
from incremental_assets.engine.snapshots import CHANGE
from incremental_assets.engine.sources import Source
from incremental_assets.engine.spark import key_ranges
from incremental_assets.engine.spark.aggregates import aggregated
from incremental_assets.engine.spark.remote import is_connect
from incremental_assets.engine.strategies.rows import (
    PartitionKey,
    above_counters,
    checked_in_time,
    created_counters,
    divert,
    extract_counters,
    fail_on_bad_rows,
    increment_counters,
    keys_spanned,
    observed,
    partition_key,
    span_counters,
    staged,
    write_counted,
)
from incremental_assets.engine.strategies.unordered import fail_on_unordered_rows
from incremental_assets.engine.watermarks import parse_value
from incremental_assets.engine.windows import LoadRequest, Window, WindowPolicy, plan_window
from incremental_assets.specs import TableSpec

# What the source's file statistics say of a window's first key, asked when needed.
Stated = Callable[[], "key_ranges.FileKeys | None"]

Transform = Callable[[DataFrame], DataFrame]


@dataclass(frozen=True)
class Staged:
    """What staging a window left: the counts observed as the rows were written, the
    columns new to the target, and (history tables) the path of the change-log events new
    to the log. The increment itself is at ``<stage_root>/increment`` (unless written
    once: ``increment``); ``written``: what
    its write counted (``rows``, ``change:<kind>``, ``deletes``: see
    rows.increment_counters); ``quarantined``: rows diverted to
    ``<stage_root>/quarantine`` (None: no rule quarantines); ``logged_rows``: the events
    new to the change log (None: counted by its append, at the commit)."""

    observed: dict
    new_columns: list[str]
    logged_path: str | None = None
    written: dict = field(default_factory=dict)
    quarantined: int | None = None
    logged_rows: int | None = 0
    # Each row's partition key (rows.partition_key; None: the table has none to count).
    partition_key: PartitionKey | None = None
    # A created table's increment, not staged: the commit writes it once, as the table,
    # counting ``counters`` as it does (``written`` is empty until then). None: staged.
    # A function makes it once ``beside`` is recorded (it reads what was recorded).
    increment: DataFrame | Callable[[], DataFrame] | None = None
    counters: tuple[Column, ...] = ()
    # What a run records beside the target before its commit, as rows to read rather
    # than a staged path: a run that writes once, what ``Strategy.once_beside`` finds (a
    # history table: its new change-log events, from the window or read back from
    # staging); a history table's later run whose few events all follow its log, its
    # new events, derived from its staged events (``record_beside_target``).
    beside: DataFrame | None = None
    # History tables whose run found every event logged: the events among them that a run
    # appended to the log for a target commit that never happened (ChangeLog.uncommitted).
    recovered: int = 0


class Strategy:
    """How one table's increments are read, reduced, recorded and merged."""

    kind: ClassVar[str]
    # True when each run reads the source's whole current state (no watermark window).
    reads_whole_source: ClassVar[bool] = False
    # True when runs delete target rows, under the vanished-source guard (``delete_guard``).
    guards_deletes: ClassVar[bool] = False
    # The kinds of change the increment's rows carry (snapshot and history tables), counted
    # as it is written.
    change_kinds: ClassVar[tuple[str, ...]] = ()
    # True when a run that creates the table may write its increment once, as the table
    # (``writes_once``): what the strategy records beside the target does not come from
    # a staged increment (``Staged.beside``).
    creates_in_one_write: ClassVar[bool] = False

    def __init__(self, spec: TableSpec, row_hash: int = transforms.LATEST_ROW_HASH) -> None:
        self.spec = spec
        # How rows are hashed: the target's own way (transforms.row_hash_version).
        self.row_hash = row_hash
        # The run's window keys as read, in a plan that observes nothing (``stage``; None
        # when not at hand: a run with quality rules, of a database or a whole source, that
        # creates the table, or of a folder over Spark Connect): what a strategy may narrow
        # its side tables' rows by before joining them (``held_back``).
        self._window_keys: DataFrame | None = None

    # -- probe -----------------------------------------------------------------------------

    def plan_window(
        self, source: Source, state: TargetState, request: LoadRequest, clock: datetime
    ) -> tuple[Window, OutOfRange | None]:
        """The run's window, with the source's high-water mark captured, and (time
        watermarks) the source rows no window can reach: both in one scan where it can."""
        spec = self.spec
        window = plan_window(
            window_policy(spec),
            state.cursor,
            request,
            clock,
            partition_high_water=last_load_time(state, "partition_high_water"),
        )
        watermark = spec.watermark
        start, zone = spec.partitioning.start, spec.source.timezone
        part = None
        if window.incremental:
            part = predicates.probe_part(window, watermark.column, watermark.tiebreak)
        # One scan: (time watermarks) the rows out of range, (where only a scan can tell)
        # the rows with a null watermark or tie-break, refused before a row is staged, and the
        # high-water mark, but a hybrid watermark's: it ends after ``max_rows`` rows in
        # (time, id) order, a query of its own.
        hybrid = watermark.tiebreak is not None
        probed = probe_source(
            source,
            watermark.column,
            zone,
            (start, clock) if watermark.is_time else None,
            None if part is None or hybrid else (part, watermark.kind),
            watermark.tiebreak,
        )
        fail_on_unordered_rows(spec, source, probed.nulls, probed.tiebreak_nulls)
        if part is None:
            return window, probed.outside
        if hybrid:
            high = source.high_water(part, watermark.kind, watermark.max_rows)
        else:
            high = probed.high_water
        return window.with_high_water(high), probed.outside

    # -- the window's rows -----------------------------------------------------------------

    def shape(self, taken_at: datetime | None = None) -> Transform:
        """The strategy's reshaping of raw source rows."""
        return lambda df: df

    def hash_excludes(self, columns: list[str]) -> tuple[str, ...]:
        """Columns the row hash ignores."""
        return ()

    def flagged(self, df: DataFrame) -> DataFrame:
        """Columns added after the row hash (so a replay hashes the same)."""
        return df

    def prepared(self, taken_at: datetime | None = None) -> Transform:
        """Raw source rows as the loader lands them: reshaped by the strategy, timestamps as
        UTC instants, keys and watermark first, the row hash, then ``flagged``."""
        spec = self.spec

        def transform(df: DataFrame) -> DataFrame:
            df = (
                df.transform(self.shape(taken_at))
                .transform(transforms.to_utc_instants(spec.source.timezone))
                .transform(transforms.ordered_columns(spec.keys, spec.watermark.column))
            )
            excludes = self.hash_excludes(df.columns)
            df = df.transform(transforms.with_row_hash(excludes, self.row_hash))
            return self.flagged(df)

        return transform

    def window_rows(self, source: Source, window: Window) -> DataFrame:
        """The source rows of the window, prepared."""
        parts = self._window_parts(window)
        types = {f.name: f.dataType for f in source.schema.fields}
        zone = self.spec.source.timezone
        raw = source.read(predicates.to_source_ranges(parts, types, zone))
        rows = (
            raw.filter(predicates.to_source_filter(parts, types, zone))
            .transform(self.prepared())
            .filter(predicates.to_filter(parts))
        )
        if window.late_files:
            rows = rows.unionByName(self.late_rows(source, window))
        return rows

    def stated_keys(self, source: Source, window: Window) -> key_ranges.FileKeys | None:
        """What the source's file statistics say of the first key in the files the
        window reads (``Source.key_files``); None without a key, with late files (their
        rows are read apart), or for a Debezium feed (its keys come from the change's
        row images, not the source's own columns)."""
        feed = self.spec.feed
        if not self.spec.keys or window.late_files or (feed and feed.encoding == "debezium"):
            return None
        types = {f.name: f.dataType for f in source.schema.fields}
        parts = self._window_parts(window)
        raw = predicates.to_source_ranges(parts, types, self.spec.source.timezone)
        return source.key_files(self.spec.keys[0], raw)

    def _window_parts(self, window: Window) -> list[predicates.Part]:
        spec = self.spec
        wm, part_col = spec.watermark.column, spec.partition_column
        return predicates.window_parts(window, wm, part_col, spec.watermark.tiebreak)

    def late_rows(self, source: Source, window: Window) -> DataFrame:
        """The rows of the window's late files at or below the cursor that its other parts
        do not read (engine/late_files.py), prepared."""
        spec = self.spec
        wm, tiebreak = spec.watermark.column, spec.watermark.tiebreak
        parts = predicates.window_parts(window, wm, spec.partition_column, tiebreak)
        below = (predicates.Range(wm, None, False, window.cursor_before, True, tiebreak),)
        outside = ~F.coalesce(predicates.to_filter(parts), F.lit(False))
        return (
            source.read_files(window.late_files)
            .transform(self.prepared())
            .filter(predicates.to_filter([below]) & outside)
        )

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
        """Check, count and reduce the window's ``rows`` to the increment, staged at
        ``<stage_root>/increment`` (or, when the run ``writes_once``, left for the commit
        to write as the table); rows failing a quarantine rule are staged apart.
        ``stated``: what the source's file statistics say of the window's keys
        (``stated_keys``), asked only by a run that creates the table. ``pinned``: every
        read of ``rows`` gives the same rows (``Source.pinned``)."""
        spec = self.spec
        key_columns = [F.col(transforms.quote(k)) for k in spec.keys]
        staged_first = bool(spec.quality.rules) or self.reads_whole_source or remote
        quarantined = None
        self._window_keys = None
        # Counted before anything is written (a run that writes once), else observed as
        # the increment is staged.
        counted: dict | None = None
        beside: DataFrame | None = None
        observation: Observation | None = None
        if spec.quality.rules:
            if remote:
                # A database's window is read once, outside the rules' time limit.
                rows = staged(rows, stage_root, "window")
            # The rules are evaluated (and counted) in one job of their own, under
            # quality.rule_timeout; the quarantine and the increment come from its copy.
            rows, observation = checked_in_time(spark, spec, rows, stage_root, "checked")
            rows, quarantined = divert(spec, rows, stage_root, run_id)
        elif staged_first:
            rows, observation = observed(spec, rows)
            if remote and not self.reads_whole_source:
                # A created table's key ranges take a pass of their own over the window.
                rows = staged(rows, stage_root, "window")
        elif self.writes_once(state):
            # Counted before anything is written, in the pass that finds the key ranges:
            # the commit writes the increment once, as the table, and records beside it
            # what the strategy finds in the window's rows (``once_beside``).
            counters = extract_counters(spec, rows.columns) + self.once_counters()
            counters += span_counters(spec)
            as_read = rows
            rows, counted = created_by_key(rows, spec.keys, counters, stated)
            fail_on_bad_rows(spec, counted)
            beside = self.once_beside(as_read, counted)
        else:
            if pinned or not is_connect(spark):
                # A classic session's plan lists the window's files once, whichever part
                # of it reads them; a Connect server lists a folder's for each part, and a
                # file that lands in between could leave a key out of these (a Delta
                # source's version is pinned: its reads agree).
                self._window_keys = rows.select(*key_columns)
            # Observed above the shuffle: the pass that finds a created table's key ranges
            # runs the plan below it once more, and an observation there would count every
            # row twice.
            rows, observation = observed(
                spec, by_key(rows, spec.keys, not state.exists, keep_range=True)
            )
        increment = self.reduce(spark, rows, staged_first, window, state, target, stage_root)
        new_columns: list[str] = []
        if state.schema is not None:
            incoming = increment.drop(changes.OP, CHANGE)
            new_columns = validation.check_against_target(
                spec, incoming.schema, state.schema, target.read_by
            )
        increment = increment.sortWithinPartitions(*key_columns)
        key = partition_key(spec, increment.schema)
        counters = increment_counters(increment.columns, self.change_kinds, key)
        counters += above_counters(self._above_cursor(window, increment.columns), key)
        if counted is not None:
            # Its rows by partition, counted as it is written where that count is exact
            # and cheap: its rows were counted first, and span few keys.
            spanned = keys_spanned(spec, counted)
            if key is not None and spanned is not None:
                tasks = key_ranges.shuffle_partitions(spark)
                counters += created_counters(key, spanned, tasks)
        if counted is not None:
            # Written once, as the table: no merge reads its key range (``range_counters``).
            return Staged(
                counted,
                [],
                partition_key=key,
                increment=increment,
                counters=tuple(counters),
                beside=beside,
            )
        if spec.keys:
            counters += delta_io.range_counters(increment.schema, spec.keys[0])
        written = write_counted(increment, f"{stage_root}/increment", *counters)
        written = {**written, **self.counted_while_staged()}
        assert observation is not None
        counts = observation.get
        fail_on_bad_rows(spec, counts)
        return Staged(
            counts, new_columns, written=written, quarantined=quarantined, partition_key=key
        )

    def writes_once(self, state: TargetState) -> bool:
        """Whether this run writes its increment once, as the table it creates, rather
        than staged and then rewritten by its commit (a large first load or reload saves
        a write and a read of every row): when the strategy allows it, and no check of
        the staged rows comes before the commit (a sequence watermark's gaps read the
        staged ids). ``stage`` asks it only of a run that stages nothing first (no
        quality rule, a window of a file or Delta source); a history table asks it before
        staging its events (when it finds no change log either, it stages none: see
        Scd2.stage), and writes its versions once either way."""
        return (
            self.creates_in_one_write
            and not state.exists
            and bool(self.spec.keys)
            and self.spec.watermark.kind != "sequence"
        )

    def once_counters(self) -> list[Column]:
        """What else a run that writes once counts of the window's rows before it writes
        (``once_beside`` reads it)."""
        return []

    def once_beside(self, rows: DataFrame, counted: dict) -> DataFrame | None:
        """The rows a run that writes its increment once records beside the target before
        its commit (``record_once_beside_target``), found in the window's ``rows`` as
        read (not reduced to the increment), given what was counted of them
        (``once_counters``); None: nothing to record."""
        return None

    def _above_cursor(self, window: Window, columns: list[str]) -> Column | None:
        """The condition of a staged row above the run's cursor, as far as a table's
        statistics tell (a timestamp from the cursor's next millisecond on:
        ``delta_io.above_bound``). None: no cursor, a (time, id) one, or no watermark
        column among the staged rows."""
        column = self.spec.watermark.column
        cursor = window.cursor_before
        if cursor is None or isinstance(cursor, tuple) or column not in columns:
            return None
        bound, inclusive = delta_io.above_bound(cursor)
        return predicates.to_filter([(predicates.Range(column, bound, inclusive),)])

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
        """The window's checked rows reduced to the increment: the newest row per key."""
        spec = self.spec
        if staged_first:
            rows = by_key(rows, spec.keys, not state.exists, keep_range=True)
        newest = transforms.newest_per_key(window_keys(rows, spec.keys), spec.watermark.column)
        return self.held_back(spark, target, drop_range(rows.transform(newest)))

    def counted_while_staged(self) -> dict:
        """What the strategy counted in the increment's plan (``held_back``), read once
        its staged write has run: entries for ``Staged.written``."""
        return {}

    def held_back(
        self, spark: SparkSession, target: DeltaTarget, increment: DataFrame
    ) -> DataFrame:
        """The increment without the changes that deletes kept beside the target hold back
        (older changes must not undo them)."""
        return increment

    # -- commit ----------------------------------------------------------------------------

    def merge_plan(self) -> MergePlan:
        """How the table's increments merge (also used to replay its quarantine)."""
        raise NotImplementedError

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
        """Side tables written before the target's commit (tombstones, a change log);
        ``staged_deletes``: the deletes the increment's write counted (None: not counted);
        ``sequence``: the target's commit sequence the run commits at; ``renewed``: the
        staged deletes of keys with a tombstone already (None: not counted); ``beside``:
        rows to record that were not staged (``Staged.beside``)."""

    def record_once_beside_target(
        self, spark: SparkSession, target: DeltaTarget, rows: DataFrame, sequence: int = 0
    ) -> int | None:
        """Record ``rows`` (``once_beside``) beside the target, before the commit of an
        increment written once (at commit ``sequence``); the rows recorded, where the
        strategy counts them (a history table's new events: ``unchanged``)."""
        raise NotImplementedError

    # -- result ----------------------------------------------------------------------------

    def change_counts(self, written: dict) -> dict[str, int]:
        """Staged rows by kind of change (snapshot and history tables), from what the
        increment's write counted."""
        return {}

    def unchanged(
        self, extracted: int, counts: dict[str, int], logged_rows: int | None
    ) -> int | None:
        """Rows that needed no write, when the strategy knows them apart."""
        return None

    def delete_guard(
        self,
        spark: SparkSession,
        state: TargetState,
        target: DeltaTarget,
        rows_extracted: int,
        staged_path: str,
        staged_deletes: int,
    ) -> GuardReport | None:
        """Judge the run's deletes (``staged_deletes``: the increment's delete rows, counted
        as it was written) before anything is written; raises DeleteGuardError."""
        return None


def by_key(
    rows: DataFrame, keys: list[str], creates_table: bool, keep_range: bool = False
) -> DataFrame:
    """The rows shuffled by key, which the per-key window needs. A run that creates the
    table shuffles them into ranges of the first key (engine/spark/key_ranges.py): each
    staged file, and so each file of the first write, covers a narrow key range, which is
    what lets later merges skip target files by their statistics. Later runs hash them:
    their merge writes files of its own, and ranges cost a pass over the window's keys.

    ``keep_range``: the range column is kept, for a per-key window over
    ``window_keys(...)`` to reuse the shuffle; the caller drops it (``drop_range``)."""
    columns = [F.col(transforms.quote(k)) for k in keys]
    if not creates_table:
        return rows.repartition(*columns)
    found, _ = key_ranges.ranged(rows, keys[0])
    if found is None:
        return rows.repartitionByRange(*columns)
    return found if keep_range else found.drop(key_ranges.KEY_RANGE)


def created_by_key(
    rows: DataFrame, keys: list[str], counters: list[Column], stated: Stated | None = None
) -> tuple[DataFrame, dict]:
    """``by_key`` for a run that creates the table (the range column kept), with the
    values of ``counters`` (aggregates, each named with ``alias``) counted in the pass
    that finds the key ranges, or in one of their own where there is none."""
    shuffle, counted = created_ranges(rows, keys, counters, stated)
    return shuffle(rows), counted


def created_ranges(
    rows: DataFrame, keys: list[str], counters: list[Column], stated: Stated | None = None
) -> tuple[key_ranges.Shuffle, dict]:
    """``created_by_key`` as the shuffle it makes, for other rows of the same keys too:
    into the ranges found in ``rows`` (a ``KEY_RANGE`` column; from the source's file
    statistics where ``stated`` gives them and they describe the rows), or, for keys of
    other types, by Spark's range partitioner (which samples each shuffle's rows for
    bounds of its own, so the ranges may differ)."""
    shuffle, counted = key_ranges.ranges_of(rows, keys[0], *counters, stated=stated)
    if not counted:
        counted = aggregated(rows, *counters, one_job=False)
    if shuffle is None:
        by_keys = [F.col(transforms.quote(k)) for k in keys]

        def shuffle(rows: DataFrame) -> DataFrame:
            return rows.repartitionByRange(*by_keys)

    return shuffle, counted


def window_keys(rows: DataFrame, keys: list[str]) -> list[str]:
    """The per-key window's partition columns: the keys, then the range column where
    ``by_key`` kept it (rows already shuffled on it need no second shuffle by key). The
    keys lead, so the window's sort leaves the rows in key order, as they are staged: no
    second sort of every row (the range is a function of the first key)."""
    return [*keys, key_ranges.KEY_RANGE] if key_ranges.KEY_RANGE in rows.columns else keys


def drop_range(rows: DataFrame) -> DataFrame:
    return rows.drop(key_ranges.KEY_RANGE)


def window_policy(spec: TableSpec) -> WindowPolicy:
    return WindowPolicy(
        kind=spec.watermark.kind,
        lookback=spec.watermark.lookback,
        settle_lag=spec.watermark.settle_lag,
        partitions_cut_watermark=spec.partitions_cut_watermark,
        history_start=spec.partitioning.start,
    )


def last_load_time(state: TargetState, name: str) -> datetime | None:
    """A time the last load recorded in its commit metadata (None when absent)."""
    text = state.last_load.get(name)
    if not text or text == "-":
        return None
    value = parse_value(text, "timestamp")
    assert isinstance(value, datetime)
    return value
