"""Delta maintenance of a table: compaction of small files (or Z-order) and vacuum of the
files that no snapshot inside the retention window needs, done by Spark's Delta Lake
(``OPTIMIZE`` and ``VACUUM``). delta-rs only reads the log (live and removed files).

Maintenance commits carry ``incremental_assets.maintenance`` and never
``incremental_assets.table``, so they are not taken for loads, and they hold no application
transaction, so the cursor stays as it is. Compaction rewrites files without changing a
row (``dataChange: false``); vacuum only deletes files the log has removed, longer ago than
the retention (files a running load may still be writing are not in the log and are never
touched). A table's side tables (``<target>__tombstones``, ``__changes``, ``__quarantine``,
``__files``) are maintained with it.

Example:
    >>> maintain_table(spark, DeltaTarget("orders", path), MaintenanceSettings())  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler
from pyspark.sql import SparkSession

from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import MaintenanceError
from incremental_assets.specs.locations import SIDE_TABLES

MAINTENANCE_KEY = "incremental_assets.maintenance"


@dataclass(frozen=True)
class MaintenanceSettings:
    """What to do to each Delta table.

    ``zorder`` rewrites every file sorted along these columns (e.g. the keys), which keeps
    each file's key range narrow so merges rewrite fewer files, at the price of rewriting
    the whole table; without it, compaction bin-packs small files only. ``retention_hours``
    None skips the vacuum. ``enforce_retention`` refuses a retention shorter than the
    table's ``delta.deletedFileRetentionDuration`` (7 days unless set): readers of older
    snapshots, including a load still running, may need those files.
    """

    compact: bool = True
    zorder: tuple[str, ...] = ()
    target_size: int | None = None
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
    compacted = written = vacuumed = 0
    if settings.compact:
        compacted, written = _optimize(spark, target, settings)
        table = target.open()
    if settings.retention_hours is not None:
        vacuumed = _vacuum(spark, target, table, storage, settings)
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
    )


def _tag(operation: str) -> dict[str, str]:
    """The commit's user metadata: which maintenance step wrote it."""
    user_metadata = json.dumps({MAINTENANCE_KEY: operation})
    return {"spark.databricks.delta.commitInfo.userMetadata": user_metadata}


def _optimize(
    spark: SparkSession, target: DeltaTarget, settings: MaintenanceSettings
) -> tuple[int, int]:
    """OPTIMIZE (bin-packing, or ZORDER BY the given columns): files removed and added."""
    sql = f"OPTIMIZE delta.{_quoted(target.spark_path)}"
    if settings.zorder:
        sql += f" ZORDER BY ({', '.join(_quoted(c) for c in settings.zorder)})"
    conf = _tag("zorder" if settings.zorder else "compact")
    if settings.target_size:
        conf["spark.databricks.delta.optimize.maxFileSize"] = str(settings.target_size)
    with delta_commits.session_settings(spark, conf):
        metrics = spark.sql(sql).collect()[0]["metrics"]
    return int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])


def _vacuum(
    spark: SparkSession,
    target: DeltaTarget,
    table: DeltaTable,
    storage: pafs.FileSystem,
    settings: MaintenanceSettings,
) -> int:
    """Delete the removed files older than the retention; returns how many existed. No
    vacuum runs when there is nothing to delete."""
    sql = f"VACUUM delta.{_quoted(target.spark_path)} RETAIN {settings.retention_hours} HOURS"
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
        # The log keeps a removed file's tombstone after the file is deleted: count (and
        # act on) the files that still exist.
        dry_run = spark.sql(f"{sql} DRY RUN").collect()
        listed = {_local(r[0]).removeprefix(root) for r in dry_run}
        due = listed.intersection(_local(p).removeprefix(root) for p in _stale(table, storage))
        if not due:
            return 0
        spark.sql(sql).collect()
    return len(due)


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
