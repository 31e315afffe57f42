"""Delta maintenance of a table: compaction of small files and vacuum of the files that no
snapshot inside the retention window needs, done by delta-rs.

Maintenance commits carry ``incremental_assets.maintenance`` and never
``incremental_assets.table``, so they are not taken for loads, and they hold no application
transaction, so the cursor stays as it is. Compaction rewrites files without changing a
row (``dataChange: false``); vacuum only deletes files the log has removed, longer ago than
the retention (files a running load may still be writing are not in the log and are never
touched). A table's side tables (``<target>__tombstones``, ``__changes``, ``__quarantine``,
``__files``) are maintained with it.

Example:
    >>> maintain_table(DeltaTarget("orders", path), MaintenanceSettings())  # doctest: +SKIP
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import DeltaError
from deltalake.fs import DeltaStorageHandler

from incremental_assets.engine import delta_io
from incremental_assets.engine.delta_store import DeltaTarget
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


def maintain_table(target: DeltaTarget, settings: MaintenanceSettings) -> list[MaintenanceResult]:
    """Maintain the table and its side tables; a table not created yet is skipped."""
    tables = [target] if target.exists() else []
    return [maintain(t, settings) for t in [*tables, *side_tables(target)]]


def maintain(target: DeltaTarget, settings: MaintenanceSettings) -> MaintenanceResult:
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
        properties = _tag("zorder" if settings.zorder else "compact")
        if settings.zorder:
            metrics = table.optimize.z_order(
                list(settings.zorder),
                target_size=settings.target_size,
                commit_properties=properties,
            )
        else:
            metrics = table.optimize.compact(
                target_size=settings.target_size, commit_properties=properties
            )
        compacted, written = int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])
        table = target.open()
    if settings.retention_hours is not None:
        vacuumed = _vacuum(target, table, storage, settings)
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


def _vacuum(
    target: DeltaTarget,
    table: DeltaTable,
    storage: pafs.FileSystem,
    settings: MaintenanceSettings,
) -> int:
    """Delete the removed files older than the retention; returns how many existed. No
    commit is made when there is nothing to delete."""

    def run(dry_run: bool) -> list[str]:
        return table.vacuum(
            retention_hours=settings.retention_hours,
            dry_run=dry_run,
            enforce_retention_duration=settings.enforce_retention,
            commit_properties=_tag("vacuum"),
        )

    try:
        # The log keeps a removed file's tombstone after the file is deleted: count (and
        # act on) the files that still exist.
        due = set(run(dry_run=True)).intersection(_stale(table, storage))
        if not due:
            return 0
        return len(due.intersection(run(dry_run=False)))
    except DeltaError as exc:
        if "retention" not in str(exc).lower():
            raise
        minimum = re.search(r"greater than (\d+) hours", str(exc))
        raise MaintenanceError(
            target.table_name,
            f"vacuum retention of {settings.retention_hours} hours is shorter than the "
            f"table's minimum of {minimum.group(1) if minimum else '?'} hours "
            "(delta.deletedFileRetentionDuration): files that readers of older snapshots, "
            "or a load still running, may need could be deleted. Nothing was vacuumed.",
            "raise retention_hours, or set enforce_retention to false if nothing reads "
            "snapshots older than the retention",
        ) from None


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


def _tag(operation: str) -> CommitProperties:
    return CommitProperties(custom_metadata={MAINTENANCE_KEY: operation})
