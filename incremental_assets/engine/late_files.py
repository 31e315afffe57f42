"""Late files: files of a folder source that appear after the run that passed their
watermark range. Without this, their rows sit below the cursor and no incremental run
reads them.

Each load commit records the files it covered first (metadata ``source_files``: their
names, relative to ``source.path``), in the same Delta commit as its rows: what the ledger
says was covered was committed. A run compares the source's listing (the file index Spark
built when the source was opened, so no file is opened for it) with the ledger; a file it
has not seen is read whole, and its rows at or below the cursor, outside the window, go
through the same newer-wins merge as the window's: a late change older than what the
target holds changes nothing, a newer one lands once.

The names recorded by each commit are cached in ``<target>__source_files`` so that a run
reads only the commits since the cache's newest; the cache is written after the target's
commit, and a run that dies in between leaves it behind, never wrong.

A target whose loads predate the ledger starts it with the files of its next run, which
are taken as covered (nothing is known about them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from incremental_assets.engine.delta_lake.store import DeltaTarget, SideTable, TargetState
from incremental_assets.engine.sources import open_source
from incremental_assets.engine.strategies import strategy_for
from incremental_assets.engine.transforms import quote
from incremental_assets.engine.windows import Window
from incremental_assets.specs import TableSpec

LEDGER_KEY = "source_files"


@dataclass(frozen=True)
class FileLedger:
    """The files a run's commit records (``new``) and the late ones it reads (``late``:
    the new files, once the ledger has begun)."""

    new: tuple[str, ...]
    late: tuple[str, ...]


class SourceFiles(SideTable):
    """The source files each load covered first, cached from the loads' commits."""

    SCHEMA = pa.schema([("path", pa.string()), ("target_version", pa.int64())])
    SUFFIX = "source_files"

    def read(self) -> pa.Table:
        if not self.location.exists():
            return self.SCHEMA.empty_table()
        return self.location.open().to_pyarrow_table(columns=["path", "target_version"])

    def record(self, spark: SparkSession, names: list[str], version: int) -> None:
        if not names:
            return
        rows = [{"path": name, "target_version": version} for name in names]
        entries = spark.createDataFrame(rows, from_arrow_schema(self.SCHEMA))
        self.insert_missing(entries, ["path"])


def covered(target: DeltaTarget, state: TargetState) -> set[str] | None:
    """The files the target's committed loads covered; None until a load has recorded
    them (a new target, or one whose loads predate the ledger)."""
    if not state.exists or state.table is None or state.version is None:
        return None
    cache = SourceFiles(target).read()
    known = set(cache["path"].to_pylist())
    newest = pc.max(cache["target_version"]).as_py() if cache.num_rows else None
    behind = state.version - (newest if newest is not None else -1)
    tracking = newest is not None
    for load in target.loads(state.table, limit=behind) if behind > 0 else []:
        if LEDGER_KEY in load:
            tracking = True
            known.update(json.loads(load[LEDGER_KEY]))
    return known if tracking else None


def plan(files: list[str] | None, seen: set[str] | None, cursor: object) -> FileLedger | None:
    """What the run records and reads late, given the source's files (None: the source
    has none) and the ledger."""
    if files is None:
        return None
    if seen is None or cursor is None:
        # The ledger begins: every file is taken as covered, none is read late.
        return FileLedger(new=tuple(files), late=())
    new = tuple(name for name in files if name not in seen)
    return FileLedger(new=new, late=new)


def metadata(ledger: FileLedger | None) -> dict[str, str]:
    return {LEDGER_KEY: json.dumps(list(ledger.new))} if ledger is not None else {}


def record_after_commit(
    spark: SparkSession, target: DeltaTarget, ledger: FileLedger | None, version: int | None
) -> None:
    """Cache the files the committed load covered first (best effort: see the module)."""
    if ledger is not None and ledger.new and version is not None:
        SourceFiles(target).record(spark, list(ledger.new), version)


@dataclass(frozen=True)
class Pending:
    """Rows at or below the cursor in files no load has covered: what the next run would
    read late, found without loading (``files``: the uncovered files)."""

    files: tuple[str, ...]
    rows: int
    partitions: tuple[str, ...]


def pending(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    storage: Mapping[str, str] | None = None,
) -> Pending | None:
    """The late rows waiting in ``spec``'s folder source (None: the table reads no folder
    or no window). Costs a listing (the file index) and a read of the uncovered files."""
    strategy = strategy_for(spec)
    if strategy.reads_whole_source:
        return None
    source = open_source(spark, spec.name, spec.source, dict(storage or {}))
    files = source.files()
    if files is None:
        return None
    state = target.state(spec.watermark.kind)
    ledger = plan(files, covered(target, state), state.cursor)
    if not ledger.late:
        return Pending((), 0, ())
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
    return Pending(ledger.late, int(found["n"]), tuple(sorted(found["p"])))
