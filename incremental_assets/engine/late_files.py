"""Late files: files of a folder source, or commits of a Delta source, that appear after
the run that passed their watermark range. Without this, their rows sit below the cursor
and no incremental run reads them.

Delta sources: each load commit records the source version it read (``source_version``)
and the source table's id. The next run asks the source's log what the commits since then
added (engine/sources/delta_log.py): appended files whose statistics allow a row at or
below the cursor are read, alone; versions that rewrote files are read from the change
data feed, or reported as unchecked without one. Nothing but the log of the new versions
is read to find them. A table dropped and created again at the source's path (a new id)
is new from version 0.

Folder sources: each load commit records the files it covered first (metadata
``source_files``: name relative to ``source.path``, size, modification time), in the same
Delta commit as its rows: what the ledger says was covered was committed. A run compares
the source's listing (the file index Spark built when the source was opened, so no file is
opened for it) with the ledger; a file it has not seen, or one rewritten in place, is read
whole, and its rows at or below the cursor, outside the window, go through the same
newer-wins merge as the window's: a late change older than what the target holds changes
nothing, a newer one lands once.

The files recorded by each commit are cached in ``<target>__source_file_stamps`` so that a
run reads only the commits since the cache's newest (and caches them); the cache is written
after the target's commit, and a run that dies in between leaves it behind, never wrong.

A target whose loads predate the ledger starts it with the files of its next run, which
are taken as covered (nothing is known about them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine.delta_lake.store import DeltaTarget, SideTable, TargetState
from incremental_assets.engine.sources import open_source
from incremental_assets.engine.sources.base import Source, SourceFile
from incremental_assets.engine.spark.local_rows import local_rows
from incremental_assets.engine.strategies import strategy_for
from incremental_assets.engine.transforms import quote
from incremental_assets.engine.windows import Window
from incremental_assets.specs import TableSpec

LEDGER_KEY = "source_files"
VERSION_KEY = "source_version"
TABLE_ID_KEY = "source_table_id"
UNCHECKED_KEY = "source_versions_unchecked"


@dataclass(frozen=True)
class FileLedger:
    """The files a run's commit records (``new``) and the late ones it reads (``late``:
    the new files, once the ledger has begun). Delta sources: the version the run read,
    the versions since the last load it could not check (rewrites without a change data
    feed), and whether the source's log still held every version since the last load."""

    new: tuple[SourceFile, ...]
    late: tuple[str, ...]
    version: int | None = None
    table_id: str | None = None
    unchecked: tuple[int, ...] = ()
    complete: bool = True
    # False when this run starts the ledger: nothing is known about what came before.
    begun: bool = True
    # Folder sources: covered files read from commits, to be cached (``Covered``).
    uncached: tuple[tuple[SourceFile, int], ...] = ()


class SourceFiles(SideTable):
    """The source files each load covered first (name, size, modification time), cached
    from the loads' commits."""

    SCHEMA = pa.schema(
        [
            ("path", pa.string()),
            ("size", pa.int64()),
            ("modified", pa.int64()),
            ("target_version", pa.int64()),
        ]
    )
    SUFFIX = "source_file_stamps"

    def read(self) -> pa.Table:
        if not self.location.exists():
            return self.SCHEMA.empty_table()
        return self.location.open().to_pyarrow_table(columns=self.SCHEMA.names)

    def record(self, spark: SparkSession, entries: list[tuple[SourceFile, int]]) -> None:
        """Cache ``entries``: files and the target version whose commit covered them."""
        if not entries:
            return
        rows = [
            {"path": f.name, "size": f.size, "modified": f.modified, "target_version": v}
            for f, v in entries
        ]
        # An append, not a merge (a Spark job or two fewer per run): a run caches only
        # what the commits since the cache's newest recorded, so nothing is cached twice,
        # and an entry that were would change nothing (the cache is read as a set).
        self.append_rows(local_rows(spark, rows, self.SCHEMA))


@dataclass(frozen=True)
class Covered:
    """The files the committed loads covered; ``uncached``: those read from commits the
    cache does not hold yet (with their target version), cached by the next commit."""

    files: frozenset[SourceFile]
    uncached: tuple[tuple[SourceFile, int], ...] = ()

    def has(self, file: SourceFile) -> bool:
        # Loads recorded before sizes and times were kept named files only.
        return file in self.files or SourceFile(file.name, None, None) in self.files


def covered(target: DeltaTarget, state: TargetState) -> Covered | None:
    """The files the target's committed loads covered; None until a load has recorded
    them (a new target, or one whose loads predate the ledger)."""
    if not state.exists or state.table is None or state.version is None:
        return None
    cache = SourceFiles(target).read().to_pylist()
    known = {SourceFile(r["path"], r["size"], r["modified"]) for r in cache}
    newest = max((r["target_version"] for r in cache), default=None)
    behind = state.version - (newest if newest is not None else -1)
    tracking = newest is not None
    uncached = []
    for load in target.loads(state.table, limit=behind) if behind > 0 else []:
        if LEDGER_KEY in load:
            tracking = True
            for entry in json.loads(load[LEDGER_KEY]):
                file = SourceFile(*entry) if isinstance(entry, list) else SourceFile(entry)
                uncached.append((file, int(load["version"])))
    if not tracking:
        return None
    return Covered(frozenset(known | {f for f, _ in uncached}), tuple(uncached))


def plan(
    source: Source, target: DeltaTarget, state: TargetState, cursor: object, column: str
) -> FileLedger | None:
    """What the run records and reads late (None: the source has neither files nor
    versions), from the source's files or log and the target's ledger."""
    files = source.files()
    if files is not None:
        return plan_files(files, covered(target, state), cursor)
    if source.version is None:
        return None
    ledger = FileLedger(new=(), late=(), version=source.version, table_id=source.table_id)
    last = state.last_load.get(VERSION_KEY) if state.exists else None
    if last is None or cursor is None:
        return replace(ledger, begun=False)  # the ledger begins: nothing to read late
    last_id = state.last_load.get(TABLE_ID_KEY)
    # A source dropped and created again (a new table id, or versions that start over)
    # shares nothing with the versions the ledger knows: every commit of it is new.
    replaced = int(last) > source.version or last_id not in (None, source.table_id)
    since = -1 if replaced else int(last)
    if since == source.version:
        return ledger  # no commit since the last load
    added = source.added_since(since, cursor, column)
    assert added is not None
    return replace(ledger, late=added.late, unchecked=added.unchecked, complete=added.complete)


def plan_files(files: list[SourceFile], seen: Covered | None, cursor: object) -> FileLedger:
    """What the run records and reads late, given a folder's files and the ledger: a file
    is new when no load covered its name with its size and modification time (a file
    rewritten in place is new again)."""
    if seen is None or cursor is None:
        # The ledger begins: every file is taken as covered, none is read late.
        return FileLedger(new=tuple(files), late=(), begun=False)
    new = tuple(f for f in files if not seen.has(f))
    return FileLedger(new=new, late=tuple(sorted({f.name for f in new})), uncached=seen.uncached)


def metadata(ledger: FileLedger | None) -> dict[str, str | int]:
    if ledger is None:
        return {}
    if ledger.version is None:
        return {LEDGER_KEY: json.dumps([list(f) for f in ledger.new])}
    out: dict[str, str | int] = {VERSION_KEY: ledger.version}
    if ledger.table_id:
        out[TABLE_ID_KEY] = ledger.table_id
    if ledger.unchecked:
        out[UNCHECKED_KEY] = ", ".join(str(v) for v in ledger.unchecked)
    if not ledger.complete:
        out[UNCHECKED_KEY] = "the source's log no longer holds every version since the last load"
    return out


def record_after_commit(
    spark: SparkSession, target: DeltaTarget, ledger: FileLedger | None, version: int | None
) -> None:
    """Cache the files the committed load covered first, and those of earlier commits the
    cache missed (best effort: see the module)."""
    if ledger is None or version is None or ledger.version is not None:
        return
    SourceFiles(target).record(spark, [*ledger.uncached, *((f, version) for f in ledger.new)])


@dataclass(frozen=True)
class Pending:
    """Rows at or below the cursor in files no load has covered: what the next run would
    read late, found without loading (``files``: the uncovered files, or a Delta source's
    appended files and change data). ``ledger`` tells what could not be checked."""

    files: tuple[str, ...]
    rows: int
    partitions: tuple[str, ...]
    ledger: FileLedger


def pending(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    storage: Mapping[str, str] | None = None,
) -> Pending | None:
    """The late rows waiting in ``spec``'s folder or Delta source (None: the table reads
    neither, reads no window, or its ledger has not begun). Costs a listing (the file
    index) or a read of the new versions' log, and a read of the files found."""
    strategy = strategy_for(spec)
    if strategy.reads_whole_source:
        return None
    source = open_source(spark, spec.name, spec.source, dict(storage or {}))
    state = target.state(spec.watermark.kind)
    ledger = plan(source, target, state, state.cursor, spec.watermark.column)
    if ledger is None or not ledger.begun:
        return None
    if not ledger.late:
        return Pending((), 0, (), ledger)
    window = Window(
        mode="incremental",
        cursor_before=state.cursor,
        incremental=False,
        lower=None,
        cap=None,
        backfill_range=None,
        late_files=ledger.late,
    )
    rows = strategy.late_rows(source, window)
    pattern = "yyyy-MM-dd" if spec.partitioning.granularity == "daily" else "yyyy-MM-dd-HH:00"
    partition = F.date_format(F.col(quote(spec.partition_column)), pattern)
    found = rows.agg(F.count(F.lit(1)).alias("n"), F.collect_set(partition).alias("p")).first()
    return Pending(ledger.late, int(found["n"]), tuple(sorted(found["p"])), ledger)
