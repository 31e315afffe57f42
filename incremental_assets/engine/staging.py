"""A run's staging folder: created per run, removed when the run ends however it ends, and
left-overs of runs whose process died (SIGKILL, OOM) removed by the table's next run.

Example:
    >>> with staging_folder("orders") as root:  # doctest: +SKIP
    ...     increment.write.parquet(f"{root}/increment")
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from incremental_assets.specs.locations import staging_location

_PREFIX = "ia-"


def beside(target_path: str) -> str | None:
    """The staging folder of a target in a local or mounted warehouse: ``_staging`` next to
    it, where every executor that writes the table can read the increment too (None for an
    object store, whose runs stage in the driver's temp folder; see docs/limitations.md).
    The specs check that no table reads or writes there (specs/locations.py)."""
    return staging_location(target_path)


def create(table: str, staging_dir: str | None = None, kind: str = "") -> str:
    """A new, absolute folder ``ia-[<kind>-]<table>-<pid>-*`` under ``staging_dir``
    (default: the system temp folder), for one run; first removes the folders of this
    table's earlier runs whose process is gone. The run removes it with ``remove``."""
    prefix = f"{_PREFIX}{kind + '-' if kind else ''}{table}-"
    parent = staging_dir or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    remove_orphans(parent, prefix)
    return os.path.abspath(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))


@contextmanager
def staging_folder(table: str, staging_dir: str | None = None, kind: str = "") -> Iterator[str]:
    """``create`` on entry, ``remove`` on exit, however the block ends."""
    root = create(table, staging_dir, kind)
    try:
        yield root
    finally:
        remove(root)


def remove_orphans(parent: str, prefix: str) -> list[str]:
    """Remove ``<prefix><pid>-*`` folders under ``parent`` whose process no longer runs."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    removed = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match and entry.is_dir() and not _alive(int(match.group(1))):
            remove(str(entry))
            removed.append(str(entry))
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove(path: str) -> None:
    """Remove one run's folder (``ia-*``, made by ``create``); anything else is refused, so
    a wrong path can never delete what a run did not make."""
    if not os.path.basename(os.path.normpath(path)).startswith(_PREFIX):
        raise ValueError(f"{path} is not a run's staging folder ({_PREFIX}*); not removed")
    # A failed Spark job can leave tasks writing for a moment after it raised: retry
    # briefly so no folder they recreate is left behind.
    for _ in range(5):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(0.2)
