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
import re
from collections.abc import Mapping

import pyarrow.fs as pafs
from deltalake.fs import DeltaStorageHandler

# A Delta table's log folder.
LOG = "_delta_log"


def held(path: str, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """The names of the entries directly in the folder at ``path`` (sorted; an empty
    ``_delta_log`` left out), or [] when it does not exist or is empty."""
    local = local_path(path)
    if local is not None:
        return _local(local)
    fs, _ = file_system(path, storage_options)
    try:
        infos = fs.get_file_info(pafs.FileSelector("", recursive=False, allow_not_found=True))
    except FileNotFoundError:
        return []
    names = {info.path.strip("/").split("/", 1)[0] for info in infos if info.path.strip("/")}
    if LOG in names:
        log = fs.get_file_info(pafs.FileSelector(LOG, recursive=False, allow_not_found=True))
        if not log:
            names.discard(LOG)
    return sorted(names)


def _local(path: str) -> list[str]:
    try:
        names = set(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return [] if not os.path.lexists(path) else [os.path.basename(path)]
    log = os.path.join(path, LOG)
    if LOG in names and os.path.isdir(log) and not os.listdir(log):
        names.discard(LOG)
    return sorted(names)


# A data file of a Delta write, or the checksum Hadoop's local file system writes beside it.
_DATA_FILE = re.compile(r"\.?part-\d{5}-.+")
# A partition folder of a Delta write (``status=paid``).
_PARTITION = re.compile(r"[^=]+=.*")


def only_unlogged_writes(path: str, storage_options: Mapping[str, str] | None = None) -> bool:
    """Whether everything under the folder at ``path`` is what a Delta write that never
    committed leaves: data files (``part-00000-...``, and their checksums), at the top or
    in partition folders (``name=value``, nested), and a log folder that holds folders
    but not one file (a commit in flight would be one). Listed recursively."""
    fs, base = file_system(path, storage_options)
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    for info in infos:
        parts = info.path[len(base) :].strip("/").split("/")
        if parts[0] == LOG:
            if info.type == pafs.FileType.File:
                return False
            continue
        folders, name = parts[:-1], parts[-1]
        if not all(_PARTITION.fullmatch(folder) for folder in folders):
            return False
        is_file = info.type == pafs.FileType.File
        if not (_DATA_FILE.fullmatch(name) if is_file else _PARTITION.fullmatch(name)):
            return False
    return True


def file_system(
    path: str, storage_options: Mapping[str, str] | None
) -> tuple[pafs.FileSystem, str]:
    """A file system for the folder at ``path`` and the folder's path within it: the
    local one, or delta-rs's storage handler with the warehouse's storage options."""
    local = local_path(path)
    if local is not None:
        return pafs.LocalFileSystem(), os.path.abspath(local)
    handler = DeltaStorageHandler(path.rstrip("/"), dict(storage_options or {}) or None)
    return pafs.PyFileSystem(handler), ""


def local_path(path: str) -> str | None:
    """``path`` as a local path; None for an object store's."""
    if "://" not in path or path.startswith("file:"):
        return path.removeprefix("file://").removeprefix("file:")
    return None


def describe(names: list[str], shown: int = 5) -> str:
    """``names`` for a message: the first few, and how many more."""
    listed = ", ".join(names[:shown])
    more = len(names) - shown
    return f"{listed} and {more} more" if more > 0 else listed
