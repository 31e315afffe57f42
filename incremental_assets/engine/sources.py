"""Where rows come from: a Delta table or a folder of Parquet, CSV or JSON-lines files.

Each source gives the raw DataFrame for a window (pruned where the format allows, the
filter itself applied by the caller so Spark pushes it down), and the source's clock.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from datetime import datetime, timezone

from deltalake import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from incremental_assets.engine import delta_io
from incremental_assets.engine.errors import SourceNotFoundError
from incremental_assets.engine.predicates import Part
from incremental_assets.engine.transforms import quote
from incremental_assets.specs import SourceSpec

_URI = ("s3://", "s3a://", "gs://", "gcs://", "az://", "abfs://", "abfss://", "file://")


class Source(ABC):
    """A table's source, opened once per run: a Delta source pins its snapshot at open."""

    def __init__(self, table: str, spec: SourceSpec):
        self.table = table
        self.spec = spec

    @property
    @abstractmethod
    def schema(self) -> StructType: ...

    @abstractmethod
    def read(self, raw_parts: list[Part] | None = None) -> DataFrame:
        """Rows that may fall in ``raw_parts`` (all rows when None); not yet filtered."""

    def count_nulls(self, column: str) -> int:
        """Rows whose ``column`` is null (Parquet answers from row-group statistics)."""
        return self.read().filter(F.col(quote(column)).isNull()).count()

    def clock(self) -> datetime:
        """The source's current time, against which settle lag and lag are measured."""
        return datetime.now(timezone.utc)

    def describe(self) -> str:
        return f"{self.spec.format} {self.spec.path}"


class DeltaSource(Source):
    def __init__(self, spark: SparkSession, table: str, spec: SourceSpec, storage: dict):
        super().__init__(table, spec)
        self._spark = spark
        if not DeltaTable.is_deltatable(spec.path, storage_options=storage or None):
            raise SourceNotFoundError(
                table,
                f"source Delta table {spec.path} does not exist.",
                "create it, or point source.path at an existing Delta table",
            )
        self._table = DeltaTable(spec.path, storage_options=storage or None)
        self.version = self._table.version()
        self._files = delta_io.live_files(self._table)
        self._schema = delta_io.spark_schema(self._table)

    @property
    def schema(self) -> StructType:
        return self._schema

    def read(self, raw_parts: list[Part] | None = None) -> DataFrame:
        files = delta_io.prune_files(self._files, raw_parts)
        self.files_read = len(files)
        self.files_total = self._files.num_rows
        return delta_io.read_files(self._spark, self._table, files)

    def count_nulls(self, column: str) -> int:
        counts = (
            self._files.column(f"null_count.{column}").to_pylist()
            if (f"null_count.{column}" in self._files.column_names)
            else [None]
        )
        if self._files.num_rows and all(c is not None for c in counts):
            return int(sum(counts))
        return super().count_nulls(column)

    def describe(self) -> str:
        return f"delta {self.spec.path}@v{self.version}"


class FileSource(Source):
    def __init__(self, spark: SparkSession, table: str, spec: SourceSpec):
        super().__init__(table, spec)
        self._spark = spark
        if not spec.path.startswith(_URI) and not os.path.exists(spec.path):
            raise SourceNotFoundError(
                table,
                f"source folder {spec.path} does not exist.",
                "create it, or correct source.path in the table spec",
            )
        try:
            self._df = self._reader().load(spec.path)
        except AnalysisException as exc:
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
    return FileSource(spark, table, spec)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
