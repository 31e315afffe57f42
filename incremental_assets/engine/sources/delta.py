"""Delta tables as sources, read by Spark's Delta Lake at a pinned version."""

from __future__ import annotations

import math
from datetime import datetime

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ByteType,
    IntegerType,
    LongType,
    NumericType,
    ShortType,
    StructType,
    TimestampType,
)

from incremental_assets.engine import predicates
from incremental_assets.engine.delta_lake import catalog
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.errors import SourceNotFoundError
from incremental_assets.engine.predicates import Part
from incremental_assets.engine.sources import delta_log
from incremental_assets.engine.sources.base import Additions, Source, first_line
from incremental_assets.engine.sources.identity import location_identity
from incremental_assets.engine.spark.failures import is_spark_failure
from incremental_assets.engine.spark.key_ranges import FileKeys
from incremental_assets.engine.unreadable import log_error
from incremental_assets.specs import SourceSpec
from incremental_assets.specs.identifiers import catalog_key

# Types whose maximum statistics are exact (timestamps: to the millisecond).
_BOUNDED_TYPES = (TimestampType, LongType, IntegerType, ShortType, ByteType)


class DeltaSource(Source):
    """A Delta table read through Spark's Delta Lake at the version pinned when the run
    opens it (time travel), so one run reads one snapshot; column mapping, deletion
    vectors and partition values come from the log. delta-rs reads the log (the version,
    per-file statistics, the commits since a load) and, for a timestamp watermark's
    high-water mark, the few rows its statistics leave open: what the probe needs,
    without a Spark job."""

    @classmethod
    def open(cls, spark: SparkSession, table: str, spec: SourceSpec, storage: dict) -> Source:
        if spec.table is not None:
            # A catalog table: read by its name, its log at the location the catalog gives.
            location = catalog.resolve_source(spark, table, spec.table)
            spec = spec.model_copy(update={"path": location})
        return cls(spark, table, spec, storage)

    @classmethod
    def identity_of(cls, spec: SourceSpec) -> str:
        # The path, not the table's id: a table created again in place is the same source
        # (read whole by the next run, see engine/late_files.py). A catalog table by its
        # name, known without asking the catalog.
        if spec.table is not None:
            return f"delta table {catalog_key(spec.table)}"
        return location_identity("delta", str(spec.path))

    def __init__(self, spark: SparkSession, table: str, spec: SourceSpec, storage: dict):
        super().__init__(table, spec)
        self._spark = spark
        self._storage = dict(storage or {})
        if not DeltaTable.is_deltatable(spec.path, storage_options=storage or None):
            raise SourceNotFoundError(
                table,
                f"source Delta table {spec.path} does not exist.",
                "create it, or point source.path at an existing Delta table",
            )
        try:
            self._table = DeltaTable(spec.path, storage_options=storage or None)
        except DeltaError as exc:
            raise log_error(table, spec.path, exc, storage) from None
        self.version = self._table.version()
        self.table_id = self._table.metadata().id
        self._files = delta_io.live_files(self._table)
        self._uri = delta_io.spark_uri(spec.path)
        self._added: dict[str, delta_log.AddFile] = {}  # by path, from added_since
        try:
            self._df = catalog.read(spark, self._uri, spec.table, self.version)
        except Exception as exc:
            if not is_spark_failure(exc):
                raise
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
        self._deletion_vectors = "deletionVectors" in (self._table.protocol().reader_features or [])
        self._column_mapping = config.get("delta.columnMapping.mode", "none") != "none"
        self._stats_exact = not self._column_mapping and not self._deletion_vectors

    @property
    def schema(self) -> StructType:
        return self._schema

    @property
    def reads_deletion_vectors(self) -> bool:
        return self._deletion_vectors

    def scan_bytes(self) -> int:
        """The pinned version's live files, from the log."""
        return delta_io.live_bytes(self._files)

    def bytes_per_row(self) -> float | None:
        """The pinned version's live files' bytes over their rows, from the log."""
        return delta_io.bytes_per_row(self._files)

    def read(self, raw_parts: list[Part] | None = None) -> DataFrame:
        # Spark skips files by the log's statistics itself; the count is for metadata.
        self.files_read = len(delta_io.prune_files(self._files, raw_parts))
        self.files_total = self._files.num_rows
        return self._df

    def added_since(self, version: int, cursor: object, column: str) -> Additions:
        """The files the commits after ``version`` (up to the pinned one) appended that may
        hold a row with ``column`` at or below ``cursor``, the change data of the versions
        that rewrote files (or those versions, unchecked, without a change data feed)."""
        try:
            added = delta_log.added_since(
                self._table.table_uri, self._storage, version + 1, self.version
            )
        except ValueError as exc:  # a commit file that is not JSON (or not UTF-8)
            versions = (version + 1, self.version)
            raise log_error(self.table, self.spec.path, exc, self._storage, versions) from None
        self._added = added.appended
        physical = self._physical_name(column)
        late = [
            path
            for path, add in sorted(added.appended.items())
            if delta_log.may_hold_below(add, physical, cursor)
        ]
        unchecked: tuple[int, ...] = ()
        if added.rewrites and delta_log.change_feed_enabled(self._table.metadata().configuration):
            late += [f"{delta_log.CHANGE_DATA}{v}" for v in added.rewrites]
        else:
            unchecked = tuple(added.rewrites)
        return Additions(tuple(late), unchecked, added.complete)

    def read_files(self, names: tuple[str, ...]) -> DataFrame:
        versions = [int(n[len(delta_log.CHANGE_DATA) :]) for n in names if _is_change_data(n)]
        adds = [self._added[n] for n in names if not _is_change_data(n)]
        frames = []
        if adds:
            # Read alone, each at the version that added it (delta_io.read_files).
            files = [{"path": a.path, "version": a.version} for a in adds]
            frames.append(delta_io.read_files(self._spark, self._table, files))
        if versions:
            frames.append(delta_log.read_changes(self._spark, self._uri, versions))
        if not frames:
            return self._df.limit(0)
        rows = frames[0]
        for frame in frames[1:]:
            rows = rows.unionByName(frame, allowMissingColumns=True)
        return rows.select(*self._df.columns)

    def _physical_name(self, column: str) -> str:
        for f in self._table.schema().fields:
            if f.name == column:
                return str(f.metadata.get("delta.columnMapping.physicalName", column))
        return column

    def known_nulls(self, column: str) -> int | None:
        counts = (
            self._files.column(f"null_count.{column}").to_pylist()
            if (f"null_count.{column}" in self._files.column_names)
            else [None]
        )
        if self._stats_exact and self._files.num_rows and all(c is not None for c in counts):
            return int(sum(counts))
        return None

    def highest_bounds(self, column: str) -> tuple[object, object] | None:
        """From the log's statistics where they count live rows by the column's own name
        (no deletion vectors, no column mapping), for an integer or a timestamp with a
        zone (a wall-clock timestamp's statistics lie in another value space than the
        probe's bounds)."""
        types = {f.name: f.dataType for f in self._schema.fields}
        if not self._stats_exact or not isinstance(types.get(column), _BOUNDED_TYPES):
            return None
        return delta_io.highest_bounds(self._files, column)

    def stated_highest(self, column: str) -> object | None:
        """The column's highest value where the log's statistics count live rows
        (``highest_bounds``) and Spark reads every row they count: a table read by its
        path (a catalog may filter the rows its readers see). An integer's statistics
        state it exactly; a timestamp's are kept to the millisecond, so delta-rs reads the
        rows of the files that may hold it, at or above their bound (no Spark job)."""
        if self.spec.table is not None:
            return None
        bounds = self.highest_bounds(column)
        if bounds is None:
            return None
        low, high = bounds
        if isinstance(low, datetime) and isinstance(high, datetime):
            return delta_io.highest_read(self._table, column, low, high)
        return low if isinstance(low, int) and low == high else None

    def key_files(self, column: str, raw_parts: list[Part] | None) -> FileKeys | None:
        """From the log's statistics of the files a read of ``raw_parts`` opens, where
        they bound the rows read (a table read by its path, each file wholly inside the
        window by its statistics) for a number kept by its own name (not under column
        mapping): None when one of those does not hold, or a file has no row count or no
        finite lowest or highest value (no statistics, only nulls). A window that keeps
        fewer rows than they count (a feed's rows its strategy drops; under deletion
        vectors, whose deleted rows the counts still hold) is caught by the caller's own
        count (``key_ranges.STATED_SHARE``): the keys are then sketched."""
        field = next((f for f in self._schema.fields if f.name == column), None)
        low, high = f"min.{column}", f"max.{column}"
        if (
            field is None
            or not isinstance(field.dataType, NumericType)
            or self._column_mapping
            or self.spec.table is not None
            or low not in self._files.column_names
        ):
            return None
        files = []
        for row in delta_io.prune_files(self._files, raw_parts):
            rows = row.get("num_records")
            if rows == 0:
                continue
            if rows is None or row.get(low) is None or row.get(high) is None:
                return None
            if raw_parts is not None and not delta_io.file_within(row, raw_parts):
                return None
            ends = (float(row[low]), float(row[high]))
            if not all(math.isfinite(end) for end in ends):
                return None
            files.append((*ends, int(rows)))
        return FileKeys(tuple(files), field.dataType)

    def holds_none(self, parts: list[Part], zone: str) -> bool:
        """Whether no file's statistics admit a row of ``parts``: bounds, so true of the
        rows Spark reads under deletion vectors or a catalog's row filter too; files
        without statistics admit every row. Not answered (False) under column mapping,
        whose statistics are kept by physical names, or for a partition column."""
        partitioned = set(self._table.metadata().partition_columns)
        if self._column_mapping or any(r.column in partitioned for part in parts for r in part):
            return False
        types = {f.name: f.dataType for f in self._schema.fields}
        raw = predicates.to_source_ranges(parts, types, zone)
        return not delta_io.prune_files(self._files, raw)

    def describe(self) -> str:
        name = f"{self.spec.table} at {self.spec.path}" if self.spec.table else self.spec.path
        return f"delta {name}@v{self.version}"


def _is_change_data(name: str) -> bool:
    return name.startswith(delta_log.CHANGE_DATA)
