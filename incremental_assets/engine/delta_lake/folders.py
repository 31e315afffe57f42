"""What a folder holds before a table is created in it.

A table is created only in a folder that does not exist or is empty: a folder holding
anything else (another table's Parquet files, someone's ``important.txt``) would end up
inside a Delta table whose writes and VACUUM are not meant for it. An empty ``_delta_log``
(what an interrupted first commit can leave) counts as empty. Local folders are listed
directly, object-store prefixes through delta-rs's storage handler with the warehouse's
storage options (one level, so a large foreign folder costs one listing call).

Example:
    >>> held("/data/warehouse/orders")  # doctest: +SKIP
    ['important.txt', 'part-00000.parquet']
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pyarrow.fs as pafs
from deltalake.fs import DeltaStorageHandler

_LOG = "_delta_log"


def held(path: str, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """The names of the entries directly in the folder at ``path`` (sorted; an empty
    ``_delta_log`` left out), or [] when it does not exist or is empty."""
    if "://" not in path or path.startswith("file:"):
        return _local(path.removeprefix("file://").removeprefix("file:"))
    handler = DeltaStorageHandler(path.rstrip("/"), dict(storage_options or {}) or None)
    fs = pafs.PyFileSystem(handler)
    try:
        infos = fs.get_file_info(pafs.FileSelector("", recursive=False, allow_not_found=True))
    except FileNotFoundError:
        return []
    names = {info.path.strip("/").split("/", 1)[0] for info in infos if info.path.strip("/")}
    if _LOG in names:
        log = fs.get_file_info(pafs.FileSelector(_LOG, recursive=False, allow_not_found=True))
        if not log:
            names.discard(_LOG)
    return sorted(names)


def _local(path: str) -> list[str]:
    try:
        names = set(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return [] if not os.path.lexists(path) else [os.path.basename(path)]
    log = os.path.join(path, _LOG)
    if _LOG in names and os.path.isdir(log) and not os.listdir(log):
        names.discard(_LOG)
    return sorted(names)


def describe(names: list[str], shown: int = 5) -> str:
    """``names`` for a message: the first few, and how many more."""
    listed = ", ".join(names[:shown])
    more = len(names) - shown
    return f"{listed} and {more} more" if more > 0 else listed
