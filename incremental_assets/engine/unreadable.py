"""Errors that name the file at fault: a source file Spark cannot read (corrupt, or of a
type Spark has no reader for, such as nanosecond timestamps), and a Delta log entry that is
not valid JSON. Without this the file's name is only in an executor's log."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow.fs as pafs

from incremental_assets.engine.delta_lake import folders
from incremental_assets.engine.errors import UnreadableFileError, UnreadableLogError
from incremental_assets.engine.spark.failures import is_spark_failure

_FILE = re.compile(r"while reading file (\S+?)\.?(?:\s|$)")
_NANOS = re.compile(r"Illegal Parquet type: INT64 \(TIMESTAMP\(NANOS")
_CAUSE = re.compile(r"^Caused by: [\w.$]+(?:Exception|Error): (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class _Failure:
    path: str | None
    reason: str


def nanosecond_columns(
    folder: str, storage_options: Mapping[str, str] | None = None, limit: int = 1000
) -> tuple[str | None, list[str]]:
    """The first Parquet file under ``folder`` with nanosecond timestamp columns, and those
    columns (footers only; at most ``limit`` files are looked at), found where the folder
    lives (a local disk, or an object store with ``storage_options``). The file as
    ``<folder>/<name>``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        fs, base = folders.file_system(folder, storage_options)
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        files = sorted(
            info.path[len(base) :].strip("/")
            for info in fs.get_file_info(selector)
            if info.type == pafs.FileType.File
        )
    except Exception:
        return None, []
    files = [f for f in files if _is_data_file(f)]
    for name in files[:limit]:
        try:
            schema = pq.read_schema(f"{base}/{name}" if base else name, filesystem=fs)
        except (OSError, pa.ArrowException):
            continue
        columns = [f.name for f in schema if pa.types.is_timestamp(f.type) and f.type.unit == "ns"]
        if columns:
            return f"{folder.rstrip('/')}/{name}", columns
    return None, []


def _is_data_file(name: str) -> bool:
    """A Parquet file Spark reads under a folder: none of its path's parts hidden."""
    parts = name.split("/")
    return parts[-1].endswith(".parquet") and not any(p.startswith(("_", ".")) for p in parts)


def source_file_error(
    table: str, folder: str, exc: BaseException, storage_options: Mapping[str, str] | None = None
) -> UnreadableFileError | None:
    """``exc`` as an error naming the source file and the fix, or None when it is not a
    file Spark could not read."""
    text = str(exc)
    if _NANOS.search(text):
        path, columns = nanosecond_columns(folder, storage_options)
        where = f" ({', '.join(columns)} in {path})" if columns else ""
        return UnreadableFileError(
            table,
            path,
            f"the Parquet files under {folder} hold timestamps in nanoseconds{where}, a type "
            "Spark cannot read (it keeps microseconds).",
            "write the files with microsecond timestamps (pandas: df.to_parquet(path, "
            "coerce_timestamps='us', allow_truncated_timestamps=True); pyarrow: "
            "pq.write_table(table, path, coerce_timestamps='us')), or cast the column to "
            "timestamp[us] where the files are made",
        )
    failure = _failure(text)
    if failure is None:
        return None
    where = failure.path or f"a file under {folder}"
    return UnreadableFileError(
        table,
        failure.path,
        f"cannot read {where}: {failure.reason}.",
        "replace or remove that file (rewrite it from its origin); nothing was committed",
    )


@contextmanager
def naming_source_files(
    table: str, folder: str, storage_options: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Turn a Spark failure to read one of the files under ``folder`` (on a local disk, or
    an object store with ``storage_options``) into an error that names it; other failures
    pass through unchanged."""
    try:
        yield
    except Exception as exc:
        failed = is_spark_failure(exc)
        error = source_file_error(table, folder, exc, storage_options) if failed else None
        if error is None:
            raise
        raise error from None


def _failure(text: str) -> _Failure | None:
    found = _FILE.search(text)
    if found is None:
        return None
    path = found.group(1)
    for prefix in ("file://", "file:"):
        if path.startswith(prefix):
            path = path[len(prefix) :]
            break
    causes = _CAUSE.findall(text)
    reason = causes[-1].strip() if causes else "not a readable file of this format"
    return _Failure(path, reason)


def log_error(
    table: str,
    path: str,
    exc: BaseException,
    storage_options: Mapping[str, str] | None = None,
    versions: tuple[int, int] | None = None,
) -> UnreadableLogError:
    """A Delta log that delta-rs cannot read, as an error naming the table and the log file
    that is not valid JSON (found where the table lives, with ``storage_options``; among
    the commits of ``versions``, first and last, where the read that failed was of those)."""
    bad = _bad_log_file(path, storage_options, versions)
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = f"{bad} is not a valid Delta log entry" if bad else detail
    return UnreadableLogError(
        table,
        bad,
        f"the Delta log of {path} cannot be read: {where} ({detail}).",
        "restore that file from a backup or the storage's version history; if the table "
        "can be rebuilt, move it aside and reload it (nothing was written)",
    )


# The newest commit files of a log on an object store looked at for one that is not JSON
# (each a request; a local log's are all looked at).
_NEWEST_REMOTE_COMMITS = 1000


def _bad_log_file(
    path: str,
    storage_options: Mapping[str, str] | None = None,
    versions: tuple[int, int] | None = None,
) -> str | None:
    """The newest commit file of the log (of ``versions``, first and last, when given) that
    is not JSON, as ``<path>/_delta_log/<name>``; None when each is JSON, or when the log
    cannot be listed (an object store that refuses: the error is then the store's). On an
    object store only the newest ``_NEWEST_REMOTE_COMMITS`` are read."""
    try:
        fs, base = folders.file_system(path, storage_options)
        log = f"{base}/{folders.LOG}" if base else folders.LOG
        infos = fs.get_file_info(pafs.FileSelector(log, allow_not_found=True))
    except Exception:
        return None
    commits = sorted(
        (i.path for i in infos if i.type == pafs.FileType.File and _is_commit(i.base_name)),
        key=lambda p: p.rsplit("/", 1)[-1],
        reverse=True,
    )
    if versions is not None:
        first, last = versions
        commits = [c for c in commits if first <= _version(c) <= last]
    if folders.local_path(path) is None:
        commits = commits[:_NEWEST_REMOTE_COMMITS]
    for file in commits:
        try:
            with fs.open_input_stream(file) as stream:
                text = stream.read().decode("utf-8")
            for line in text.splitlines():
                if line.strip():
                    json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            return f"{path.rstrip('/')}/{folders.LOG}/{file.rsplit('/', 1)[-1]}"
        except OSError:
            continue
    return None


def _version(file: str) -> int:
    """The version of a commit file (``00000000000000000012.json``; -1 for another)."""
    stem = file.rsplit("/", 1)[-1].split(".", 1)[0]
    return int(stem) if stem.isdigit() else -1


def _is_commit(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(("_", "."))
