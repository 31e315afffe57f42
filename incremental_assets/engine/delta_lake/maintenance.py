"""Delta maintenance of a table: compaction of small files (or Z-order) and vacuum of the
files that no snapshot inside the retention window needs, done by Spark's Delta Lake
(``OPTIMIZE`` and ``VACUUM``). delta-rs only reads the log (live and removed files).

Maintenance commits carry ``incremental_assets.maintenance`` and never
``incremental_assets.table``, so they are not taken for loads, and they hold no application
transaction, so the cursor stays as it is. Compaction rewrites files without changing a
row (``dataChange: false``). Vacuum only deletes files the table's own log records as
removed, longer ago than the retention: it is ``VACUUM ... LITE``, which finds them in the
log, where a plain VACUUM deletes every file in the folder that the table does not use
(someone's ``important.txt``, another table's Parquet files, files a running load is still
writing). A table's side tables (``<target>__tombstones``, ``__changes``, ``__quarantine``,
``__files``) are maintained with it.

LITE refuses a table whose log no longer reaches back to the last LITE vacuum (log cleanup,
``delta.logRetentionDuration``, removed the commits in between, or the table was never
vacuumed LITE before its first commits were cleaned up): ``DELTA_CANNOT_VACUUM_LITE``, and
Delta's advice, a full VACUUM, is the listing kind above. Such a table is vacuumed from its
snapshot instead: the files its checkpoint still records as removed longer ago than the
retention are deleted (``vacuum_note`` says so); a file whose removal the log no longer
records at all is left in place, like any file the table does not know.

Example:
    >>> maintain_table(spark, DeltaTarget("orders", path), MaintenanceSettings())  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler
from pyspark.sql import SparkSession

from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget, rows_per_file
from incremental_assets.engine.errors import MaintenanceError
from incremental_assets.specs.locations import SIDE_TABLES

MAINTENANCE_KEY = "incremental_assets.maintenance"


@dataclass(frozen=True)
class MaintenanceSettings:
    """What to do to each Delta table.

    ``target_size`` is the size compaction aims for (default: about ``ROWS_PER_FILE``
    rows of the table, at most about ``file_bytes``, the table's ``target.file_size``,
    else ``BYTES_PER_FILE``: ``target_file_bytes``).
    ``zorder`` rewrites every file sorted along these columns (e.g. the keys), which keeps
    each file's key range narrow so merges rewrite fewer files, at the price of rewriting
    the whole table; without it, compaction bin-packs small files only. ``purge`` first
    rewrites the files whose rows deletion vectors mark deleted (``REORG ... APPLY
    (PURGE)``), so readers stop filtering them; tables without deletion vectors skip it.
    ``retention_hours`` None skips the vacuum. ``enforce_retention`` refuses a retention
    shorter than the table's ``delta.deletedFileRetentionDuration`` (7 days unless set):
    readers of older snapshots, including a load still running, may need those files.
    """

    compact: bool = True
    purge: bool = True
    zorder: tuple[str, ...] = ()
    target_size: int | None = None
    file_bytes: int | None = None
    retention_hours: int | None = 168
    enforce_retention: bool = True

    def __post_init__(self) -> None:
        if self.retention_hours is not None and self.retention_hours < 0:
            raise ValueError(
                f"retention_hours {self.retention_hours} is negative; give hours >= 0, "
                "or None to skip the vacuum"
            )


@dataclass(frozen=True)
class MaintenanceResult:
    """One Delta table before and after. ``stale_files`` are files removed from the table
    but still in storage (what a vacuum may delete once they are older than the
    retention)."""

    table: str
    path: str
    version_before: int
    version_after: int
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    stale_files_before: int
    stale_files_after: int
    files_compacted: int = 0
    files_written: int = 0
    files_vacuumed: int = 0
    vacuum_note: str = ""
    files_purged: int = 0

    def metadata(self, prefix: str = "") -> dict[str, int]:
        return {
            f"{prefix}{name}": getattr(self, name)
            for name in (
                "files_before",
                "files_after",
                "bytes_before",
                "bytes_after",
                "stale_files_before",
                "stale_files_after",
                "files_compacted",
                "files_written",
                "files_vacuumed",
                "files_purged",
                "version_after",
            )
        }


def side_tables(target: DeltaTarget) -> list[DeltaTarget]:
    """The table's sibling Delta tables that exist."""
    siblings = [target.beside(suffix) for suffix in SIDE_TABLES]
    return [s for s in siblings if s.exists()]


def maintain_table(
    spark: SparkSession, target: DeltaTarget, settings: MaintenanceSettings
) -> list[MaintenanceResult]:
    """Maintain the table and its side tables; a table not created yet is skipped."""
    tables = [target] if target.exists() else []
    return [maintain(spark, t, settings) for t in [*tables, *side_tables(target)]]


def maintain(
    spark: SparkSession, target: DeltaTarget, settings: MaintenanceSettings
) -> MaintenanceResult:
    """Compact, then vacuum, one Delta table.

    Raises:
        MaintenanceError: a retention shorter than the table allows while
            ``enforce_retention`` is on; the compaction before it has been committed.
    """
    table = target.open()
    storage = pafs.PyFileSystem(
        DeltaStorageHandler(table.table_uri, target.storage_options or None)
    )
    version_before = table.version()
    files_before, bytes_before = _live(table)
    stale_before = len(_stale(table, storage))
    compacted = written = vacuumed = purged = 0
    note = ""
    if settings.purge and delta_io.rows_deleted_by_vectors(table):
        purged, _ = _purge(spark, target)
        table = target.open()
    if settings.compact:
        compacted, written = _optimize(spark, target, settings)
        table = target.open()
    if settings.retention_hours is not None:
        vacuumed, note = _vacuum(spark, target, table, storage, settings)
        table = target.open()
    files_after, bytes_after = _live(table)
    return MaintenanceResult(
        table=target.table_name,
        path=target.path,
        version_before=version_before,
        version_after=table.version(),
        files_before=files_before,
        files_after=files_after,
        bytes_before=bytes_before,
        bytes_after=bytes_after,
        stale_files_before=stale_before,
        stale_files_after=len(_stale(table, storage)),
        files_compacted=compacted,
        files_written=written,
        files_vacuumed=vacuumed,
        vacuum_note=note,
        files_purged=purged,
    )


def _tag(operation: str) -> dict[str, str]:
    """The commit's user metadata: which maintenance step wrote it."""
    user_metadata = json.dumps({MAINTENANCE_KEY: operation})
    return {"spark.databricks.delta.commitInfo.userMetadata": user_metadata}


def _optimize(
    spark: SparkSession, target: DeltaTarget, settings: MaintenanceSettings
) -> tuple[int, int]:
    """OPTIMIZE (bin-packing, or ZORDER BY the given columns): files removed and added."""
    sql = f"OPTIMIZE {target.sql_table}"
    if settings.zorder:
        sql += f" ZORDER BY ({', '.join(_quoted(c) for c in settings.zorder)})"
    conf = _tag("zorder" if settings.zorder else "compact")
    size = settings.target_size or target_file_bytes(target.open(), settings.file_bytes)
    if size:
        # Files of at least half the target are left as they are: compaction packs the
        # small files increments add, and never merges the first write's bounded files.
        conf["spark.databricks.delta.optimize.maxFileSize"] = str(size)
        conf["spark.databricks.delta.optimize.minFileSize"] = str(size // 2)
    with delta_commits.session_settings(spark, conf):
        metrics = spark.sql(sql).collect()[0]["metrics"]
    return int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])


@dataclass(frozen=True)
class Compaction:
    """A load's compaction of the table's small files (``compact_if_due``): the small
    files the load left in the table (None: not counted, ``note`` says why), what the
    compaction removed and wrote (0 when not due) and its commit's version (None when it
    committed nothing)."""

    small_files: int | None
    files_compacted: int = 0
    files_written: int = 0
    version: int | None = None
    note: str = ""


def compact_if_due(
    spark: SparkSession, target: DeltaTarget, at: int, file_bytes: int | None = None
) -> Compaction:
    """Compact the table's small files when there are at least ``at`` of them
    (``small_files``): the maintenance job's compaction (OPTIMIZE, a commit of its own that
    changes no row, tagged as maintenance), run by a load right after its commit
    (``target.compact_after``). On a table with deletion vectors, OPTIMIZE also rewrites
    the files whose vectors delete more than Delta's share of their rows
    (``spark.databricks.delta.optimize.maxDeletedRowsRatio``, 5%)."""
    table = target.open()
    size = target_file_bytes(table, file_bytes)
    if size is None:
        return Compaction(None, note="the table's log records no row counts")
    partitions = list(table.metadata().partition_columns)
    small = small_files(delta_io.live_files(table), size // 2, partitions)
    if small is None:
        return Compaction(None, note="the log's files list no partition values")
    if small < at:
        return Compaction(small)
    before = table.version()
    removed, added = _optimize(spark, target, MaintenanceSettings(target_size=size))
    version = _maintained_after(target, before, "compact") if removed else None
    return Compaction(small, files_compacted=removed, files_written=added, version=version)


@dataclass(frozen=True)
class Purge:
    """A load's purge of the rows the table's deletion vectors mark deleted
    (``purge_if_due``): their share of the table's rows before it (0.0 on a table without
    vectors; None when the log records no row counts), the files it rewrote and wrote (0
    when not due) and its commit's version (None when it committed nothing)."""

    deleted_share: float | None
    files_purged: int = 0
    files_written: int = 0
    version: int | None = None


def purge_if_due(spark: SparkSession, target: DeltaTarget, share: float) -> Purge:
    """Purge the table's deletion vectors when they mark at least ``share`` of its rows
    deleted: the maintenance job's purge (REORG ... APPLY (PURGE), a commit of its own that
    changes no row, tagged as maintenance), run by a load right after its commit
    (``target.purge_after``). The share is counted from the log's row counts and the
    vectors themselves (delta-rs reads them, a flag for each row of the files that carry
    one; no Spark job); where the log does not count some file's rows it is not judged
    (``deleted_share`` None) and nothing is purged."""
    table = target.open()
    deleted = delta_io.rows_deleted_by_vectors(table)
    if not deleted:
        return Purge(0.0)
    counts = delta_io.live_files(table).column("num_records")
    if counts.null_count:
        return Purge(None)  # a file whose rows the log does not count: no share to judge
    # The log counts each file's rows with those its vector deletes.
    rows = int(pc.sum(counts).as_py() or 0)
    found = deleted / rows if rows else 0.0
    if found < share:
        return Purge(found)
    before = table.version()
    removed, added = _purge(spark, target)
    version = _maintained_after(target, before, "purge") if removed else None
    return Purge(found, files_purged=removed, files_written=added, version=version)


def small_files(actions: pa.Table, below: int, partitions: list[str]) -> int | None:
    """The files (add actions, as ``delta_io.live_files``) smaller than ``below`` bytes that
    a compaction can pack: those in partitions that hold two or more of them (None when
    the actions lack a partition column's values)."""
    if not actions.num_rows:
        return 0
    columns = [f"partition.{c}" for c in partitions]
    if any(c not in actions.column_names for c in columns):
        return None
    small = actions.filter(pc.less(actions.column("size_bytes"), below))
    if not columns:
        return small.num_rows if small.num_rows > 1 else 0
    counts = small.group_by(columns).aggregate([("size_bytes", "count")])
    return sum(n for n in counts.column("size_bytes_count").to_pylist() if n > 1)


def _maintained_after(target: DeltaTarget, version: int, step: str) -> int | None:
    """The version of the maintenance ``step`` (compact, purge) committed after ``version``
    (found by its tag, so another writer's commit in between is not taken for it)."""
    for commit in target.open().history(limit=10):
        if commit.get("version", -1) > version and _tagged(commit) == step:
            return int(commit["version"])
    return None


def _tagged(commit: dict) -> str | None:
    """The maintenance step a commit's user metadata names (None: not maintenance)."""
    try:
        found = json.loads(commit.get("userMetadata") or "{}")
    except ValueError:
        return None
    return found.get(MAINTENANCE_KEY) if isinstance(found, dict) else None


def target_file_bytes(table: DeltaTable, file_bytes: int | None = None) -> int | None:
    """The size of a file of ``rows_per_file`` rows of this table (``ROWS_PER_FILE``, fewer
    for wide rows: at most ``file_bytes``, None: ``BYTES_PER_FILE``), from its live files'
    bytes per row (None for an empty table): what compaction aims for, so it keeps the
    files about as large as the first write made them."""
    per_row = delta_io.bytes_per_row(delta_io.live_files(table))
    if per_row is None:
        return None
    return max(int(per_row * rows_per_file(per_row, file_bytes)), 1)


def _purge(spark: SparkSession, target: DeltaTarget) -> tuple[int, int]:
    """REORG ... APPLY (PURGE): rewrite the files that carry deletion vectors without the
    rows they delete (no row changes: ``dataChange: false``). Files removed and added."""
    sql = f"REORG TABLE {target.sql_table} APPLY (PURGE)"
    with delta_commits.session_settings(spark, _tag("purge")):
        metrics = spark.sql(sql).collect()[0]["metrics"]
    return int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])


def _vacuum(
    spark: SparkSession,
    target: DeltaTarget,
    table: DeltaTable,
    storage: pafs.FileSystem,
    settings: MaintenanceSettings,
) -> tuple[int, str]:
    """Delete the files the log removed longer ago than the retention (``VACUUM ...
    LITE``); returns how many existed, and a note when the snapshot's tombstones stood in
    for LITE. No vacuum runs when there is nothing to delete."""
    assert settings.retention_hours is not None
    sql = f"VACUUM {target.sql_table} RETAIN {settings.retention_hours} HOURS LITE"
    conf = {
        **_tag("vacuum"),
        "spark.databricks.delta.retentionDurationCheck.enabled": str(
            settings.enforce_retention
        ).lower(),
    }
    minimum = _minimum_retention_hours(table)
    if settings.enforce_retention and settings.retention_hours < minimum:
        raise MaintenanceError(
            target.table_name,
            f"vacuum retention of {settings.retention_hours} hours is shorter than the "
            f"table's minimum of {minimum} hours (delta.deletedFileRetentionDuration): files "
            "that readers of older snapshots, or a load still running, may need could be "
            "deleted. Nothing was vacuumed.",
            "raise retention_hours, or set enforce_retention to false if nothing reads "
            "snapshots older than the retention",
        )
    root = _local(target.path).rstrip("/") + "/"
    with delta_commits.session_settings(spark, conf):
        try:
            dry_run = spark.sql(f"{sql} DRY RUN").collect()
        except Exception as exc:  # py4j wraps Delta's exceptions; told apart by name
            if LOG_TOO_SHORT not in str(exc):
                raise
            return _vacuum_from_snapshot(table, storage, settings.retention_hours)
        # The log keeps a removed file's tombstone after the file is deleted: count (and
        # act on) the files that still exist.
        listed = {_local(r[0]).removeprefix(root) for r in dry_run}
        due = listed.intersection(_local(p).removeprefix(root) for p in _stale(table, storage))
        if not due:
            return 0, ""
        spark.sql(sql).collect()
    return len(due), ""


LOG_TOO_SHORT = "DELTA_CANNOT_VACUUM_LITE"
"""Delta's refusal of VACUUM LITE when the log no longer covers the files to delete."""


def _vacuum_from_snapshot(
    table: DeltaTable, storage: pafs.FileSystem, retention_hours: int
) -> tuple[int, str]:
    """What LITE would do, from the snapshot: delete the files its tombstones (kept in the
    checkpoint) removed longer than ``retention_hours`` ago. Nothing else is touched."""
    due = table.vacuum(
        retention_hours=retention_hours, dry_run=True, enforce_retention_duration=False
    )
    infos = storage.get_file_info(due) if due else []
    existing = [i.path for i in infos if i.type == pafs.FileType.File]
    for path in existing:
        storage.delete_file(path)
    # Hadoop's local file system keeps a checksum '.<name>.crc' beside each file it wrote.
    folder_and_name = [p.rpartition("/") for p in existing]
    checksums = [f"{d}{s}.{name}.crc" for d, s, name in folder_and_name]
    for info in storage.get_file_info(checksums) if checksums else []:
        if info.type == pafs.FileType.File:
            storage.delete_file(info.path)
    note = (
        f"VACUUM LITE refused the table ({LOG_TOO_SHORT}: its log no longer reaches back to "
        f"the last vacuum); {len(existing)} files its snapshot records as removed were "
        "deleted instead, and files whose removal the log no longer records were left in "
        "place (keep delta.logRetentionDuration above the time between vacuums)"
    )
    return len(existing), note


def _minimum_retention_hours(table: DeltaTable) -> int:
    """The table's ``delta.deletedFileRetentionDuration`` in hours (7 days unless set)."""
    setting = table.metadata().configuration.get(
        "delta.deletedFileRetentionDuration", "interval 7 days"
    )
    found = re.match(r"(?:interval\s+)?(\d+)\s*(\w+)", setting.strip(), re.IGNORECASE)
    if not found:
        return 168
    amount, unit = int(found.group(1)), found.group(2).lower().rstrip("s")
    hours = {"week": 168, "day": 24, "hour": 1}.get(unit)
    return amount * hours if hours else max(1, amount // {"minute": 60}.get(unit, 3600))


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _local(path: str) -> str:
    return path.removeprefix("file://").removeprefix("file:")


def _live(table: DeltaTable) -> tuple[int, int]:
    files = delta_io.live_files(table)
    size = pc.sum(files.column("size_bytes")).as_py() if files.num_rows else 0
    return files.num_rows, int(size or 0)


def _stale(table: DeltaTable, storage: pafs.FileSystem) -> list[str]:
    """Files the log has removed that are still in storage. A vacuum dry run without a
    retention lists the log's tombstones (deleting nothing); some may be gone already."""
    paths = table.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False)
    infos = storage.get_file_info(paths) if paths else []
    return [i.path for i in infos if i.type != pafs.FileType.NotFound]
