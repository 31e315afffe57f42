"""Errors that name the file at fault: a source file Spark cannot read (corrupt, or of a
type Spark has no reader for, such as nanosecond timestamps), and a Delta log entry that is
not valid JSON. Without this the file's name is only in an executor's log."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from incremental_assets.engine.errors import UnreadableFileError, UnreadableLogError
from incremental_assets.engine.spark.failures import is_spark_failure

_FILE = re.compile(r"while reading file (\S+?)\.?(?:\s|$)")
_NANOS = re.compile(r"Illegal Parquet type: INT64 \(TIMESTAMP\(NANOS")
_CAUSE = re.compile(r"^Caused by: [\w.$]+(?:Exception|Error): (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class _Failure:
    path: str | None
    reason: str


def nanosecond_columns(folder: str, limit: int = 1000) -> tuple[str | None, list[str]]:
    """The first local Parquet file under ``folder`` with nanosecond timestamp columns,
    and those columns (footers only; at most ``limit`` files are looked at)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not os.path.isdir(folder):
        return None, []
    for n, path in enumerate(_parquet_files(folder)):
        if n >= limit:
            break
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException):
            continue
        columns = [f.name for f in schema if pa.types.is_timestamp(f.type) and f.type.unit == "ns"]
        if columns:
            return path, columns
    return None, []


def _parquet_files(folder: str) -> Iterator[str]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        for name in sorted(files):
            if name.endswith(".parquet") and not name.startswith(("_", ".")):
                yield os.path.join(root, name)


def source_file_error(table: str, folder: str, exc: BaseException) -> UnreadableFileError | None:
    """``exc`` as an error naming the source file and the fix, or None when it is not a
    file Spark could not read."""
    text = str(exc)
    if _NANOS.search(text):
        path, columns = nanosecond_columns(folder)
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
def naming_source_files(table: str, folder: str) -> Iterator[None]:
    """Turn a Spark failure to read one of the files under ``folder`` into an error that
    names it; other failures pass through unchanged."""
    try:
        yield
    except Exception as exc:
        error = source_file_error(table, folder, exc) if is_spark_failure(exc) else None
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


def log_error(table: str, path: str, exc: BaseException) -> UnreadableLogError:
    """A Delta log that delta-rs cannot read, as an error naming the table and, for a local
    table, the log file that is not valid JSON."""
    bad = _bad_log_file(path)
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = f"{bad} is not a valid Delta log entry" if bad else detail
    return UnreadableLogError(
        table,
        bad,
        f"the Delta log of {path} cannot be read: {where} ({detail}).",
        "restore that file from a backup or the storage's version history; if the table "
        "can be rebuilt, move it aside and reload it (nothing was written)",
    )


def _bad_log_file(path: str) -> str | None:
    log = os.path.join(path, "_delta_log")
    if not os.path.isdir(log):
        return None
    for name in sorted(os.listdir(log), reverse=True):
        if not name.endswith(".json") or name.startswith("_"):
            continue
        file = os.path.join(log, name)
        try:
            with open(file, encoding="utf-8") as lines:
                for line in lines:
                    if line.strip():
                        json.loads(line)
        except (ValueError, UnicodeDecodeError):
            return file
    return None
