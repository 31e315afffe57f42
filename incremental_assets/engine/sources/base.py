"""The interface every source implements, and what the kinds share.

A source gives the raw DataFrame for a window (pruned where the format allows, the filter
itself applied by the caller so Spark pushes it down), and the source's clock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import NamedTuple

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from incremental_assets.engine import predicates
from incremental_assets.engine.predicates import Part
from incremental_assets.engine.spark.aggregates import aggregated
from incremental_assets.engine.spark.key_ranges import FileKeys
from incremental_assets.engine.transforms import quote, to_utc_instants
from incremental_assets.engine.watermarks import (
    WatermarkKind,
    WatermarkValue,
    from_transaction_version,
)
from incremental_assets.specs import SourceSpec


class SourceFile(NamedTuple):
    """A file of a folder source: its name relative to ``source.path``, its size in bytes
    and its modification time in epoch milliseconds, as the file system lists them."""

    name: str
    size: int | None = None
    modified: int | None = None


@dataclass(frozen=True)
class Additions:
    """What a Delta source's commits added since a load (``Source.added_since``): the
    files (and change data) to read for rows at or below the cursor, the versions that
    rewrote files and could not be read (no change data feed), and whether the source's
    log still held every version."""

    late: tuple[str, ...]
    unchecked: tuple[int, ...] = ()
    complete: bool = True


class Source(ABC):
    """A table's source, opened once per run: a Delta source pins its snapshot at open."""

    # Whether each read is work for another system (a database): a run then reads its
    # window once, into its staging folder, rather than once per Spark job.
    remote = False
    # Delta sources: the version this run reads (the ledger of engine/late_files.py).
    version: int | None = None
    # Delta sources: the table's id, which a table dropped and created again changes.
    table_id: str | None = None
    # The spec fields that choose what ``identity_of`` names, for the fix of a refusal.
    identity_fields = "source.path and source.format"

    def __init__(self, table: str, spec: SourceSpec):
        self.table = table
        self.spec = spec

    @property
    def pinned(self) -> bool:
        """Whether every read of the source in a run gives the same rows, however often
        Spark plans it (a Spark Connect server plans each read anew): a Delta table, read at
        the version the run opened. A folder's files are listed again by each such plan."""
        return self.version is not None

    @classmethod
    @abstractmethod
    def open(cls, spark: SparkSession, table: str, spec: SourceSpec, storage: dict) -> Source:
        """Open ``table``'s source for one run (``storage``: the object-store options, for
        the kinds that read them)."""

    @classmethod
    @abstractmethod
    def identity_of(cls, spec: SourceSpec) -> str:
        """What a source of this kind with ``spec`` reads, as one line without credentials
        (sources/identity.py): known from the spec alone, so a switched source is refused
        before it is opened."""

    @property
    def identity(self) -> str:
        """What this source reads (see ``identity_of``); each load records it."""
        return self.identity_of(self.spec)

    @property
    @abstractmethod
    def schema(self) -> StructType: ...

    @abstractmethod
    def read(self, raw_parts: list[Part] | None = None) -> DataFrame:
        """Rows that may fall in ``raw_parts`` (all rows when None); not yet filtered."""

    def files(self) -> list[SourceFile] | None:
        """The source's files (None: a source without files, such as a database), as
        listed when the source was opened."""
        return None

    def scan_bytes(self) -> int | None:
        """The bytes a full read of the source scans at most: its files' (None when unknown,
        as for a database, whose rows Spark only receives)."""
        files = self.files()
        if files is None or any(f.size is None for f in files):
            return None
        return sum(f.size or 0 for f in files)

    def bytes_per_row(self) -> float | None:
        """The bytes a row takes in the source's Parquet files, where its log records them
        (a Delta table): what the table a first load creates sizes its files by. None when
        unknown (files of other formats, databases)."""
        return None

    def sample(self, rows: int) -> DataFrame | None:
        """At most ``rows`` of the source's rows, read cheaply, whose size in Parquet stands
        for its rows' (CSV and JSON folders, whose text says little of it): what a first
        load that writes its increment once, as the table, sizes its files by. None where
        the source is not sampled."""
        return None

    def compressed_text(self) -> bool:
        """Whether the source's files are compressed text (CSV or JSON as ``.gz``, ...),
        whose rows take more than their listed bytes say."""
        return False

    def added_since(self, version: int, cursor: object, column: str) -> Additions | None:
        """Delta sources: what the commits after ``version`` added (engine/sources/
        delta_log.py). None for sources without versions."""
        return None

    def read_files(self, names: tuple[str, ...]) -> DataFrame:
        """The rows of the named files only (see ``files`` and ``added_since``)."""
        raise NotImplementedError(f"{type(self).__name__} has no files")

    @property
    def reads_deletion_vectors(self) -> bool:
        """Whether the source's rows are read through deletion vectors (a Delta table that
        may hold them): an aggregate over them is not observed on a write
        (engine/spark/aggregates.py)."""
        return False

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
            one_job = not self.reads_deletion_vectors
            high = aggregated(df, F.max(value).alias("hw"), one_job=one_job)["hw"]
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
        known = self.known_nulls(column)
        if known is not None:
            return known
        return self.read().filter(F.col(quote(column)).isNull()).count()

    def known_nulls(self, column: str) -> int | None:
        """Rows whose ``column`` is null where the source knows them without a scan (a
        Delta log's statistics); None when only a scan can tell, which the probe's own
        scan then makes (``guards.probe_source``)."""
        return None

    def highest_bounds(self, column: str) -> tuple[object, object] | None:
        """Bounds (low, high) between which the source's highest value of ``column`` lies,
        known without a scan (a Delta log's statistics), or None. The probe reads only the
        rows at or above ``low`` for the high-water mark (``guards.probe_source``)."""
        return None

    def stated_highest(self, column: str) -> object | None:
        """The source's highest value of ``column`` where it is known without a Spark
        job (a Delta log's statistics, and for a timestamp the few rows they leave
        open); None otherwise."""
        return None

    def key_files(self, column: str, raw_parts: list[Part] | None) -> FileKeys | None:
        """What the source's file statistics say of ``column`` (a number) in the files a
        read of ``raw_parts`` opens: each file's lowest and highest value and its rows
        (a Delta log's statistics); None where they say nothing of it."""
        return None

    def holds_none(self, parts: list[Part], zone: str) -> bool:
        """Whether the source's statistics say that no row lies in ``parts`` (raw
        bounds for a zone-less timestamp in ``zone``); False where only a scan can tell."""
        return False

    def clock(self) -> datetime:
        """The source's current time, against which settle lag and lag are measured."""
        return datetime.now(timezone.utc)

    def describe(self) -> str:
        return f"{self.spec.format} {self.spec.path}"


def first_line(exc: Exception) -> str:
    """The first line of an exception's text (its type when it has none)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
