"""A run that fills a disk ends with one line naming the table, the folder whose disk is
full (the target, the run's staging folder, or Spark's local folder for shuffle and spill)
and what to change, instead of a Java stack trace. Nothing was committed: the commit is
the run's last write, and a failed write commits nothing.

Spark names the folder it was writing to (``Task failed while writing rows to <path>``)
for the target and the staging folder; a shuffle or spill file that does not fit names
none. Then the candidate with the least free space is named: on one machine that is the
disk that filled; on a cluster the executors' local folders are not visible from here, so
the message says they may be the ones.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

from incremental_assets.engine.errors import DiskFullError, IncrementalLoadError

_NO_SPACE = re.compile(r"No space left on device|Disk quota exceeded", re.IGNORECASE)


@contextmanager
def naming_full_disks(
    spark: SparkSession, table: str, target_path: str, staging_parent: str | None
) -> Iterator[None]:
    """Turn a failure for lack of disk space inside the block into a DiskFullError naming
    where (see module); other failures pass through unchanged.

    Spark's failures are told by their text, not their class: a classic session raises
    the JVM's exception, Spark Connect its own."""
    try:
        yield
    except Exception as exc:
        if not _is_full(exc):
            raise
        raise full_disk_error(spark, table, str(exc), target_path, staging_parent) from None


def _is_full(exc: Exception) -> bool:
    if isinstance(exc, IncrementalLoadError):
        return False  # already explained (a database whose own disk is full, say)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    # A database's "No space left" is the database's disk, not one this run writes to.
    return bool(_NO_SPACE.search(text)) and "SQLException" not in text


def full_disk_error(
    spark: SparkSession, table: str, text: str, target_path: str, staging_parent: str | None
) -> DiskFullError:
    """The error for a failure ``text`` that says a disk is full (see module)."""
    spill = _spill_folder(spark)
    candidates = {
        "target": _local(target_path),
        "staging": _local(staging_parent or tempfile.gettempdir()),
        "spill": spill,
    }
    named = [k for k, path in candidates.items() if path and _names(text, path)]
    if named:
        # The most specific folder named (the staging folder may sit in Spark's /tmp).
        location = max(named, key=lambda k: len(candidates[k] or ""))
    else:
        local = {k: _free(p) for k, p in candidates.items() if p is not None}
        known = {k: free for k, free in local.items() if free is not None}
        location = min(known, key=lambda k: known[k]) if known else "spill"
    path = candidates[location] or (target_path if location == "target" else str(spill))
    free = _free(path)
    room = f", {_size(free)} free" if free is not None else ""
    what, fix = _WHERE[location]
    return DiskFullError(
        table,
        location,
        path,
        f"no space left on the disk of {what} ({path}{room}); the run stopped and nothing "
        "was committed.",
        fix + ", then run the partition again",
    )


_WHERE = {
    "target": (
        "the target",
        "free space on that disk (the maintenance job's VACUUM removes the files of old "
        "versions), or move the table to a larger disk (target.path or warehouse.root)",
    ),
    "staging": (
        "the run's staging folder",
        "free space on that disk, or set staging_dir of the warehouse resource to a folder "
        "on a larger disk that every executor can reach",
    ),
    "spill": (
        "Spark's local folder for shuffle and spill (spark.local.dir; on a cluster, the "
        "executors' own)",
        "free space there, or set spark.local.dir to a folder on a larger disk (spark.conf "
        "in tables.yaml), or load fewer partitions per run",
    ),
}


def _spill_folder(spark: SparkSession) -> str:
    """Spark's local folder on this machine: SPARK_LOCAL_DIRS, else spark.local.dir, else
    the temp folder (the first of a list)."""
    setting = os.environ.get("SPARK_LOCAL_DIRS")
    if not setting:
        try:
            setting = spark.conf.get("spark.local.dir", None)
        except Exception:  # a session that cannot answer (stopped): the default
            setting = None
    return (setting or tempfile.gettempdir()).split(",")[0].strip()


def _local(path: str) -> str | None:
    """An absolute local path for ``path`` (None for an object store)."""
    if "://" in path and not path.startswith("file://"):
        return None
    return os.path.abspath(path.removeprefix("file://").removeprefix("file:"))


def _names(text: str, folder: str) -> bool:
    """Whether ``text`` names a file in ``folder`` (Spark writes ``file:/a/b``)."""
    return re.search(re.escape(folder.rstrip("/")) + r"(?:[/\s.'\"]|$)", text) is not None


def _free(path: str) -> int | None:
    """Free bytes on the disk of ``path`` (its nearest existing folder), None if unknown."""
    current = path
    while current and not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    try:
        return shutil.disk_usage(current).free
    except OSError:
        return None


def _size(n: int | None) -> str:
    value = float(n or 0)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
