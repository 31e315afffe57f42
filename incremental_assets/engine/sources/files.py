"""Folders of Parquet, CSV or JSON-lines files as sources."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from incremental_assets.engine.delta_lake import folders
from incremental_assets.engine.errors import SchemaMismatchError, SourceNotFoundError
from incremental_assets.engine.predicates import Part
from incremental_assets.engine.sources.base import Source, SourceFile, first_line
from incremental_assets.engine.sources.identity import location_identity
from incremental_assets.engine.spark.failures import is_spark_failure
from incremental_assets.engine.unreadable import source_file_error
from incremental_assets.specs import SourceSpec

# A name that is a URI of its own (``file:/x``, ``s3a://b/x``), not one under the root.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_URI = ("s3://", "s3a://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "file://")
# The files whose footers give a Parquet folder's rows' size: its largest, which hold most
# of its rows.
SIZED_FILES = 8
# The names of text files Spark reads compressed (Hadoop's codecs).
_COMPRESSED = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst")


class FileSource(Source):
    @classmethod
    def open(cls, spark: SparkSession, table: str, spec: SourceSpec, storage: dict) -> Source:
        return cls(spark, table, spec, storage)

    @classmethod
    def identity_of(cls, spec: SourceSpec) -> str:
        return location_identity(spec.format, str(spec.path))

    def __init__(
        self, spark: SparkSession, table: str, spec: SourceSpec, storage: dict | None = None
    ):
        super().__init__(table, spec)
        self._spark = spark
        self._listed: list[SourceFile] | None = None
        if spec.format == "parquet" and _is_delta_table(spark, spec.path):
            raise SourceNotFoundError(
                table,
                f"{spec.path} is a Delta table: read as plain Parquet it would include files "
                "the table has replaced.",
                "set source.format: delta",
            )
        if not spec.path.startswith(_URI) and not os.path.exists(spec.path):
            raise SourceNotFoundError(
                table,
                f"source folder {spec.path} does not exist.",
                "create it, or correct source.path in the table spec",
            )
        try:
            self._df = self._reader().load(spec.path)
        except Exception as exc:
            if not is_spark_failure(exc):
                raise
            if "CANNOT_MERGE_SCHEMAS" in str(exc):
                column, types = _conflicting_column(str(exc))
                raise SchemaMismatchError(
                    table,
                    column,
                    f"the files under {spec.path} disagree on the type of column "
                    f"'{column}' ({' vs '.join(types)}).",
                    "rewrite or remove the files with the changed type (a type change is "
                    "never applied silently)",
                ) from None
            unreadable = source_file_error(table, spec.path, exc, storage)
            if unreadable is not None:
                raise unreadable from None
            raise SourceNotFoundError(
                table,
                f"cannot read {spec.format} files at {spec.path}: {first_line(exc)}.",
                "check source.path and source.format (and source.schema for CSV/JSON)",
            ) from None

    def _reader(self):
        reader = self._spark.read.format(self.spec.format).options(**reader_options(self.spec))
        if self.spec.schema_ddl:
            reader = reader.schema(self.spec.schema_ddl)
        return reader

    @property
    def schema(self) -> StructType:
        return self._df.schema

    def read(self, raw_parts: list[Part] | None = None) -> DataFrame:
        return self._df

    def files(self) -> list[SourceFile] | None:
        # The file index Spark listed when the source was opened: no file is opened here,
        # and their sizes and times are listed once a run.
        if self._listed is None:
            root = self._root_uri()
            listed = []
            for uri, size, modified in _listing(self._df, self.spec.path):
                # As listed: a '%' in a name is the name's own (Spark writes a partition
                # value's ':' as '%3A'), and reading the file back needs it as it is.
                uri = _hadoop_form(uri)
                name = uri[len(root) :] if uri.startswith(root) else uri
                listed.append(SourceFile(name, size, modified))
            self._listed = sorted(listed)
        return list(self._listed)

    def bytes_per_row(self) -> float | None:
        """A Parquet folder's bytes a row, from its largest files (at most ``SIZED_FILES``):
        their listed sizes over their rows, which Spark counts from their footers (a job
        that reads no column). None for CSV and JSON, whose text says little of the size
        their rows take in Parquet, and for an empty folder."""
        if self.spec.format != "parquet":
            return None
        sized = sorted((f for f in self.files() or [] if f.size), key=lambda f: -(f.size or 0))
        sized = sized[:SIZED_FILES]
        if not sized:
            return None
        try:
            rows = self.read_files(tuple(f.name for f in sized)).count()
        except Exception as exc:
            # A file gone or replaced since the listing: an estimate is not worth a failed
            # run (the run's own read says what is wrong, if anything is).
            if not is_spark_failure(exc):
                raise
            return None
        return sum(f.size or 0 for f in sized) / rows if rows else None

    def sample(self, rows: int) -> DataFrame | None:
        """A CSV or JSON folder's first ``rows`` rows of its largest file, as read (the
        source's schema): each task reading a split of that file stops there. None for
        other formats and for an empty folder."""
        if self.spec.format not in ("csv", "json"):
            return None
        sized = [f for f in self.files() or [] if f.size]
        if not sized:
            return None
        largest = max(sized, key=lambda f: f.size or 0)
        return self.read_files((largest.name,)).limit(rows)

    def compressed_text(self) -> bool:
        return self.spec.format in ("csv", "json") and any(
            f.name.lower().endswith(_COMPRESSED) for f in self.files() or []
        )

    def read_files(self, names: tuple[str, ...]) -> DataFrame:
        root = self._root_uri()
        paths = [name if _SCHEME.match(name) else root + name for name in names]
        # The opened source's schema, and its folder as the base of partition columns
        # (``key=value`` folders), so that the files read alone give the same columns.
        reader = self._reader().schema(self._df.schema).option("basePath", self.spec.path)
        return reader.load(paths)

    def _root_uri(self) -> str:
        """``source.path`` as Spark lists the files under it and reads them back by name
        (``file:/x/`` for a local folder, unescaped: a space or an accent as it is),
        ending in '/'."""
        path = self.spec.path.rstrip("/")
        if "://" not in path:
            path = "file:" + Path(os.path.abspath(path)).as_posix()
        return _hadoop_form(path) + "/"


def _is_delta_table(spark: SparkSession, path: str) -> bool:
    """Whether the folder at ``path`` holds a Delta table's log folder (``_delta_log``,
    with anything in it: an interrupted first commit's too), looked for where it lives: a
    local folder directly, a bucket's or a container's through Spark's own connector, with
    the credentials the read itself uses (a folder without one costs a listing, no job)."""
    local = folders.local_path(path)
    if local is not None:
        return os.path.isdir(os.path.join(local, folders.LOG))
    try:
        listed = spark.read.format("binaryFile").load(f"{path.rstrip('/')}/{folders.LOG}")
        return bool(listed.select("path").limit(1).collect())
    except Exception as exc:
        if is_spark_failure(exc):  # nothing there (or nothing Spark may list)
            return False
        raise


def _hadoop_form(uri: str) -> str:
    """A local file URI as Hadoop prints it (``file:/x``, not ``file:///x``)."""
    return "file:/" + uri[len("file:///") :] if uri.startswith("file:///") else uri


def _listing(df: DataFrame, root: str) -> list[tuple[str, int, int]]:
    """Path, size and modification time (epoch milliseconds) of every file of ``df`` (a
    file-source DataFrame read from ``root``), as Hadoop's file system listed them.

    The files are the DataFrame's own (``inputFiles``); their size and time come from a
    listing of ``root`` by Spark's ``binaryFile`` source, whose content column is never
    read. Both are public interfaces, served by a local session and Spark Connect."""
    files = df.inputFiles()
    if not files:
        return []
    wanted = {_plain(uri) for uri in files}
    listed = (
        df.sparkSession.read.format("binaryFile")
        .option("recursiveFileLookup", "true")
        .load(root)
        .select("path", "length", F.unix_millis("modificationTime").alias("modified"))
        .collect()
    )
    return [
        (row.path, int(row.length), int(row.modified))
        for row in listed
        if _hadoop_form(row.path) in wanted or _plain(row.path) in wanted
    ]


def _plain(uri: str) -> str:
    """A file URI in one form, whichever way Hadoop printed or escaped it: ``inputFiles``
    escapes (a space as ``%20``, a name's own ``%3A`` as ``%253A``), the listing prints
    names as they are."""
    return _hadoop_form(unquote(uri))


def _conflicting_column(message: str) -> tuple[str, list[str]]:
    """The first column whose type differs between the two schemas Spark could not merge."""
    schemas = [_top_level_fields(m) for m in re.findall(r'"STRUCT<(.*?)>"', message)]
    if len(schemas) >= 2:
        first, second = schemas[0], schemas[1]
        for name, dtype in second.items():
            if name in first and first[name] != dtype:
                return name, [first[name].lower(), dtype.lower()]
    return "-", []


def _top_level_fields(body: str) -> dict[str, str]:
    fields, depth, current = {}, 0, ""
    for char in body + ",":
        if char == "," and depth == 0:
            name, _, dtype = current.strip().partition(":")
            fields[name.strip().strip("`")] = dtype.strip()
            current = ""
            continue
        depth += (char == "<") - (char == ">")
        current += char
    return fields


def reader_options(spec: SourceSpec) -> dict[str, str]:
    """How a folder's files are read: ``source.options``, with a CSV file's first line as
    its header and, for Parquet, every file's schema merged, not the first file's (a
    column added or retyped in newer files must be seen, and validated, not silently
    dropped), unless the options say otherwise."""
    options = dict(spec.options)
    if spec.format == "csv":
        options.setdefault("header", "true")
    if spec.format == "parquet":
        options.setdefault("mergeSchema", "true")
    return options
