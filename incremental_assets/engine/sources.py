"""Where rows come from: a Delta table or a folder of Parquet, CSV or JSON-lines files.

Each source gives the raw DataFrame for a window (pruned where the format allows, the
filter itself applied by the caller so Spark pushes it down), and the source's clock.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from datetime import datetime, timezone

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from incremental_assets.engine import delta_io, predicates
from incremental_assets.engine.errors import SchemaMismatchError, SourceNotFoundError
from incremental_assets.engine.predicates import Part
from incremental_assets.engine.transforms import quote, to_utc_instants
from incremental_assets.engine.unreadable import log_error, source_file_error
from incremental_assets.engine.watermarks import (
    WatermarkKind,
    WatermarkValue,
    from_transaction_version,
)
from incremental_assets.specs import SourceSpec

_URI = ("s3://", "s3a://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "file://")


class Source(ABC):
    """A table's source, opened once per run: a Delta source pins its snapshot at open."""

    # Whether each read is work for another system (a database): a run then reads its
    # window once, into its staging folder, rather than once per Spark job.
    remote = False

    def __init__(self, table: str, spec: SourceSpec):
        self.table = table
        self.spec = spec

    @property
    @abstractmethod
    def schema(self) -> StructType: ...

    @abstractmethod
    def read(self, raw_parts: list[Part] | None = None) -> DataFrame:
        """Rows that may fall in ``raw_parts`` (all rows when None); not yet filtered."""

    def high_water(
        self, part: Part, kind: WatermarkKind, max_rows: int | None = None
    ) -> WatermarkValue | None:
        """The highest watermark among the rows of ``part`` (a probe part: one range on the
        watermark column, with a tie-break column for hybrid watermarks), or None. For a
        hybrid watermark with ``max_rows``: the last of the first ``max_rows`` rows in
        (time, id) order, so the next run continues right after it."""
        (probe,) = part
        column, tiebreak, zone = probe.column, probe.tiebreak, self.spec.timezone
        types = {f.name: f.dataType for f in self.schema.fields}
        df = (
            self.read(predicates.to_source_ranges([part], types, zone))
            .select(column, *([tiebreak] if tiebreak else []))
            .filter(predicates.to_source_filter([part], types, zone))
            .transform(to_utc_instants(zone))
            .filter(predicates.to_filter([part]))
        )
        value = F.col(quote(column))
        if kind in ("timestamp", "hybrid"):
            # Collect microseconds, not datetimes: PySpark turns timestamps into naive
            # values in the Python process's local zone.
            value = F.unix_micros(value)
        if tiebreak is None:
            high = df.agg(F.max(value).alias("hw")).collect()[0]["hw"]
            return None if high is None else from_transaction_version(int(high), kind)
        if max_rows:
            df = df.orderBy(column, tiebreak).limit(max_rows)
        pair = F.struct(value.alias("t"), F.col(quote(tiebreak)).alias("i"))
        high = df.agg(F.max(pair).alias("hw")).collect()[0]["hw"]
        if high is None:
            return None
        time = from_transaction_version(int(high["t"]), "hybrid")
        assert isinstance(time, datetime)
        return (time, int(high["i"]))

    def count_nulls(self, column: str) -> int:
        """Rows whose ``column`` is null (Parquet answers from row-group statistics)."""
        return self.read().filter(F.col(quote(column)).isNull()).count()

    def clock(self) -> datetime:
        """The source's current time, against which settle lag and lag are measured."""
        return datetime.now(timezone.utc)

    def describe(self) -> str:
        return f"{self.spec.format} {self.spec.path}"


class DeltaSource(Source):
    """A Delta table read through Spark's Delta Lake at the version pinned when the run
    opens it (time travel), so one run reads one snapshot; column mapping, deletion
    vectors and partition values come from the log. delta-rs only reads the log: the
    version, and per-file statistics for counting the files a window can skip."""

    def __init__(self, spark: SparkSession, table: str, spec: SourceSpec, storage: dict):
        super().__init__(table, spec)
        self._spark = spark
        if not DeltaTable.is_deltatable(spec.path, storage_options=storage or None):
            raise SourceNotFoundError(
                table,
                f"source Delta table {spec.path} does not exist.",
                "create it, or point source.path at an existing Delta table",
            )
        try:
            self._table = DeltaTable(spec.path, storage_options=storage or None)
        except DeltaError as exc:
            raise log_error(table, spec.path, exc) from None
        self.version = self._table.version()
        self._files = delta_io.live_files(self._table)
        try:
            self._df = (
                spark.read.format("delta").option("versionAsOf", self.version).load(spec.path)
            )
        except (AnalysisException, PySparkException, Py4JJavaError) as exc:
            raise SourceNotFoundError(
                table,
                f"Spark's Delta Lake cannot read {spec.path} at version {self.version}: "
                f"{_first_line(exc)}.",
                "use a table whose features this Delta Lake version supports (the message "
                "names the feature), or upgrade delta-spark",
            ) from None
        self._schema = self._df.schema
        # Per-file null counts answer count_nulls only where they count live rows by
        # their logical names: not under deletion vectors or column mapping.
        config = self._table.metadata().configuration
        self._stats_exact = config.get(
            "delta.columnMapping.mode", "none"
        ) == "none" and "deletionVectors" not in (self._table.protocol().reader_features or [])

    @property
    def schema(self) -> StructType:
        return self._schema

    def read(self, raw_parts: list[Part] | None = None) -> DataFrame:
        # Spark skips files by the log's statistics itself; the count is for metadata.
        self.files_read = len(delta_io.prune_files(self._files, raw_parts))
        self.files_total = self._files.num_rows
        return self._df

    def count_nulls(self, column: str) -> int:
        counts = (
            self._files.column(f"null_count.{column}").to_pylist()
            if (f"null_count.{column}" in self._files.column_names)
            else [None]
        )
        if self._stats_exact and self._files.num_rows and all(c is not None for c in counts):
            return int(sum(counts))
        return super().count_nulls(column)

    def describe(self) -> str:
        return f"delta {self.spec.path}@v{self.version}"


class FileSource(Source):
    def __init__(self, spark: SparkSession, table: str, spec: SourceSpec):
        super().__init__(table, spec)
        self._spark = spark
        if spec.format == "parquet" and os.path.isdir(os.path.join(spec.path, "_delta_log")):
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
        except (AnalysisException, PySparkException, Py4JJavaError) as exc:
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
            unreadable = source_file_error(table, spec.path, exc)
            if unreadable is not None:
                raise unreadable from None
            raise SourceNotFoundError(
                table,
                f"cannot read {spec.format} files at {spec.path}: {_first_line(exc)}.",
                "check source.path and source.format (and source.schema for CSV/JSON)",
            ) from None

    def _reader(self):
        reader = self._spark.read.format(self.spec.format)
        options = dict(self.spec.options)
        if self.spec.format == "csv":
            options.setdefault("header", "true")
        if self.spec.format == "parquet":
            # Every file's schema, not the first file's: a column added or retyped in newer
            # files must be seen (and validated), not silently dropped.
            options.setdefault("mergeSchema", "true")
        reader = reader.options(**options)
        if self.spec.schema_ddl:
            reader = reader.schema(self.spec.schema_ddl)
        return reader

    @property
    def schema(self) -> StructType:
        return self._df.schema

    def read(self, raw_parts: list[Part] | None = None) -> DataFrame:
        return self._df


def open_source(spark: SparkSession, table: str, spec: SourceSpec, storage: dict) -> Source:
    if spec.format == "delta":
        return DeltaSource(spark, table, spec, storage)
    if spec.format == "jdbc":
        from incremental_assets.engine.jdbc import JdbcSource  # jdbc builds on Source

        return JdbcSource(spark, table, spec)
    return FileSource(spark, table, spec)


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


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
