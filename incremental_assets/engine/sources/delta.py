"""Delta tables as sources, read by Spark's Delta Lake at a pinned version."""

from __future__ import annotations

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException, PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.errors import SourceNotFoundError
from incremental_assets.engine.predicates import Part
from incremental_assets.engine.sources.base import Source, first_line
from incremental_assets.engine.unreadable import log_error
from incremental_assets.specs import SourceSpec


class DeltaSource(Source):
    """A Delta table read through Spark's Delta Lake at the version pinned when the run
    opens it (time travel), so one run reads one snapshot; column mapping, deletion
    vectors and partition values come from the log. delta-rs only reads the log: the
    version, and per-file statistics for counting the files a window can skip."""

    @classmethod
    def open(cls, spark: SparkSession, table: str, spec: SourceSpec, storage: dict) -> Source:
        return cls(spark, table, spec, storage)

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
                spark.read.format("delta")
                .option("versionAsOf", self.version)
                .load(delta_io.spark_uri(spec.path))
            )
        except (AnalysisException, PySparkException, Py4JJavaError) as exc:
            raise SourceNotFoundError(
                table,
                f"Spark's Delta Lake cannot read {spec.path} at version {self.version}: "
                f"{first_line(exc)}.",
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
