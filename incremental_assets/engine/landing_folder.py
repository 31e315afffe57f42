"""Where landing files live: a local folder, or a folder on an object store.

An object-store folder (``s3://``, ``abfss://``, ``gs://``, ...) is opened by delta-rs's
storage handler with the warehouse's storage options, the same settings the Delta targets
use, so one configuration (credentials, endpoint, region) serves both: listing, a Parquet
footer or CSV header, quarantine moves (the landing folder is the source, not staging or
target). Spark reads a run's files where they are, through its own connector, when the
warehouse is on an object store too (Spark writes the target there, so it has the
connector); into a local warehouse a run's new files are copied first, into its run
folder on the warehouse's disk. Only the run's new files are copied, so the cost follows
the increment, and a copy keeps the object's size and modification time, so the loader's
"changed while read" check holds for both kinds.

Example:
    >>> folder = LandingFolder("s3://landing/invoices", {"region": "eu-west-1"})
    >>> folder.entries(skip="s3://landing/invoices/_quarantine")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import BinaryIO

import pyarrow.fs as pafs
from deltalake.fs import DeltaStorageHandler

from incremental_assets.engine.delta_lake.io import spark_uri
from incremental_assets.engine.errors import LandingListError
from incremental_assets.specs.landing import OBJECT_STORE_SCHEMES

_COPY_THREADS = 8
_CHUNK = 8 << 20
_GLOB = re.compile(r"([\[\]{}*?\\])")


def is_uri(path: str) -> bool:
    return path.startswith(OBJECT_STORE_SCHEMES)


def spark_path(path: str) -> str:
    """``path`` for Spark's readers, which expand glob characters: a file named
    ``a[1].json`` or ``b{x}.json`` is read as named."""
    return _GLOB.sub(r"\\\1", path)


@dataclass(frozen=True, order=True)
class LandedFile:
    """One version of one file in the landing folder (local path or object URI)."""

    path: str
    size: int
    mtime_ns: int

    @property
    def version(self) -> str:
        return f"{self.size}-{self.mtime_ns}"

    @property
    def identity(self) -> tuple[str, str]:
        return (self.path, self.version)

    @property
    def modified(self) -> datetime:
        return datetime.fromtimestamp(self.mtime_ns / 1e9, tz=timezone.utc)


class LandingFolder:
    """List, copy out and quarantine the files of one landing folder.

    Names starting with '.' or '_' (files or folders) are skipped, as Spark does; so is
    the quarantine folder.
    """

    def __init__(self, root: str, storage_options: Mapping[str, str] | None = None):
        self.root = root.rstrip("/")
        self.remote = is_uri(root)
        self._fs: pafs.FileSystem | None = None
        if self.remote:
            handler = DeltaStorageHandler(self.root, dict(storage_options or {}) or None)
            self._fs = pafs.PyFileSystem(handler)

    def exists(self) -> bool:
        """A local folder must exist; an object-store prefix exists once listable."""
        return True if self.remote else os.path.isdir(self.root)

    def entries(self, skip: str) -> list[tuple[str, int, int]]:
        """Every file as (path, size, modification time in ns), outside ``skip`` (the
        quarantine folder, a path or URI like the root's).

        Raises:
            LandingListError: an object-store folder could not be listed.
        """
        if not self.remote:
            return list(_walk(self.root, os.path.abspath(skip)))
        assert self._fs is not None
        prefix = skip[len(self.root) + 1 :] if skip.startswith(f"{self.root}/") else None
        try:
            infos = self._fs.get_file_info(pafs.FileSelector("", recursive=True))
        except OSError as exc:
            raise LandingListError(_first_line(exc)) from exc
        files = [i for i in infos if i.type == pafs.FileType.File and i.path]
        # A zero-byte "folder" object (a console's "create folder": key 'x/') lists as a
        # file 'x' beside the files under it: it is a folder, not a file to load.
        parents = {
            "/".join(parts[:n])
            for parts in (i.path.split("/") for i in files)
            for n in range(1, len(parts))
        }
        found = []
        for info in files:
            if info.path in parents and not info.size:
                continue
            parts = info.path.split("/")
            if any(p.startswith((".", "_")) for p in parts):
                continue
            if prefix and (info.path == prefix or info.path.startswith(f"{prefix}/")):
                continue
            found.append((f"{self.root}/{info.path}", info.size, info.mtime_ns or 0))
        return found

    def spark_paths(self, files: list[LandedFile]) -> dict[str, str]:
        """Where Spark reads each file in place: a local path, or the object's URI through
        Spark's own connector (``s3://`` as ``s3a://``)."""
        return {f.path: spark_uri(f.path) for f in files}

    def open_binary(self, path: str) -> BinaryIO:
        """A file of the folder, opened for reading as bytes (a local file, or the object
        through delta-rs's handler)."""
        if not self.remote:
            return open(path, "rb")
        assert self._fs is not None
        return self._fs.open_input_file(self._relative(path))

    def local_copies(
        self, files: list[LandedFile], into: str
    ) -> tuple[dict[str, str], list[LandedFile]]:
        """A local path for each file (a local folder's files are read where they are),
        and the files that changed or vanished since they were listed (not copied)."""
        if not self.remote:
            return {f.path: f.path for f in files}, []
        assert self._fs is not None
        fs = self._fs
        # One folder per file keeps names apart, and keeps the name (its extension names
        # a compression).
        into = os.path.abspath(into)
        local = {
            f.path: os.path.join(into, str(n), f.path.rsplit("/", 1)[-1])
            for n, f in enumerate(files)
        }

        def copy(file: LandedFile) -> bool:
            target = local[file.path]
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                with (
                    fs.open_input_stream(self._relative(file.path)) as source,
                    open(target, "wb") as copied,
                ):
                    shutil.copyfileobj(source, copied, _CHUNK)
            except FileNotFoundError:
                return False  # deleted since it was listed (other errors fail the run)
            # The copy keeps the object's time, so a later read compares like with like.
            os.utime(target, ns=(file.mtime_ns, file.mtime_ns))
            return True

        with ThreadPoolExecutor(_COPY_THREADS) as pool:
            copied = dict(zip(files, pool.map(copy, files), strict=True))
        # An object rewritten between the listing and the copy is read by the next run.
        # A HEAD gives whole seconds where some stores list milliseconds (GCS, MinIO).
        infos = fs.get_file_info([self._relative(f.path) for f in files])
        changed = [
            f
            for f, info in zip(files, infos, strict=True)
            if not copied[f]
            or info.type != pafs.FileType.File
            or info.size != f.size
            or (info.mtime_ns or 0) // 10**9 != f.mtime_ns // 10**9
            or os.path.getsize(local[f.path]) != f.size
        ]
        gone = {f.path for f in changed}
        return {p: c for p, c in local.items() if p not in gone}, changed

    def quarantine(self, path: str, folder: str, reason: str) -> str:
        """Move ``path`` into ``folder`` (keeping its place under the root) with
        ``<file>.reason.txt`` beside it; returns where it went."""
        relative = self._relative(path)
        destination = f"{folder.rstrip('/')}/{relative}"
        if self._exists(destination):
            destination = f"{destination}.{time.time_ns()}"
        if not self.remote:
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            shutil.move(path, destination)
            with open(f"{destination}.reason.txt", "w") as handle:
                handle.write(reason + "\n")
            return destination
        assert self._fs is not None
        self._fs.move(relative, self._relative(destination))
        # delta-rs's output stream takes bytes that pyarrow's writer does not hand it;
        # copy_files streams through the handler's native path instead.
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as note:
            note.write(reason + "\n")
        try:
            pafs.copy_files(
                note.name,
                self._relative(f"{destination}.reason.txt"),
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=self._fs,
            )
        finally:
            os.unlink(note.name)
        return destination

    def _exists(self, path: str) -> bool:
        if not self.remote:
            return os.path.exists(path)
        assert self._fs is not None
        return self._fs.get_file_info(self._relative(path)).type != pafs.FileType.NotFound

    def _relative(self, path: str) -> str:
        if self.remote:
            if not path.startswith(f"{self.root}/"):
                raise ValueError(f"{path} is not under the landing folder {self.root}")
            return path[len(self.root) + 1 :]
        return os.path.relpath(path, self.root)


def _walk(root: str, skip: str) -> Iterable[tuple[str, int, int]]:
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith((".", "_")) or os.path.abspath(entry.path) == skip:
            continue
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(entry.path, skip)
        elif entry.is_file():
            stat = entry.stat()
            yield entry.path, stat.st_size, stat.st_mtime_ns


def _first_line(exc: BaseException) -> str:
    """delta-rs's error chain (coloured, one cause a line) as one plain line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    lines = [line.strip().lstrip("↳").strip() for line in text.splitlines()]
    return " / ".join(line for line in lines if line)[:600]
