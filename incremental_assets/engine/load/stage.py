"""The extract and stage phase of a run: the window's rows, read, checked and reduced by
the strategy to a staged increment, and what the run learns from it before committing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine import quality, staging, transforms
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import (
    CommitResult,
    DeltaTarget,
    TargetState,
    acting_rows_path,
    file_bound,
)
from incremental_assets.engine.gaps import Gaps, sequence_gaps
from incremental_assets.engine.guards import GuardReport
from incremental_assets.engine.sources import Source
from incremental_assets.engine.strategies import Strategy, strategy_for
from incremental_assets.engine.strategies.base import Staged, last_load_time
from incremental_assets.engine.strategies.rows import (
    ABOVE,
    ABOVE_ROWS,
    FIRST_PARTITION,
    LAST_PARTITION,
    NO_PARTITION,
    RENEWED,
    PartitionKey,
    counted_by_key,
    partition_key,
)
from incremental_assets.engine.transforms import LATEST_ROW_HASH
from incremental_assets.engine.watermarks import from_transaction_version
from incremental_assets.engine.windows import Window
from incremental_assets.specs import TableSpec


def prepared_rows(
    spec: TableSpec, taken_at: datetime | None = None, row_hash: int = LATEST_ROW_HASH
):
    """Raw source rows as the loader lands them: reshaped by the strategy, timestamps as UTC
    instants, keys and watermark first, the row hash (``row_hash``: the target's way), and
    soft-delete flags for CDC tables that keep deleted rows (added after the hash, so a
    replay hashes the same)."""
    return strategy_for(spec, row_hash).prepared(taken_at)


def window_rows(spec: TableSpec, source: Source, window: Window) -> DataFrame:
    """The source rows of the window, prepared (a snapshot: every row, stamped)."""
    return strategy_for(spec).window_rows(source, window)


@dataclass(frozen=True)
class Extract:
    """A staged window: where its increment is, and what the run knows of it
    (``rows_quarantined``: rows diverted to ``quarantined_path``, None when no rule
    quarantines)."""

    staged_path: str
    quarantined_path: str
    logged_path: str | None
    new_columns: list[str]
    rows_extracted: int
    rows_staged: int
    partition_high_water: datetime | None
    changes: dict[str, int]
    unchanged: int | None
    gaps: Gaps | None
    guard: GuardReport | None
    quality: quality.QualityReport | None
    rows_late: int = 0
    files_late: int = 0
    rows_quarantined: int | None = None
    # The deletes the increment's write counted (change sets; None: not counted), and
    # those of keys with a tombstone already (hard deletes; None: not counted).
    staged_deletes: int | None = None
    deletes_renewed: int | None = None
    # Each row's partition key (rows.partition_key), and what the increment's write
    # counted of them (rows.partition_counters).
    partition_key: PartitionKey | None = None
    partition_keys: dict = field(default_factory=dict)
    # The range of the increment's first key, as its write counted it (None: not counted).
    key_range: delta_io.KeyRange | None = None
    # A created table's increment, not staged (``Strategy.writes_once``): the commit
    # writes it as the table, counting ``counters``; what it counted is then taken in
    # (``written``). Until then the counts of the increment's write are empty (0).
    increment: DataFrame | Callable[[], DataFrame] | None = None
    counters: tuple[Column, ...] = ()
    # What the run records beside the target, as rows rather than a path (``Staged.beside``).
    beside: DataFrame | None = None
    # History tables: logged events of a target commit that never happened (Staged).
    events_recovered: int = 0
    # The bytes a row of the source takes (Source.bytes_per_row): the files of a table the
    # run creates hold at most a file's bytes of them. None: not known, or no table created.
    bytes_per_row: float | None = None

    def written(self, strategy: Strategy, counted: dict) -> Extract:
        """This extract with what the write of its ``increment`` counted (and the rows
        recorded beside it, where counted then: ``LOGGED_ROWS``)."""
        found = _written(strategy, counted)
        if counted.get(LOGGED_ROWS) is not None:
            logged = int(counted[LOGGED_ROWS])
            found["unchanged"] = strategy.unchanged(self.rows_extracted, found["changes"], logged)
        return replace(self, **found)


# The events a history table's first load appended to its change log, as the commit counted
# them (``Staged.logged_rows`` is None until then).
LOGGED_ROWS = "logged_rows"
# The rows of a CSV or JSON folder written as Parquet to size a created table's rows, where
# its increment is written once (``Source.sample``): about 2 MB at 1 KB a row.
SAMPLED_ROWS = 2_000


def _written(strategy: Strategy, written: dict) -> dict:
    """What an increment's write counted (``rows``, see ``Staged.written``), as the
    extract's fields."""
    spec = strategy.spec
    return {
        # Always counted (a write whose count came back missing fails here, never as 0).
        "rows_staged": int(written["rows"]),
        "changes": strategy.change_counts(written),
        # Counted as the increment was written (an int), absent when it holds no change set.
        "staged_deletes": written.get("deletes"),
        "deletes_renewed": written.get(RENEWED),
        "partition_keys": {k: v for k, v in written.items() if k.startswith("partition:")},
        "key_range": delta_io.KeyRange.counted(spec.keys[0], written) if spec.keys else None,
    }


def extract(
    spark: SparkSession,
    strategy: Strategy,
    source: Source,
    window: Window,
    state: TargetState,
    target: DeltaTarget,
    stage_root: str,
    run_id: str,
) -> Extract:
    """Stage the window's increment under ``stage_root`` and judge it (counts, gaps, the
    delete guard) before anything is written."""
    spec = strategy.spec
    staged_path = f"{stage_root}/increment"
    rows = strategy.window_rows(source, window)
    # Late files are few and new: counting their rows apart reads only them once more.
    rows_late, files_late = _late_counts(strategy, source, window)
    staged = strategy.stage(
        spark,
        rows,
        window,
        state,
        target,
        stage_root,
        run_id,
        remote=source.remote,
        stated=lambda: strategy.stated_keys(source, window),
        pinned=source.pinned,
    )
    observed = staged.observed
    rows_extracted = int(observed["rows"])
    quarantined_path = f"{stage_root}/quarantine"
    report = _quality_report(spec, observed, staged.quarantined or 0)
    partition_high_water = _later(
        last_load_time(state, "partition_high_water"),
        from_transaction_version(int(observed["pc_max"]), "timestamp")
        if observed["pc_max"] is not None
        else None,
    )
    # Counted as the increment was written (rows.write_counted), not read back.
    # (An increment written once is counted by the commit's write: nothing yet.)
    written = _written(strategy, staged.written if staged.increment is None else {"rows": 0})
    unchanged = strategy.unchanged(rows_extracted, written["changes"], staged.logged_rows)
    gaps = _gaps(spark, spec, window, staged_path)
    deletes = written["staged_deletes"] or 0
    guard = strategy.delete_guard(spark, state, target, rows_extracted, staged_path, deletes)
    return Extract(
        staged_path=staged_path,
        quarantined_path=quarantined_path,
        logged_path=staged.logged_path,
        new_columns=staged.new_columns,
        rows_extracted=rows_extracted,
        partition_high_water=partition_high_water,
        unchanged=unchanged,
        gaps=gaps,
        guard=guard,
        quality=report,
        rows_late=rows_late,
        files_late=files_late,
        rows_quarantined=staged.quarantined,
        partition_key=staged.partition_key,
        increment=staged.increment,
        counters=staged.counters,
        beside=staged.beside,
        events_recovered=staged.recovered,
        bytes_per_row=None
        if state.exists
        else _bytes_per_row(spark, spec, source, staged, staged_path, stage_root),
        **written,
    )


def _bytes_per_row(
    spark: SparkSession,
    spec: TableSpec,
    source: Source,
    staged: Staged,
    staged_path: str,
    stage_root: str,
) -> float | None:
    """The bytes a row of the table a run creates is expected to take: the source's
    (``Source.bytes_per_row``: a Delta table's log, a Parquet folder's footers), else the
    staged increment's (its Parquet files over its rows: CSV, JSON and database sources
    whose first load is staged), else a sample's (``Source.sample``, written as Parquet:
    a CSV or JSON increment written once). None when none is known, and, asking no Spark
    job, when the source's files hold at most a file's bytes in all (unless they are
    compressed text): the table's files then come out about that size at most (more where
    it adds columns to narrow rows, or its source is compressed harder), which is what the
    bound is for."""
    scanned = source.scan_bytes()
    bound = file_bound(spec.target.file_size)
    if scanned is not None and scanned <= bound and not source.compressed_text():
        return None
    known = source.bytes_per_row()
    if known is not None:
        return known
    if staged.increment is None:
        rows = int(staged.written.get("rows") or 0)
        return staging.bytes_per_row(spark, staged_path, rows)
    sample = source.sample(SAMPLED_ROWS)
    if sample is None:
        return None
    return staging.sampled_bytes_per_row(spark, sample, f"{stage_root}/sample")


def rows_by_partition(
    spark: SparkSession,
    strategy: Strategy,
    target: DeltaTarget,
    extracted: Extract,
    committed: CommitResult,
) -> dict[str, int]:
    """The rows a committed run wrote, counted by partition key (``2026-01-02``, or
    ``2026-01-02-13:00`` for hourly tables) from the partition column: the rows its merge
    acted on (re-read rows that changed nothing are not counted), or all staged rows when
    it created the table. A run of an ``id`` watermark reads every row above its cursor,
    so it may load rows of later partitions (or, reading a late file, of earlier ones);
    this says which. When all those rows have one key (the usual run: one day), the counts
    taken as they were staged say it; otherwise Spark counts them (on the warehouse) by
    key.

    A merge in two passes (``DeltaTarget.merges_in_one_pass`` says when: a large table
    without deletion vectors, clauses that update or delete, rows that may not act)
    staged its acting rows apart: they are counted. Otherwise the merge read the
    staged rows in one pass; when its own counts say every staged row acted (the usual
    increment), the staged rows are the acting rows (``CommitResult.acted`` holds their
    staged counts); a run that also re-read rows which changed nothing counts them by the
    merge's own metrics when the staged rows share one key, else finds its acting rows
    again, against the version before its commit."""
    spec = strategy.spec
    staged_path = extracted.staged_path
    written_once = None  # the new table's version, when nothing was staged
    if committed.created_table:
        counted, path = {**extracted.partition_keys, "rows": extracted.rows_staged}, staged_path
        if extracted.increment is not None:
            written_once = committed.version
    elif not committed.committed or committed.cursor_only:
        return {}
    elif committed.acting_staged:
        counted, path = committed.acted, acting_rows_path(staged_path)
    elif committed.acted:  # one pass, and every staged row acted
        counted, path = committed.acted, staged_path
    else:  # one pass, and some staged rows changed nothing
        if extracted.partition_key is None:
            return {}
        key = _one_key(extracted.partition_keys)
        if key is None and _acted_above_only(extracted, committed):
            key = _one_key(extracted.partition_keys, above=True)
        if key is not None:
            return {key: committed.rows_acted}
        assert committed.version is not None
        plan, before = strategy.merge_plan(), committed.version - 1
        return _counted_by_key(spec, target.acting_rows(spark, staged_path, plan, before))
    key = _one_key(counted)
    if key is not None:
        return {key: int(counted["rows"])}
    if committed.created_table and extracted.partition_key is not None:
        by_key = counted_by_key(extracted.partition_key, counted)
        if by_key is not None:
            return by_key
    if written_once is not None:
        return _counted_by_key(spec, target.to_spark(spark, written_once))
    return _counted_by_key(spec, staging.read(spark, path))


def counted_in_one_pass(extracted: Extract) -> bool:
    """Whether a one-pass merge's own counts may say its rows by partition: the staged
    rows share one key, or the table has none (whichever rows act), or the staged rows
    above the cursor share one (when those alone act: ``_acted_above_only``)."""
    return (
        extracted.partition_key is None
        or _one_key(extracted.partition_keys) is not None
        or _one_key(extracted.partition_keys, above=True) is not None
    )


def _acted_above_only(extracted: Extract, committed: CommitResult) -> bool:
    """Whether the merge acted on the staged rows above the cursor and on no other: each
    of them is newer than every row of the table (``newer_acted``) and, with no delete
    among the staged rows, updates its row or inserts one; so when the merge acted on as
    many rows as there are above the cursor, the rows below it (re-read by a lookback)
    changed nothing."""
    above = extracted.partition_keys.get(ABOVE_ROWS)
    return (
        committed.newer_acted
        and not extracted.staged_deletes
        and above is not None
        and committed.rows_acted == int(above)
    )


def _one_key(counted: dict, above: bool = False) -> str | None:
    """The partition key every counted row (``above``: every row above the cursor)
    shares, if they share one."""
    names = ABOVE if above else {k: k for k in (FIRST_PARTITION, LAST_PARTITION, NO_PARTITION)}
    first, last = counted.get(names[FIRST_PARTITION]), counted.get(names[LAST_PARTITION])
    if isinstance(first, str) and first == last and not counted.get(names[NO_PARTITION]):
        return first
    return None


def _counted_by_key(spec: TableSpec, rows: DataFrame) -> dict[str, int]:
    """``rows`` counted by partition key, by Spark (on the warehouse)."""
    key = partition_key(spec, rows.schema)
    if key is None:
        return {}
    # Grouped by the partition's start, and only the groups' starts written as text.
    counts = rows.groupBy(key.start.alias("start")).count()
    found = counts.select(key.text(F.col("start")).alias("key"), "count").collect()
    return {r["key"]: int(r["count"]) for r in found if r["key"] is not None}


def _quality_report(spec: TableSpec, observed: dict, diverted: int) -> quality.QualityReport | None:
    rules = spec.quality.rules
    if not rules:
        return None
    return quality.report(rules, observed, diverted)


def _gaps(spark: SparkSession, spec: TableSpec, window: Window, staged_path: str) -> Gaps | None:
    """Ids missing above the previous cursor, for 'sequence' watermarks (the staged ids,
    read by Spark and handed to the driver as Arrow)."""
    if spec.watermark.kind != "sequence" or not window.reads_incremental:
        return None
    column = spec.watermark.column
    ids = staging.read(spark, staged_path).select(transforms.quote(column)).toArrow()
    after = window.cursor_before if isinstance(window.cursor_before, int) else None
    return sequence_gaps(ids.column(0), after)


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    values = [v for v in (a, b) if v is not None]
    return max(values) if values else None


def _late_counts(strategy: Strategy, source: Source, window: Window) -> tuple[int, int]:
    """The late rows a run reads, and the files that hold them (of the files read for
    them, those with a row at or below the cursor)."""
    if not window.late_files:
        return 0, 0  # nor any file to read: a database source has none
    files = strategy.late_rows(source, window).select(F.input_file_name().alias("file"))
    found = files.agg(F.count(F.lit(1)).alias("rows"), F.count_distinct("file").alias("files"))
    found = found.first()
    return int(found["rows"]), int(found["files"])
