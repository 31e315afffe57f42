"""The Delta target: its committed state (cursor, version) and the exactly-once commit.

The data of a run and its new cursor go into one Delta commit, written by Spark's Delta
Lake: the cursor in the commit's record (``engine.delta_lake.commits``), the commit made as the
idempotent write ``incremental_assets/<table>`` at the table's next commit sequence. The
Delta log is the truth: a run reads its starting cursor from it, never from the
orchestrator. Reading the state needs no Spark (delta-rs reads the log; it never writes).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from incremental_assets.engine import staging
from incremental_assets.engine.changes import OP
from incremental_assets.engine.delta_lake import catalog, key_order
from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.folders import describe, held, only_unlogged_writes
from incremental_assets.engine.delta_lake.merge_plan import (
    MergePlan,
    delete,
    insert,
    matching,
    run_merge,
    update,
)
from incremental_assets.engine.delta_lake.stats_columns import session_indexed, stats_options
from incremental_assets.engine.errors import (
    ConcurrentLoadError,
    CursorLostError,
    FirstLoadUnfinishedError,
    TargetOwnedError,
)
from incremental_assets.engine.faults import crash_point
from incremental_assets.engine.processes import this_identity
from incremental_assets.engine.spark import remote
from incremental_assets.engine.spark.failures import is_spark_failure
from incremental_assets.engine.transforms import LATEST_ROW_HASH, quote, row_hash_version
from incremental_assets.engine.unreadable import log_error
from incremental_assets.engine.watermarks import (
    ID_MIN,
    WatermarkKind,
    WatermarkValue,
    from_transaction_version,
    parse_value,
)

# The commit sequence that stands for "reset" in tables written by earlier releases, which
# kept the cursor itself as the transaction version.
NO_CURSOR = -(2**63)
# The newest commits read for a table's state; older ones only when these lack what is
# looked for.
_RECENT_COMMITS = 20
# Rows per file of a table's first write (its staged rows come in key order, so each file
# holds a narrow key range): a merge reads, and without deletion vectors rewrites, whole
# files, so their size bounds what an increment costs however large the table grows.
# Maintenance compacts to files of about as many bytes (``maintenance.target_file_bytes``).
ROWS_PER_FILE = 1_000_000
# And at most about this many bytes (Parquet's row group; a table's ``target.file_size``
# sets another): a table of wide rows gets fewer rows to a file (``rows_per_file``), so an
# increment rewrites no file of gigabytes.
BYTES_PER_FILE = 128 * 1024 * 1024
# Where the files the increment's key range spans total at most this many bytes, a merge
# reads them all rather than list the increment's keys first (one or two Spark jobs, 0.1-0.2
# s on a small run here, to skip a few kilobytes of files): ``_touched``.
SPANNED_BELOW = 4 * 1024 * 1024
# The key, in the record of a commit creating the table, naming what a killed run's write
# had left in the folder and this run removed first (``DeltaTarget._claim_folder``).
LEFTOVERS_REMOVED = "leftovers_removed"
# The columns Delta refuses in a table without column mapping.
_NEEDS_COLUMN_MAPPING = re.compile(r"[ ,;{}()\n\t=]")


def file_bound(file_bytes: int | None = None) -> int:
    """The bytes a file holds at most: ``file_bytes`` (a table's ``target.file_size``), else
    ``BYTES_PER_FILE``."""
    return file_bytes or BYTES_PER_FILE


def rows_per_file(bytes_per_row: float | None, file_bytes: int | None = None) -> int:
    """The rows a file holds at most, for rows of ``bytes_per_row`` (as a table's Parquet
    files hold them; None: not known): ``ROWS_PER_FILE``, fewer where that many would pass
    ``file_bytes`` (a table's ``target.file_size``; None: ``BYTES_PER_FILE``).

    Example:
        >>> rows_per_file(None), rows_per_file(40.0), rows_per_file(1024.0)
        (1000000, 1000000, 131072)
        >>> rows_per_file(1024.0, file_bytes=32 * 2**20)
        32768
    """
    if not bytes_per_row or bytes_per_row <= 0:
        return ROWS_PER_FILE
    return max(1, min(ROWS_PER_FILE, int(file_bound(file_bytes) / bytes_per_row)))


def app_id(table: str) -> str:
    return f"incremental_assets/{table}"


def tiebreak_app_id(table: str) -> str:
    """Earlier releases: a hybrid cursor's id part, as a transaction of its own."""
    return f"incremental_assets/{table}#tiebreak"


@dataclass(frozen=True)
class TargetState:
    exists: bool
    version: int | None = None
    cursor: WatermarkValue | None = None
    schema: StructType | None = None
    last_load: dict[str, Any] = field(default_factory=dict)
    table: DeltaTable | None = None
    # The version of the table's idempotent-write transaction: its commit sequence.
    sequence: int | None = None
    # What the newest load or rewind that recorded a source read or accepted, and its
    # Delta version (None: loads of earlier releases, which recorded none).
    source_identity: str | None = None
    source_identity_version: int | None = None
    # How its rows are hashed (transforms.row_hash_version): new rows are hashed the same.
    row_hash: int = LATEST_ROW_HASH

    @property
    def next_sequence(self) -> int:
        return 0 if self.sequence is None else self.sequence + 1


@dataclass(frozen=True)
class CommitResult:
    committed: bool
    version: int | None
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    files_added: int = 0
    files_removed: int = 0
    created_table: bool = False
    cursor_only: bool = False
    # What was counted of the staged rows the merge acted on: ``rows``, and each of
    # ``acting_counters`` by its alias. Counted as they were staged apart
    # (``acting_staged``: a merge in two passes), or, when a one-pass merge acted with
    # every staged row, the staged rows' own counts (``staged_counts``). Empty: no merge,
    # or a one-pass merge that acted with only some staged rows (found again by
    # ``DeltaTarget.acting_rows``).
    acted: dict = field(default_factory=dict)
    # Whether the acting rows were staged apart, at ``acting_rows_path`` of the increment.
    acting_staged: bool = False
    # Whether every staged row above the cursor (from its next millisecond on, for a
    # timestamp: ``delta_io.above_bound``) was newer than every row of the table, and so
    # acted (updated its row, or inserted one) unless it deletes. Set on a one-pass merge
    # that acted with only some staged rows.
    newer_acted: bool = False
    # What the write of a created table's increment counted as it wrote it (``rows`` and
    # the increment's counters), when it was written once, not staged first.
    written: dict = field(default_factory=dict)

    @property
    def rows_acted(self) -> int:
        """Rows the commit inserted, updated or deleted: each staged row acts on at most
        one target row (keys are unique on both sides), so this is the number of staged
        rows that changed something."""
        return self.rows_inserted + self.rows_updated + self.rows_deleted


def overtaken(error_text: str) -> bool:
    """Whether a Spark Delta error (py4j and Connect wrap it; told apart by its text) is
    Delta's refusal of a commit another writer's commit overtook."""
    return "Concurrent" in error_text or "DELTA_CONCURRENT" in error_text


class DeltaTarget:
    """One table's Delta location and storage options (delta-rs ``storage_options``, for
    reading the log; Spark writes with its own Hadoop settings). ``read_by``: the tables
    that read this one as their source (a layer after it), named in errors about it. With
    ``catalog_table``, Spark reads and writes the table by that name in its catalog, an
    external table at ``path`` (``engine.delta_lake.catalog``)."""

    def __init__(
        self,
        table: str,
        path: str,
        storage_options: Mapping[str, str] | None = None,
        read_by: Sequence[str] = (),
        catalog_table: str | None = None,
    ):
        self.table_name = table
        self.path = path
        self.storage_options = dict(storage_options or {})
        self.read_by = tuple(read_by)
        self.catalog_table = catalog_table

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.path, storage_options=self.storage_options or None)

    def current_version(self) -> int | None:
        """The table's latest version; None when there is no table yet."""
        return self.open().version() if self.exists() else None

    def beside(self, suffix: str) -> DeltaTarget:
        """The sibling Delta table ``<target>__<suffix>``, with the same storage options (a
        path beside a catalog table's location too; see ``engine.delta_lake.catalog``)."""
        return DeltaTarget(
            f"{self.table_name}__{suffix}",
            f"{self.path.rstrip('/')}__{suffix}",
            self.storage_options,
        )

    @property
    def spark_path(self) -> str:
        """The location as Spark's Hadoop file systems name it."""
        return delta_io.spark_uri(self.path)

    @property
    def sql_table(self) -> str:
        """How Spark SQL names the table: its catalog name, else ``delta.`<location>```."""
        return catalog.sql_table(self.spark_path, self.catalog_table)

    def check_catalog(self, spark: SparkSession) -> None:
        """Before a run writes: a catalog name must reach the Delta table at the location
        (registered there if the catalog lacks it). Path targets have nothing to check."""
        if self.catalog_table is not None:
            catalog.check_target(
                spark, self.table_name, self.catalog_table, self.spark_path, self.exists()
            )

    def open(self, version: int | None = None) -> DeltaTable:
        try:
            return DeltaTable(
                self.path, version=version, storage_options=self.storage_options or None
            )
        except DeltaError as exc:
            if not self.exists():
                raise
            raise log_error(self.table_name, self.path, exc, self.storage_options) from None

    def state(self, kind: WatermarkKind) -> TargetState:
        if not self.exists():
            return TargetState(exists=False)
        table = self.open()
        sequence = table.transaction_version(app_id(self.table_name))
        recent = _RECENT_COMMITS
        commits = self.cursor_commits(table, limit=recent)
        if not any("cursor_after" in c for c in commits) or all("rewind" in c for c in commits):
            commits, recent = self.cursor_commits(table), None
        last_load = next((c for c in commits if "rewind" not in c), {})
        self._check_owner(last_load)
        self._check_written_here(table, sequence, commits)
        source = _recorded_source(commits)
        if source is None and recent is not None and table.version() >= recent:
            # Older commits may hold it (replays and other commits record none).
            source = _recorded_source(self.cursor_commits(table))
        return TargetState(
            exists=True,
            version=table.version(),
            cursor=self._cursor(table, kind, sequence, commits),
            schema=delta_io.spark_schema(table),
            last_load=last_load,
            table=table,
            sequence=sequence,
            source_identity=source[0] if source else None,
            source_identity_version=source[1] if source else None,
            row_hash=row_hash_version(table.schema().fields, self.table_name),
        )

    def _cursor(
        self,
        table: DeltaTable,
        kind: WatermarkKind,
        sequence: int | None,
        commits: list[dict],
    ) -> WatermarkValue | None:
        """The cursor of the newest commit that set one (a load or a rewind)."""
        setting = next((c for c in commits if "cursor_after" in c and "version" in c), None)
        if setting is not None and setting.get("legacy"):
            return self._legacy_cursor(table, kind, sequence)
        if setting is None:
            if sequence is None or sequence == NO_CURSOR or commits:
                return None
            raise CursorLostError(
                self.table_name,
                f"the Delta log of {self.path} no longer holds the commit that recorded the "
                f"cursor (commit sequence {sequence}); it was removed with old log files.",
                "set the cursor with `incremental-assets rewind --to VALUE` (or `--reset` "
                "to reload), and keep delta.logRetentionDuration above the time between loads",
            )
        text = setting.get("cursor_after")
        return None if not text or text == "-" else parse_value(str(text), kind)

    def _legacy_cursor(
        self, table: DeltaTable, kind: WatermarkKind, sequence: int | None
    ) -> WatermarkValue | None:
        """Tables written by earlier releases kept the cursor as the transaction version."""
        if sequence in (None, NO_CURSOR):
            return None
        cursor = from_transaction_version(sequence, kind)
        if kind == "hybrid":
            tiebreak = table.transaction_version(tiebreak_app_id(self.table_name))
            cursor = (cursor, tiebreak if tiebreak is not None else ID_MIN)
        return cursor

    def _check_owner(self, last_load: Mapping[str, Any]) -> None:
        """A target holds one table's loads: one whose last load was another table's (two
        specs pointed at one location, or a table renamed) is refused, since its cursor
        and rows are that table's."""
        owner = last_load.get("table")
        if owner is not None and owner != self.table_name:
            raise TargetOwnedError(
                self.table_name,
                f"the Delta table at {self.path} holds the loads of table '{owner}' (last at "
                f"version {last_load.get('version')}); loading into it would mix the two "
                "tables' rows and cursors. Nothing was written.",
                f"give table '{self.table_name}' its own target.path, or, if it was renamed "
                f"from '{owner}', keep the name '{owner}'",
            )

    def _check_written_here(
        self, table: DeltaTable, sequence: int | None, commits: list[dict]
    ) -> None:
        """A Delta table this table did not write (no load or rewind of it in the log, and
        no transaction of it in the checkpoint) is someone else's: another table's Delta
        source, or a table of another tool. Loading into it would change their data."""
        name = self.table_name
        if sequence is not None or any(
            c.get("table") == name or c.get("rewind") == name for c in commits
        ):
            return
        newest = (table.history(1) or [{}])[0]
        raise TargetOwnedError(
            name,
            f"the folder {self.path} holds a Delta table that table '{name}' did not write "
            f"(version {table.version()}, last commit: {newest.get('operation', '?')}; its "
            "log has no load of this table); loading into it would change data that is not "
            "this table's, e.g. another table's source. Nothing was written.",
            f"give table '{name}' a target.path of its own (a new or empty folder): a table "
            "is created only there, or loads a Delta table it created itself",
        )

    def _claim_folder(self, spark: SparkSession, staged_path: str, run_id: str) -> str:
        """Before this run creates the table: its folder must not exist or be empty, or
        hold only what a run of this table that was killed as it created the table left
        there (Delta's files of a write that never committed), which is removed. Then the
        run claims the folder (``staging.claim``) in case it is killed in turn. Returns
        what was removed, for the commit's record ('' for nothing).

        Those files are removed only when their run's claim shows it is over: its process
        is gone from this host. A run still running, on another host, or whose Spark
        Connect server may go on with its write, may be writing them now (the table's
        pool keeps its runs from overlapping, but not runs made outside it). In the
        Python process's claim, the window left is the local JVM's own exit after its
        Python process is gone (its shutdown stops Spark's jobs), before any later run.

        Raises:
            TargetOwnedError: the folder holds anything else.
            FirstLoadUnfinishedError: it holds files of a run that may not be over.
        """
        names = held(self.path, self.storage_options)
        removed = ""
        if names:
            if not only_unlogged_writes(self.path, self.storage_options) or self.exists():
                unclaimed(self.table_name, self.path, self.storage_options, "target.path", names)
            found = staging.claims(spark, staged_path, self.spark_path)
            if not found:
                unclaimed(self.table_name, self.path, self.storage_options, "target.path", names)
            unfinished = [why for c in found if (why := c.unfinished())]
            if unfinished:
                raise in_flight(self.table_name, self.path, names, unfinished)
            staging.empty(spark, self.spark_path)
            # Whatever Spark could not remove is refused, named, as before.
            unclaimed(self.table_name, self.path, self.storage_options, "target.path")
            removed = describe(names)
        claimed = staging.Claim(self.spark_path, run_id, this_identity(), remote.is_connect(spark))
        staging.claim(spark, staged_path, claimed)
        return removed

    def write_creating(self, spark: SparkSession, write: Callable[[], None]) -> None:
        """Run ``write``, which creates the table; if it fails, remove what it wrote
        (``_remove_uncommitted``) before its error is raised."""
        try:
            write()
        except Exception as exc:
            crash_point("creating_write_failed")
            self._remove_uncommitted(spark, exc)
            raise

    def _remove_uncommitted(self, spark: SparkSession, error: Exception) -> None:
        """After this run's write creating the table failed (``error``): remove the files
        it wrote (Delta leaves a failed write's files where they were written) unless a
        table was committed there after all, so that the folder is empty again for the
        next run. Only for a failure Spark reported, which ends its write: not for a lost
        Connect server, which may still be writing and commit. Best effort: the run's own
        error is the one to report, and a run killed first leaves its claim for the next
        run (``_claim_folder``)."""
        if not is_spark_failure(error) or remote.server_gone(error):
            return
        with suppress(Exception):
            if not self.exists():
                staging.empty(spark, self.spark_path)

    def loads(self, table: DeltaTable | None = None, limit: int | None = None) -> list[dict]:
        """This loader's commits, newest first, with their metadata and Delta metrics."""
        return [c for c in self._commits(table, limit) if "table" in c]

    def rewinds(self, table: DeltaTable | None = None, limit: int | None = None) -> list[dict]:
        """Commits that rewound or reset the cursor, newest first (see ``record_rewind``)."""
        return [c for c in self._commits(table, limit) if "rewind" in c]

    def cursor_commits(
        self, table: DeltaTable | None = None, limit: int | None = None
    ) -> list[dict]:
        """Loads and rewinds, newest first, in one read of the history; a rewind's dict
        has the key ``rewind``."""
        return [c for c in self._commits(table, limit) if "table" in c or "rewind" in c]

    def _commits(self, table: DeltaTable | None, limit: int | None) -> list[dict]:
        table = table or self.open()
        out = []
        for commit in table.history(limit):
            meta = delta_commits.parse(commit)
            if meta is None:
                continue
            meta["version"] = commit.get("version")
            meta["timestamp"] = commit.get("timestamp")
            meta["operation"] = commit.get("operation")
            meta["operation_metrics"] = operation_metrics(commit)
            out.append(meta)
        return out

    def find_commit(self, commit_id: str, limit: int = 20) -> dict | None:
        """The loader's commit with ``commit_id`` among the newest ``limit`` commits."""
        return next(
            (c for c in self._commits(self.open(), limit) if c.get("commit_id") == commit_id),
            None,
        )

    def record_rewind(
        self,
        spark: SparkSession,
        state: TargetState,
        cursor: WatermarkValue | None,
        metadata: Mapping[str, Any],
    ) -> int:
        """Set the cursor back to ``cursor`` (None: no cursor) in a commit of its own, with
        ``metadata`` (who, why, ``cursor_after``) beside it; returns the new Delta version.

        The commit holds no data. It is the idempotent write at ``state``'s next sequence:
        a load that committed since, or commits meanwhile, takes that sequence and this
        commit is refused (``ConcurrentLoadError``).
        """
        record = delta_commits.record({**metadata, "rewind": self.table_name})
        self._write(
            lambda: delta_commits.empty_commit(
                spark,
                self.spark_path,
                record,
                app_id=app_id(self.table_name),
                version=state.next_sequence,
                table=self.catalog_table,
            )
        )
        return self._committed(record)["version"]

    def last_load(self, table: DeltaTable) -> dict:
        # Most recent commits first; maintenance commits may sit between loads.
        for limit in (20, None):
            loads = self.loads(table, limit)
            if loads:
                return loads[0]
        return {}

    def to_spark(
        self,
        spark: SparkSession,
        version: int | None = None,
        holding: delta_io.KeySet | None = None,
    ) -> DataFrame:
        """The table's rows, read by Spark's Delta (at ``version``, else the latest); with
        ``holding``, only the files whose statistics may hold those keys are read (the
        caller still matches rows by key)."""
        rows = catalog.read(spark, self.spark_path, self.catalog_table, version)
        return rows if holding is None else rows.filter(delta_io.may_hold(holding))

    def commit(
        self,
        spark: SparkSession,
        state: TargetState,
        staged_path: str,
        plan: MergePlan,
        *,
        cursor_before: WatermarkValue | None,
        cursor_after: WatermarkValue | None,
        metadata: Mapping[str, Any],
        partition_by: list[str],
        add_new_columns: bool,
        staged_rows: int | None = None,
        staged_counts: Mapping[str, Any] | None = None,
        staged_keys: delta_io.KeyRange | None = None,
        acting_counters: Sequence[Column] = (),
        deletion_vectors: bool = False,
        above_cursor: bool = False,
        one_pass_below: int = 0,
        increment: DataFrame | None = None,
        increment_counters: Sequence[Column] = (),
        stats_columns: Sequence[str] = (),
        bytes_per_row: float | None = None,
        file_bytes: int | None = None,
    ) -> CommitResult:
        """Land the staged increment and the new cursor in one Delta commit; a table
        created by it takes deletion vectors when ``deletion_vectors``, and files of at
        most ``rows_per_file(bytes_per_row, file_bytes)`` rows (its rows' expected size,
        None: not known; the bytes a file holds at most, None: ``BYTES_PER_FILE``), as
        does a merge's rewrite in key order (at the table's own bytes per row).

        ``above_cursor``: every staged row's watermark is above ``cursor_before``; when the
        table's statistics show no row above it either (a rewind or a reset leaves rows
        there), every staged row is newer than every row of the table
        (``merges_in_one_pass``, ``_newer_above``). ``one_pass_below``: the size of the
        files the staged keys may fall in at or under which the merge takes one pass
        whatever the rows.

        ``staged_rows``: the increment's rows as its write counted them (counted by Spark
        when not given); ``staged_counts``: what else that write counted, by the aliases of
        ``acting_counters``, aggregates counted over the rows the merge acts on as they are
        staged (``CommitResult.acted``; with deletion vectors, the staged counts when every
        staged row acted); ``staged_keys``: the range of their first key as that write
        counted it, so the files they may fall in are found with no Spark job for it
        (``delta_io.touched_keys``). Writes nothing when no row is staged and the cursor
        stays put.

        ``increment``: a created table's increment, not staged, written once as the table
        (``staged_rows`` then says whether it has rows: 0 when none were extracted),
        counting ``increment_counters`` as it is written (``CommitResult.written``).
        ``stats_columns``: the columns whose file statistics a table it creates must keep
        (``stats_options``).
        """
        record = delta_commits.record(
            {**metadata, "table": self.table_name, "sequence": state.next_sequence}
        )
        transaction = {"app_id": app_id(self.table_name), "version": state.next_sequence}
        staged = staging.read(spark, staged_path) if increment is None else increment
        if staged_rows is None:
            staged_rows = staged.count()
        columns = [c for c in staged.columns if c not in plan.staged_only_columns]
        if not state.exists:
            if staged_rows == 0 and cursor_after is None:
                return CommitResult(committed=False, version=None)
            removed = self._claim_folder(spark, staged_path, str(metadata.get("run_id", "")))
            if removed:  # said in the commit's record (DESCRIBE HISTORY shows it)
                record = delta_commits.record({**record, LEFTOVERS_REMOVED: removed})
            rows = staged
            observation = None
            if increment is not None:
                # Counted before the change set's filter below, as a staged increment's
                # rows are: its hard deletes with them (a new table holds no row for them,
                # so rows_inserted counts only what is written).
                observation = Observation(f"written_{uuid.uuid4().hex}")
                rows = rows.observe(
                    observation, F.count(F.lit(1)).alias("rows"), *increment_counters
                )
            if plan.writes_by_merge_only:
                # A change set's first load: nothing to delete or supersede yet, so its
                # rows are written as staged (in key order, which keeps each file's key
                # range narrow for later merges): the upserts, and soft deletes (the
                # flagged row is the record of the delete).
                if plan.deletes != "soft":
                    rows = rows.filter(F.col(OP) == "U")
                rows = rows.select(*[F.col(quote(c)) for c in columns])
            self.write_creating(
                spark,
                lambda: self._write(
                    lambda: delta_commits.append(
                        rows,
                        self.spark_path,
                        record,
                        mode="error",
                        partition_by=partition_by,
                        options={
                            **table_options(columns, deletion_vectors),
                            **stats_options(
                                rows.schema,
                                stats_columns,
                                partition_by,
                                session_indexed(spark),
                            ),
                            "maxRecordsPerFile": str(rows_per_file(bytes_per_row, file_bytes)),
                        },
                        table=self.catalog_table,
                        **transaction,
                    ),
                    creating=True,
                ),
            )
            found = self._committed(record)
            metrics = found["operation_metrics"]
            return CommitResult(
                committed=True,
                version=found["version"],
                rows_inserted=int(metrics.get("num_output_rows", 0)),
                files_added=int(metrics.get("num_files", 0)),
                created_table=True,
                written=staging.observed_counts(observation) if observation else {},
            )
        if staged_rows == 0:
            return self._cursor_only(spark, state, record, transaction, cursor_before, cursor_after)
        holding = self._touched(state, staged, plan, staged_rows, staged_keys)
        every_newer = above_cursor and self._newer_above(state, plan, cursor_before)
        if self.merges_in_one_pass(state, plan, every_newer, holding, one_pass_below):
            # One pass: with deletion vectors, or when every clause inserts, a clause whose
            # condition fails writes nothing, a staged row newer than every row of the
            # table acts wherever it matches, and every row of a history's difference
            # acts, so the MERGE reads the staged rows and its clauses alone decide what
            # changes; on a small table, the files rewritten whole cost less than a pass
            # to find the rows that act.
            source, acted = staged, {}
            moves = cursor_after is not None and cursor_after != cursor_before
            if (
                not moves
                and not plan.every_row_acts
                and self._acting_rows(spark, staged, plan, holding).isEmpty()
            ):
                # Re-read rows that change nothing, and a cursor that stays: no commit.
                return CommitResult(committed=False, version=state.version)
        else:
            # Without them Delta rewrites every file a matched row falls in, whether or not
            # a clause acts on it: only the rows that act are merged (staged beside the
            # increment, counted as they are written).
            source, acted = self._acting(spark, staged, plan, staged_path, holding, acting_counters)
            if source is None:
                return self._cursor_only(
                    spark, state, record, transaction, cursor_before, cursor_after
                )
        merge = partial(
            plan.merge,
            spark,
            self.spark_path,
            source,
            columns,
            holding,
            add_new_columns,
            table=self.catalog_table,
        )
        ordered = self._ordered_rewrite(state, staged, holding, staged_rows, file_bytes)
        self._write(lambda: self._merge(spark, merge, record, transaction, ordered))
        found = self._committed(record)
        result = _result(found["operation_metrics"], found["version"])
        if acted:
            return replace(result, acted=acted, acting_staged=True)
        if result.rows_acted == staged_rows:
            # One pass, and every staged row acted (the usual increment): the acting rows
            # are the staged rows, as their write counted them.
            return replace(result, acted={**(staged_counts or {}), "rows": staged_rows})
        newer = every_newer or (not above_cursor and self._newer_above(state, plan, cursor_before))
        return replace(result, newer_acted=newer)

    @staticmethod
    def _touched(
        state: TargetState,
        staged: DataFrame,
        plan: MergePlan,
        staged_rows: int,
        staged_keys: delta_io.KeyRange | None,
    ) -> delta_io.KeySet | None:
        """The staged rows' first-key values, whose files alone the merge reads: their range
        as the increment's write counted it (``staged_keys``) when the files it spans total
        at most ``SPANNED_BELOW`` bytes (no Spark job), else as ``delta_io.touched_keys``
        finds them (listed when few)."""
        keys = plan.identity or plan.keys
        spanned = staged_keys.spanned() if staged_keys is not None else None
        if (
            spanned is not None
            and spanned.values
            and spanned.column == keys[0]
            and state.table is not None
            and delta_io.bytes_holding(state.table, spanned) <= SPANNED_BELOW
        ):
            return spanned
        return delta_io.touched_keys(staged, keys, at_most=staged_rows, counted=staged_keys)

    def merges_in_one_pass(
        self,
        state: TargetState,
        plan: MergePlan,
        every_newer: bool = False,
        holding: delta_io.KeySet | None = None,
        small: int = 0,
    ) -> bool:
        """Whether the MERGE reads the staged rows themselves rather than only those that
        act: the table takes deletion vectors, or the plan only inserts (its MERGE appends
        new files and rewrites none), or every staged row acts (``plan.every_row_acts``, a
        difference from the table), or every staged row is newer than every row of the
        table (``every_newer``: each acts wherever it matches, so no matched row leaves
        its file rewritten unchanged), or the files the keys ``holding`` may fall in total
        at most ``small`` bytes (a rewrite of them costs less than the pass that finds the
        acting rows)."""
        if (
            plan.inserts_only
            or plan.every_row_acts
            or delta_io.writes_deletion_vectors(state.table)
            or every_newer
        ):
            return True
        return (
            small > 0
            and state.table is not None
            and delta_io.bytes_holding(state.table, holding) <= small
        )

    @staticmethod
    def _newer_above(state: TargetState, plan: MergePlan, cursor: WatermarkValue | None) -> bool:
        """Whether a staged row above ``cursor`` is newer than every row of the table, and
        so acts wherever it matches: the plan's clauses act on every newer row, and the
        table's statistics hold no row above the cursor (a rewind or a reset leaves rows
        there). A (time, id) cursor's rows may tie the table's on the time: never."""
        return (
            plan.newer_acts
            and cursor is not None
            and not isinstance(cursor, tuple)
            and not delta_io.holds_above(state.table, plan.watermark, cursor)
        )

    def _acting_rows(
        self,
        spark: SparkSession,
        staged: DataFrame,
        plan: MergePlan,
        holding: delta_io.KeySet | None,
        version: int | None = None,
    ) -> DataFrame:
        """The staged rows that act on the table (as it was at ``version``)."""
        current = self.to_spark(spark, version=version, holding=holding)
        return plan.acting_rows(staged, current)

    def acting_rows(
        self, spark: SparkSession, staged_path: str, plan: MergePlan, version: int
    ) -> DataFrame:
        """The staged rows that act on the table as it was at ``version``: those a merge on
        top of that version changed something with."""
        staged = staging.read(spark, staged_path)
        holding = delta_io.touched_keys(staged, plan.identity or plan.keys)
        return self._acting_rows(spark, staged, plan, holding, version)

    def _acting(
        self,
        spark: SparkSession,
        staged: DataFrame,
        plan: MergePlan,
        staged_path: str,
        holding: delta_io.KeySet | None,
        counters: Sequence[Column] = (),
    ) -> tuple[DataFrame | None, dict]:
        """The staged rows the merge acts on, staged beside the increment (None: none), and
        what was counted of them as they were written (``rows``, and ``counters``)."""
        acting_path = acting_rows_path(staged_path)
        # Counted as they are written: no second read of the staged rows.
        observation = Observation(f"acting_{uuid.uuid4().hex}")
        acting = self._acting_rows(spark, staged, plan, holding).observe(
            observation, F.count(F.lit(1)).alias("rows"), *counters
        )
        acting.write.mode("overwrite").parquet(acting_path)
        staging.written(acting, acting_path)
        acted = dict(observation.get)
        if not acted["rows"]:
            return None, {}
        return staging.read(spark, acting_path), acted

    def _cursor_only(
        self,
        spark: SparkSession,
        state: TargetState,
        record: dict,
        transaction: dict,
        cursor_before: WatermarkValue | None,
        cursor_after: WatermarkValue | None,
    ) -> CommitResult:
        """No row to merge: the cursor recorded alone (still atomically) when it moves."""
        if cursor_after is not None and cursor_after != cursor_before:
            self._write(
                lambda: delta_commits.empty_commit(
                    spark, self.spark_path, record, table=self.catalog_table, **transaction
                )
            )
            found = self._committed(record)
            return CommitResult(committed=True, version=found["version"], cursor_only=True)
        return CommitResult(committed=False, version=state.version)

    @staticmethod
    def _ordered_rewrite(
        state: TargetState,
        staged: DataFrame,
        holding: delta_io.KeySet | None,
        staged_rows: int,
        file_bytes: int | None = None,
    ) -> dict[str, str]:
        """The session settings that keep the merge's rewrite in key order, in files of at
        most ``rows_per_file`` rows (at the table's bytes per row and ``file_bytes``), when
        it is small
        (``key_order``): the staged rows and the rows of the files their keys may fall in,
        at most ``ORDERED_FILES`` files of ``ROWS_PER_FILE`` rows, the most one task
        writes (wide rows' files are cut smaller; the task's bound stays in rows, so the
        larger files of a table written before are rewritten in key order too). Where their
        range covers too many, the files that hold none of the keys are left out of the
        count (one Spark job, ``delta_io.within_files``)."""
        table = state.table
        if table is None or table.metadata().partition_columns:
            return {}
        actions = delta_io.live_files(table)
        per_file = rows_per_file(delta_io.bytes_per_row(actions), file_bytes)
        held = delta_io.rows_holding(actions, holding)
        if (
            held is not None
            and holding is not None
            and not key_order.few(held + staged_rows, ROWS_PER_FILE)
        ):
            narrowed = delta_io.within_files(staged, holding, actions)
            held = delta_io.rows_holding(actions, narrowed)
        return key_order.ordered_rewrite(
            None if held is None else held + staged_rows,
            per_file,
            partitioned=False,
            one_task=key_order.ORDERED_FILES * ROWS_PER_FILE,
        )

    @staticmethod
    def _merge(
        spark: SparkSession, merge, record: dict, transaction: dict, settings: dict[str, str]
    ) -> None:
        app, version = transaction["app_id"], transaction["version"]
        # Both only make the merge cheaper: a session that refuses them merges without.
        conf = {**delta_commits.STAGED_SOURCE, **settings}
        with delta_commits.idempotent(spark, app, version, record, optional=conf):
            merge()

    def record(self, spark: SparkSession, metadata: Mapping[str, Any]) -> CommitResult:
        """A commit without data or cursor: ``metadata`` alone in the log (e.g. a landing
        run whose new file versions hold no rows still lists them)."""
        record = delta_commits.record({**metadata, "table": self.table_name})
        self._write(
            lambda: delta_commits.empty_commit(
                spark, self.spark_path, record, table=self.catalog_table
            )
        )
        return CommitResult(committed=True, version=self._committed(record)["version"])

    def _write(self, write, creating: bool = False) -> None:
        """Run one Spark Delta write; another writer's commit in between becomes
        ``ConcurrentLoadError``, with nothing of this run committed."""
        try:
            write()
        except Exception as exc:  # py4j wraps Delta's exceptions; told apart by name
            text = str(exc)
            concurrent = overtaken(text)
            exists = creating and isinstance(exc, AnalysisException) and "already exists" in text
            if not (concurrent or exists):
                raise
            raise self._concurrent(text.splitlines()[0]) from None

    def _committed(self, record: Mapping[str, Any]) -> dict:
        """The commit this run wrote, found in the log by its id. Spark skips an idempotent
        write whose sequence another writer took first; then nothing of this run was
        committed."""
        found = self.find_commit(record["commit_id"])
        if found is None:
            raise self._concurrent(
                f"commit sequence {record.get('sequence')} was taken by another commit"
            )
        return found

    def concurrent_error(self, detail: str) -> ConcurrentLoadError:
        """The error of a run another writer overtook (``detail``: how)."""
        return self._concurrent(detail)

    def _concurrent(self, detail: str) -> ConcurrentLoadError:
        return ConcurrentLoadError(
            self.table_name,
            f"another writer committed to {self.path} during this run ({detail}); "
            "nothing from this run was committed.",
            "re-run; limit each table to one run at a time (its Dagster pool)",
        )


class SideTable:
    """A Delta table the loader keeps beside a target, ``<target>__<SUFFIX>``. Its first
    write creates it, only in a folder that does not exist or is empty; a later write
    only on a Delta table whose recent commits include the loader's."""

    SUFFIX = ""

    def __init__(self, target: DeltaTarget):
        self.owner = target.table_name
        self.location = target.beside(self.SUFFIX)

    def _creating(self) -> bool:
        """True when this write creates the side table (its folder checked empty first);
        False for one of the loader's existing side tables.

        Raises:
            TargetOwnedError: the folder holds other files, or a Delta table the loader
                did not write.
        """
        if not self.location.exists():
            unclaimed(
                self.owner,
                self.location.path,
                self.location.storage_options,
                f"target.path (its __{self.SUFFIX} side table)",
            )
            return True
        table = self.location.open()
        recent = table.history(20)
        if recent and not any(_loaders(c) for c in recent):
            raise TargetOwnedError(
                self.owner,
                f"the folder {self.location.path}, where the loader keeps this table's "
                f"__{self.SUFFIX} side table, holds a Delta table the loader did not write "
                f"(version {table.version()}, last commit: {recent[0].get('operation', '?')})"
                ". Nothing was written.",
                f"move that Delta table away, or give table '{self.owner}' another "
                "target.path (its side tables sit beside the target)",
            )
        return False

    def to_spark(
        self,
        spark: SparkSession,
        holding: delta_io.KeySet | None = None,
        version: int | None = None,
    ) -> DataFrame | None:
        """The side table's rows (at ``version``, else the latest; None: no table yet)."""
        if not self.location.exists():
            return None
        return self.location.to_spark(spark, version=version, holding=holding)

    def append_rows(
        self,
        rows: DataFrame,
        options: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Append ``rows`` in one commit (the first one creates the table, in a folder
        checked first: ``_creating``), its record holding ``extra``."""
        creating = self._creating()  # checks the folder or the table; an append either way
        write = partial(
            delta_commits.append,
            rows,
            self.location.spark_path,
            delta_commits.record({"side_table": self.SUFFIX, **(extra or {})}),
            options={**(options or {}), **table_options(rows.columns)},
        )
        if creating:
            self.location.write_creating(rows.sparkSession, write)
        else:
            write()

    def insert_missing(
        self, rows: DataFrame, identity: list[str], extra: Mapping[str, Any] | None = None
    ) -> None:
        """Add the ``rows`` whose ``identity`` the table does not hold yet, in one commit
        (the first one creates the table): recording the same rows twice adds nothing."""
        record = delta_commits.record({"side_table": self.SUFFIX, **(extra or {})})
        path = self.location.spark_path
        if self._creating():
            write = partial(
                delta_commits.append, rows, path, record, options=table_options(rows.columns)
            )
            self.location.write_creating(rows.sparkSession, write)
            return
        with delta_commits.idempotent(rows.sparkSession, None, None, record):
            run_merge(rows.sparkSession, path, rows, matching(identity), [insert()], rows.columns)

    def delete_matching(
        self, rows: DataFrame, identity: list[str], extra: Mapping[str, Any] | None = None
    ) -> None:
        """Remove the table's rows whose ``identity`` is among ``rows``, in one commit."""
        record = delta_commits.record({"side_table": self.SUFFIX, **(extra or {})})
        path = self.location.spark_path
        with delta_commits.idempotent(rows.sparkSession, None, None, record):
            run_merge(rows.sparkSession, path, rows, matching(identity), [delete()], rows.columns)


class Tombstones(SideTable):
    """Keys a CDC feed hard-deleted, with the delete's sequence, in a sibling Delta table
    ``<target>__tombstones``. Written before the target's commit: a tombstone only ever
    suppresses changes older than a delete that did happen, so one recorded by a run that
    died before its main commit is harmless, and the target's commit stays the one truth
    for the watermark."""

    SUFFIX = "tombstones"

    def record(
        self,
        staged: DataFrame,
        keys: list[str],
        watermark: str,
        count: int | None = None,
        renewed: int | None = None,
    ) -> int:
        """Record the staged hard deletes (``count``: how many, as the increment's write
        counted them; counted here when not given) and return how many there were.
        ``renewed``: how many of them are of keys that have a tombstone (None: not known)."""
        deletes = staged.filter(F.col(OP) == "D").select(
            *[F.col(quote(c)) for c in [*keys, watermark]]
        )
        if count is None:
            count = deletes.count()
        if count == 0:
            return 0
        self.record_deletes(deletes, keys, watermark, new_keys_only=renewed == 0)
        return count

    def rows(self) -> int:
        """Tombstones held, from the log's statistics (0 when there is no table yet)."""
        return row_count(self.location.open()) if self.location.exists() else 0

    def record_deletes(
        self, deletes: DataFrame, keys: list[str], watermark: str, new_keys_only: bool = False
    ) -> None:
        """Record ``deletes``: one row per key, its ``keys`` and the delete's ``watermark``
        (a key's tombstone keeps its newest delete). ``new_keys_only``: no key of theirs
        has a tombstone, so they are appended (one write, where a merge takes about ten
        Spark jobs). Two runs of one window at once may then both append a key's:
        ``changes.not_older_than_tombstones`` reads the newest."""
        record = delta_commits.record({"side_table": self.SUFFIX})
        path = self.location.spark_path
        if self._creating() or new_keys_only:
            delta_commits.append(deletes, path, record, options=table_options(deletes.columns))
            return
        wm = quote(watermark)
        clauses = [update(f"s.{wm} > t.{wm}"), insert()]
        with delta_commits.idempotent(deletes.sparkSession, None, None, record):
            run_merge(deletes.sparkSession, path, deletes, matching(keys), clauses, deletes.columns)


class ChangeLog(SideTable):
    """Every change a history (scd2) table has seen, in a sibling Delta table
    ``<target>__changes``: what a key's versions are recomputed from. Appended before the
    target's commit; a run that dies in between re-reads the same window, finds its changes
    logged, and recomputes the same versions, so the log never holds a change twice."""

    SUFFIX = "changes"
    # The record's entry naming the target's commit sequence an append was made for.
    FOR_SEQUENCE = "for_sequence"
    # How far back the log's commits are read for appends the target does not hold.
    _RECENT = 100

    def append(self, rows: DataFrame, sequence: int) -> None:
        """Append ``rows`` (a run's new events) for the target's commit at ``sequence``
        (the caller appends only a run that has some)."""
        self.append_rows(rows, {"mergeSchema": "true"}, {self.FOR_SEQUENCE: sequence})

    def appended(self, sequence: int) -> tuple[int | None, int | None]:
        """The events of the log's newest commit, by its own metrics, and its version, when
        it is the loader's append for the target's commit at ``sequence`` (None otherwise:
        no log, another writer's commit on top, a release that did not say)."""
        if not self.location.exists():
            return None, None
        newest = self._newest_append(self.location.open(), sequence)
        metrics = (newest or {}).get("operationMetrics") or {}
        events = int(metrics["numOutputRows"]) if "numOutputRows" in metrics else None
        version = (newest or {}).get("version")
        return events, None if version is None else int(version)

    def _newest_append(self, log: DeltaTable, sequence: int) -> dict | None:
        """The log's newest commit, when it is the loader's append for the target's commit
        at ``sequence``."""
        newest = log.history(1)
        record = delta_commits.parse(newest[0]) if newest else None
        made_for = None if record is None else record.get(self.FOR_SEQUENCE)
        return newest[0] if made_for is not None and int(made_for) == sequence else None

    def uncommitted(self, sequence: int) -> int:
        """The events appended for the target's commit at ``sequence`` (its next), which
        the target does not hold: a run that appended them died before its commit (runs
        killed one after another at that sequence each appended what was new to them).
        Counted from the appends' own metrics, over the newest of the log's last
        ``_RECENT`` commits; 0 when the newest append was made for another commit, or by
        a release that did not say."""
        if not self.location.exists():
            return 0
        events = 0
        for commit in self.location.open().history(self._RECENT):
            record = delta_commits.parse(commit)
            if record is None:  # maintenance (OPTIMIZE, VACUUM) or another writer
                continue
            made_for = record.get(self.FOR_SEQUENCE)
            if made_for is None or int(made_for) != sequence:
                break
            metrics = commit.get("operationMetrics") or {}
            events += int(metrics.get("numOutputRows", 0))
        return events

    def precedes(self, column: str, instant: datetime, sequence: int | None) -> bool:
        """Whether every logged event's ``column`` (a timestamp) lies before ``instant``,
        by the log's statistics, and the log's newest commit is the loader's append for the
        table's last commit (``sequence``): no append since then awaits a commit (a run
        killed after its append, or one another writer overtook). Then the table's
        versions are what its committed runs' events imply, and events after ``instant``
        only continue them.

        Not proven here: that no run killed earlier, at a sequence a later run of another
        window committed, left events of keys that run did not touch. A recomputation from
        the log folds such events into the keys a run touches; a run for which this holds
        leaves them out, as no run committed them, until their window is loaded again
        (its events are logged, so it recomputes from the log).

        False whenever it is not known: no log, a file without statistics, a maintenance
        commit on top (the next append makes it known again), a table whose commits carry
        no sequence. Delta keeps timestamps' statistics to the millisecond, so the log's
        must end a millisecond before ``instant``'s."""
        if sequence is None or not self.location.exists():
            return False
        log = self.location.open()
        if self._newest_append(log, sequence) is None:
            return False
        try:
            before = instant - timedelta(milliseconds=1)
        except OverflowError:  # the first instant Python holds: no event lies before it
            return False
        return not delta_io.holds_above(log, column, before)


def _recorded_source(commits: list[dict]) -> tuple[str, int] | None:
    """The source identity of the newest of ``commits`` (newest first) that records one,
    and its Delta version."""
    for commit in commits:
        identity = commit.get(delta_commits.SOURCE_IDENTITY)
        if identity:
            return str(identity), int(commit["version"])
    return None


def unclaimed(
    table: str,
    path: str,
    storage_options: Mapping[str, str] | None,
    field: str,
    names: list[str] | None = None,
) -> None:
    """Refuse to create a Delta table of ``table`` at ``path`` unless the folder does not
    exist or is empty (``field``: the spec setting that put it there; ``names``: what it
    holds, when already listed).

    Raises:
        TargetOwnedError: naming what the folder holds and the fix.
    """
    names = held(path, storage_options) if names is None else names
    if not names:
        return
    raise TargetOwnedError(
        table,
        f"the folder {path} ({field}) is not empty and holds no Delta table of this table: "
        f"it holds {describe(names)}. Creating the table there would mix its files with "
        "those, and its VACUUM or rewrites could delete them. Nothing was written.",
        f"give table '{table}' a target.path of its own (a new or empty folder), or move "
        "those files out; if they are left from this table's own first load that was "
        "interrupted, remove them",
    )


def in_flight(
    table: str, path: str, names: list[str], unfinished: list[str]
) -> FirstLoadUnfinishedError:
    """The error for a folder holding the uncommitted files of a first load of ``table``
    that may not be over (``unfinished``: why, for each run that claimed it)."""
    return FirstLoadUnfinishedError(
        table,
        f"the folder {path} (target.path) holds files of a first load of this table that "
        f"has not committed ({describe(names)}), and its write may still be going on: "
        f"{'; '.join(unfinished)}. They were kept. Nothing was written.",
        "if that run still runs, wait for it to end, then run again (its files are removed "
        "then); if it has ended but cannot be checked from here (another host, or Spark "
        "Connect: no longer in the server's UI), remove the files yourself and run again",
    )


def _loaders(commit: Mapping[str, Any]) -> bool:
    """Whether a commit read from the log is the loader's: a load, a side table's write or
    a maintenance step (which tags its commits ``incremental_assets.maintenance``)."""
    text = commit.get("userMetadata")
    tagged = isinstance(text, str) and text.lstrip().startswith('{"incremental_assets')
    return tagged or delta_commits.parse(commit) is not None


def acting_rows_path(staged_path: str) -> str:
    """Where a merge stages the rows it acts on (those that change the target)."""
    return f"{staged_path.rstrip('/')}_acting"


def table_options(columns: list[str], deletion_vectors: bool = False) -> dict[str, str]:
    """Table properties for a new table: column mapping by name when a column's name holds
    a character Delta cannot keep as a Parquet field name (a space, a comma, ...); deletion
    vectors when asked (Delta then raises the protocol to what they need)."""
    options = {}
    if any(_NEEDS_COLUMN_MAPPING.search(c) for c in columns):
        options["delta.columnMapping.mode"] = "name"
        if not deletion_vectors:  # with them, Delta picks the table features itself
            options |= {"delta.minReaderVersion": "2", "delta.minWriterVersion": "5"}
    if deletion_vectors:
        options["delta.enableDeletionVectors"] = "true"
    return options


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def operation_metrics(commit: Mapping[str, Any]) -> dict[str, Any]:
    """A commit's operation metrics by the names delta-rs gives them
    (``num_target_rows_inserted``, ``num_added_rows``, ...), whoever wrote it."""
    metrics = dict(commit.get("operationMetrics") or {})
    out = {_snake(k): v for k, v in metrics.items()}
    if "num_output_rows" in out and commit.get("operation") != "MERGE":
        out.setdefault("num_added_rows", out["num_output_rows"])
    return out


def _result(metrics: dict[str, Any], version: int) -> CommitResult:
    inserted = int(metrics.get("num_target_rows_inserted", 0))
    updated = int(metrics.get("num_target_rows_updated", 0))
    deleted = int(metrics.get("num_target_rows_deleted", 0))
    return CommitResult(
        committed=True,
        version=version,
        rows_inserted=inserted,
        rows_updated=updated,
        rows_deleted=deleted,
        files_added=int(metrics.get("num_target_files_added", 0)),
        files_removed=int(metrics.get("num_target_files_removed", 0)),
        # A merge that acted on no row still carries the run's new cursor.
        cursor_only=inserted + updated + deleted == 0,
    )


def row_count(table: DeltaTable) -> int:
    """Rows in the snapshot, from the log's per-file statistics (no data read), less the
    rows deletion vectors mark deleted in those files."""
    counts = delta_io.live_files(table).column("num_records").to_pylist()
    return int(sum(c or 0 for c in counts)) - delta_io.rows_deleted_by_vectors(table)


def arrow_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())
