"""Spark reads of a Delta table through the files of one snapshot, listed by delta-rs.

delta-spark's JVM jars are not needed: delta-rs resolves the snapshot (which files are
live), prunes them with the per-file min/max statistics of the Delta log, and Spark reads
the remaining Parquet files with the table's schema. Tables written here use neither
deletion vectors nor column mapping, the two features a plain Parquet read would miss.
What the statistics tell without a Spark job is read here too: the bounds of a column's
highest value, and (``highest_read``) a timestamp's, read by delta-rs from the few rows
its millisecond statistics leave open.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import (
    DataType,
    DateType,
    IntegralType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from incremental_assets.engine.predicates import Part, Range
from incremental_assets.engine.spark.aggregates import aggregated
from incremental_assets.engine.spark.local_rows import no_rows
from incremental_assets.engine.transforms import quote
from incremental_assets.engine.watermarks import from_transaction_version, to_utc

# Delta statistics hold timestamps truncated to milliseconds: widen them so pruning never
# drops a file whose true minimum or maximum lies inside the truncated millisecond.
_STATS_SLACK = timedelta(milliseconds=1)
# Key ranges listed one by one in a filter that narrows a Delta scan to given files.
_RANGES = 50


def spark_schema(table: DeltaTable) -> StructType:
    return from_arrow_schema(pa.schema(table.schema().to_arrow()))


def table_root(table: DeltaTable) -> str:
    uri = table.table_uri.rstrip("/")
    return uri.removeprefix("file://") if uri.startswith("file:///") else uri


def live_files(table: DeltaTable) -> pa.Table:
    return pa.table(table.get_add_actions(flatten=True))


def live_bytes(actions: pa.Table) -> int:
    """The size of the files ``actions`` (add actions, as ``live_files``) lists."""
    return int(pc.sum(actions.column("size_bytes")).as_py() or 0) if actions.num_rows else 0


def bytes_per_row(actions: pa.Table) -> float | None:
    """The bytes a row takes in the files ``actions`` lists (add actions, as
    ``live_files``), from the log's sizes and row counts (of the files whose rows it
    records); None where it records none."""
    if not actions.num_rows or "num_records" not in actions.column_names:
        return None
    counted = actions.filter(pc.is_valid(actions.column("num_records")))
    rows = pc.sum(counted.column("num_records")).as_py() if counted.num_rows else 0
    return live_bytes(counted) / rows if rows else None


def prune_files(actions: pa.Table, parts: list[Part] | None) -> list[dict]:
    """The add actions whose statistics or partition values may hold a row of ``parts``."""
    rows = actions.to_pylist()
    if parts is None:
        return rows
    return [row for row in rows if any(_file_admits(row, part) for part in parts)]


def _file_bounds(row: dict, column: str) -> tuple[Any, Any]:
    """A file's lowest and highest value of ``column`` (an add action, as ``live_files``):
    its partition value, or its statistics (None where it has none)."""
    if f"partition.{column}" in row:
        return row[f"partition.{column}"], row[f"partition.{column}"]
    return row.get(f"min.{column}"), row.get(f"max.{column}")


def _file_admits(row: dict, part: Part) -> bool:
    for r in part:
        low, high = _file_bounds(row, r.column)
        try:
            if isinstance(low, datetime):
                low -= _STATS_SLACK
            if isinstance(high, datetime):
                high += _STATS_SLACK
            if not r.admits(low, high):
                return False
        except (TypeError, OverflowError):
            # Statistics of another type than the bound (e.g. partition values as text),
            # or at the end of Python's datetimes (a sentinel such as 0001-01-01): keep
            # the file; Spark's filter is exact.
            continue
    return True


def file_within(row: dict, parts: list[Part]) -> bool:
    """Whether every row of the file (an add action, as ``live_files``) lies in one of
    ``parts``, as far as its statistics or partition values tell: each range's column
    between its bounds (their inclusiveness aside: the answer sizes, never filters). A
    file without statistics for a range's column, or with statistics of another type
    than its bounds, is not known to lie within."""
    return any(all(_range_holds(row, r) for r in part) for part in parts)


def _range_holds(row: dict, r: Range) -> bool:
    low, high = _file_bounds(row, r.column)
    lower = r.lower[0] if isinstance(r.lower, tuple) else r.lower
    upper = r.upper[0] if isinstance(r.upper, tuple) else r.upper
    try:
        if isinstance(low, datetime):
            low += _STATS_SLACK  # kept to the millisecond: the true lowest may be above
        if lower is not None and (low is None or low < lower):
            return False
        return upper is None or (high is not None and high <= upper)
    except (TypeError, OverflowError):
        # Statistics of another type than the bound, or at the end of Python's
        # datetimes (a sentinel such as 9999-12-31): not known to lie within.
        return False


def holds_above(table: DeltaTable | None, column: str, value: object) -> bool:
    """Whether a row of ``table`` may hold ``column`` above ``value``, by its files' maximum
    statistics (read from the log); True when a file has none, one of another type, or a
    row without a value in ``column``. Delta keeps timestamps' statistics to the
    millisecond: a timestamp is compared by its millisecond, so a row above ``value``
    within that same millisecond goes unseen (for the one-pass merge that decides, a file
    rewritten unchanged, never a wrong row; rows counted above a cursor start at its next
    millisecond: ``above_bound``)."""
    if table is None:
        return True
    actions = live_files(table)
    if not actions.num_rows:
        return False
    name, nulls = f"max.{column}", f"null_count.{column}"
    if name not in actions.column_names:
        return True
    highs = actions.column(name)
    if highs.null_count:
        return True
    if isinstance(value, datetime):
        value = _to_millisecond(value)
    try:
        if nulls in actions.column_names and (pc.max(actions.column(nulls)).as_py() or 0):
            return True  # a row without a watermark: a newer row does not replace it
        return pc.max(highs).as_py() > value
    except Exception:
        # Statistics of another type, or past what Python's types hold: not known.
        return True


def highest_bounds(actions: pa.Table, column: str) -> tuple[object, object] | None:
    """Bounds (low, high) between which the highest value of ``column`` in the files
    ``actions`` lists lies, by their maximum statistics: a timestamp's widened by
    ``_STATS_SLACK`` either way (kept to the millisecond); None when a file with a value in
    ``column`` has no maximum, or the statistics hold no value at all. Only for statistics
    that count live rows (no deletion vectors) and name the column as it is (no column
    mapping): the caller judges that."""
    name, nulls = f"max.{column}", f"null_count.{column}"
    if not actions.num_rows or name not in actions.column_names:
        return None
    if nulls not in actions.column_names or "num_records" not in actions.column_names:
        return None
    highs = actions.column(name).to_pylist()
    counts = actions.column(nulls).to_pylist()
    records = actions.column("num_records").to_pylist()
    known = []
    for high, null_rows, rows in zip(highs, counts, records, strict=True):
        if high is not None:
            known.append(high)
        elif null_rows is None or rows is None or null_rows != rows:
            return None  # a file with values but no maximum: nothing is known
    if not known:
        return None
    try:
        top = max(known)
        if isinstance(top, datetime):
            top = to_utc(top)
            return top - _STATS_SLACK, top + _STATS_SLACK
    except (TypeError, OverflowError):
        return None  # statistics of mixed types, or at the end of Python's datetimes
    return top, top


def highest_read(table: DeltaTable, column: str, low: datetime, high: datetime) -> datetime | None:
    """The highest value of ``column`` (a timestamp with a zone), read by
    delta-rs from the rows at or above ``low`` of the files whose statistics may hold one
    (``highest_bounds`` put it in [``low``, ``high``]): the few rows a timestamp's
    millisecond statistics leave open, with no Spark job. None where it is not found
    there, or delta-rs cannot read it (a reader feature it lacks, a store's refusal): the
    probe's Spark scan then finds it."""
    try:
        # delta-rs prunes files by statistics of its own reading: a second under the bound
        # keeps every file that may hold a row at or above it. INT96 values (older
        # writers) are read in microseconds, as Spark reads them.
        dataset = table.to_pyarrow_dataset(
            file_pruning_predicate=[(column, ">=", low - timedelta(seconds=1))],
            parquet_read_options=pads.ParquetReadOptions(coerce_int96_timestamp_unit="us"),
        )
        rows = dataset.to_table(columns=[column], filter=pc.field(column) >= low)
        micros = rows.column(0).cast(pa.timestamp("us", "UTC")).cast(pa.int64())
        found = pc.max(micros).as_py()
    except Exception:
        return None
    if found is None:
        return None
    value = from_transaction_version(int(found), "timestamp")
    assert isinstance(value, datetime)
    return value if low <= value <= high else None


def above_bound(cursor: object) -> tuple[object, bool]:
    """Where the rows surely newer than a table whose statistics hold nothing above
    ``cursor`` (``holds_above``) begin, and whether the bound itself is one of them: above
    ``cursor``; for a timestamp, from the next millisecond on (a row of the table may sit
    above the cursor inside its millisecond, hidden by the truncated statistics)."""
    if isinstance(cursor, datetime):
        return _to_millisecond(cursor) + timedelta(milliseconds=1), True
    return cursor, False


def _to_millisecond(moment: datetime) -> datetime:
    """``moment`` truncated to its millisecond, as Delta keeps timestamps' statistics."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


@dataclass(frozen=True)
class KeySet:
    """The values of a table's first key column that a run touches: files whose statistics
    hold none of them are not read (``files_holding``). ``values`` are the sorted, distinct
    values, or (``spans``) the lowest and the highest of one or more ranges, in order
    (``low, high, low, high, ...``), every value inside a range counted as touched."""

    column: str
    values: Sequence[int | str | date]
    spans: bool = False

    def ranges(self) -> list[tuple[Any, Any]]:
        """The touched ranges of a ``spans`` set, lowest first."""
        return list(zip(self.values[::2], self.values[1::2], strict=True))


# Up to this many touched keys are listed one by one (in the pruning filter, ``IN (...)``);
# more are pruned by their range.
LISTED_KEYS = 1000


@dataclass(frozen=True)
class KeyRange:
    """The lowest and highest value of a key column among some rows, and about how many
    distinct values they hold (an estimate: 5% relative standard deviation), as their
    write counted them (``range_counters``)."""

    column: str
    low: int | str | date | None
    high: int | str | date | None
    values: int

    @classmethod
    def counted(cls, column: str, counted: Mapping[str, Any]) -> KeyRange | None:
        """The range ``range_counters`` counted, from a write's counts; None when the
        write did not count one for ``column``."""
        if counted.get(_RANGE_COLUMN) != column:
            return None
        values = int(counted.get(_RANGE_VALUES) or 0)
        if not values:
            # No value to count (a write counts a missing minimum as 0).
            return cls(column, None, None, 0)
        return cls(column, counted.get(_RANGE_LOW), counted.get(_RANGE_HIGH), values)

    def spanned(self) -> KeySet:
        """Every value from the lowest to the highest counted as touched (none when there
        was none)."""
        if self.low is None or self.high is None:
            return KeySet(self.column, [])
        return KeySet(self.column, [self.low, self.high], spans=True)


_RANGE_COLUMN, _RANGE_LOW = "key_range:column", "key_range:low"
_RANGE_HIGH, _RANGE_VALUES = "key_range:high", "key_range:values"


def range_counters(schema: StructType, column: str) -> list[Column]:
    """What a write counts of ``column`` for ``touched_keys`` (``KeyRange.counted``): its
    lowest and highest value and about how many distinct values, as the rows are written;
    nothing when the column's type has no reliable statistics (``touched_keys`` would
    prune nothing by it)."""
    if column not in schema.names or not _prunable(schema[column].dataType):
        return []
    key = F.col(quote(column))
    return [
        F.lit(column).alias(_RANGE_COLUMN),
        F.min(key).alias(_RANGE_LOW),
        F.max(key).alias(_RANGE_HIGH),
        F.approx_count_distinct(key, 0.05).alias(_RANGE_VALUES),
    ]


def _prunable(kind: DataType) -> bool:
    return isinstance(kind, (IntegralType, StringType, DateType))


def touched_keys(
    rows: DataFrame,
    keys: Sequence[str],
    limit: int = 2_000_000,
    listed: int = LISTED_KEYS,
    *,
    at_most: int | None = None,
    counted: KeyRange | None = None,
) -> KeySet | None:
    """The values of the first key in ``rows``: listed when there are at most ``listed``,
    else their range; None (read every file) when the key's type has no reliable
    statistics or there are more than ``limit`` values. One Spark job (their range and
    approximate count), and a second that collects them only when they are few.
    ``at_most``: the rows' count when known (a staged increment's, as its write counted
    it): when it is at most ``listed``, so are the keys, which one job collects.
    ``counted``: their range as the rows' write counted it (``range_counters``), in
    place of the first job; the second runs only when they may be few."""
    column = keys[0]
    kind = rows.schema[column].dataType
    if not _prunable(kind):
        return None
    key = F.col(quote(column))
    present = rows.select(key).filter(key.isNotNull())
    if at_most is not None and at_most <= listed:
        values = sorted(row[0] for row in present.distinct().collect())
        return None if len(values) > limit else KeySet(column, values)
    if counted is not None and counted.column == column:
        low, high, count = counted.low, counted.high, counted.values
    else:
        low, high, count = present.agg(
            F.min(key), F.max(key), F.approx_count_distinct(key, 0.05)
        ).first()
    if low is None:
        return KeySet(column, [])
    if count > limit:
        return None
    if count > listed * 1.2:
        return KeySet(column, [low, high], spans=True)
    found = present.distinct().limit(listed + 1).collect()
    if len(found) > min(listed, limit):
        return None if len(found) > limit else KeySet(column, [low, high], spans=True)
    return KeySet(column, sorted(row[0] for row in found))


def within_files(rows: DataFrame, keys: KeySet, actions: pa.Table, most_files: int = 64) -> KeySet:
    """``keys``, one range of ``rows``' first key, narrowed to the parts of it that the
    table's files holding one of ``rows``' keys cover (``actions``: its live files, as
    ``live_files`` lists them, of one snapshot): what a merge of ``rows`` may rewrite at
    most, leaving out the files the range covers that hold none of its keys (the newest
    keys' files, between an increment's updates to recent keys and its new keys above them
    all). An estimate for deciding how to write (``key_order``), not a pruning filter:
    another writer may add one of the keys outside these parts before the merge reads the
    table.

    One Spark job over ``rows``' key. ``keys`` as they are where the range covers fewer
    than two files or more than ``most_files``, a file without statistics of the key, or
    keys that are partition values."""
    if not keys.spans or len(keys.values) != 2:
        return keys
    column, (low, high) = keys.column, keys.values
    files = files_holding(actions, keys)
    bounds = [(f.get(f"min.{column}"), f.get(f"max.{column}")) for f in files]
    if (
        not 2 <= len(files) <= most_files
        or any(f"partition.{column}" in f for f in files)
        or any(bottom is None or top is None for bottom, top in bounds)
    ):
        return keys
    key = F.col(quote(column))
    found = aggregated(
        rows,
        *[
            F.max(key.between(F.lit(bottom), F.lit(top)).cast("int")).alias(f"file_{i}")
            for i, (bottom, top) in enumerate(bounds)
        ],
    )
    merged: list[list[Any]] = []
    try:
        # Each file's range clipped to the keys' own: every key lies inside it.
        hits = [bound for i, bound in enumerate(bounds) if found[f"file_{i}"]]
        for bottom, top in sorted((max(b, low), min(t, high)) for b, t in hits):
            if merged and bottom <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], top)
            else:
                merged.append([bottom, top])
    except TypeError:
        return keys  # statistics of mixed types
    return KeySet(column, [v for pair in merged for v in pair], spans=True)


def files_holding(actions: pa.Table, keys: KeySet) -> list[dict]:
    """The add actions that may hold one of ``keys``: those whose min/max statistics of the
    key column bracket one of the values. Files without usable statistics are kept.
    (Truncated string statistics are still bounds: writers shorten the minimum and round
    the maximum up.)"""
    return [row for row in actions.to_pylist() if _brackets(row, keys)]


def bytes_holding(table: DeltaTable, keys: KeySet | None) -> int:
    """The size of the live files that may hold one of ``keys`` (all of them for None), from
    the log: what a merge of those keys rewrites at most."""
    actions = live_files(table)
    if keys is None:
        return live_bytes(actions)
    return sum(int(row["size_bytes"]) for row in files_holding(actions, keys))


def rows_holding(actions: pa.Table, keys: KeySet | None) -> int | None:
    """The rows of the live files (``actions``, as ``live_files``) that may hold one of
    ``keys`` (all of them for None), from the log's statistics: what a merge of those keys
    rewrites at most. None when a file's count is not recorded."""
    files = actions.to_pylist() if keys is None else files_holding(actions, keys)
    counts = [row.get("num_records") for row in files]
    return None if None in counts else sum(int(c) for c in counts)


def _brackets(row: dict, keys: KeySet) -> bool:
    column, values = keys.column, keys.values
    if f"partition.{column}" in row:
        return True  # partition values are text; Spark's join is exact
    low, high = row.get(f"min.{column}"), row.get(f"max.{column}")
    if low is None or high is None:
        return True
    if not values:
        return False
    try:
        if keys.spans:
            return any(low <= top and high >= bottom for bottom, top in keys.ranges())
        i = bisect_left(values, low)
        return i < len(values) and values[i] <= high
    except TypeError:
        return True


def read_files(
    spark: SparkSession, table: DeltaTable, files: list[dict] | None = None
) -> DataFrame:
    """A DataFrame over the given add actions (all live files when ``files`` is None).

    The files are read directly, which is exact for tables whose files hold the logical
    columns and every row of them; a table with column mapping or deletion vectors is read
    through Spark's Delta Lake instead, keeping the rows of the given files (each at its
    ``version``, when the file's dict gives one)."""
    if needs_delta_reader(table):
        return _through_delta(spark, table, files)
    schema = spark_schema(table)
    partition_columns = list(table.metadata().partition_columns)
    if files is None:
        files = live_files(table).to_pylist()
    if not files:
        return no_rows(spark, schema)
    root = spark_uri(table_root(table))
    paths = [f"{root}/{unquote(row['path'])}" for row in files]
    if not partition_columns:
        return spark.read.schema(schema).parquet(*paths)
    # Partition values live in the paths; read them as text and cast to the table's types.
    file_fields = [f for f in schema.fields if f.name not in partition_columns]
    read_schema = StructType(
        [*file_fields, *[StructField(c, StringType(), True) for c in partition_columns]]
    )
    df = spark.read.schema(read_schema).option("basePath", root).parquet(*paths)
    for field in schema.fields:
        if field.name in partition_columns:
            df = df.withColumn(field.name, F.col(quote(field.name)).cast(field.dataType))
    return df.select(*[F.col(quote(f.name)) for f in schema.fields])


def spark_uri(path: str) -> str:
    """A table location as Spark's Hadoop file systems name it: ``s3://`` as ``s3a://``,
    ``az://<container>@<account>.blob.core.windows.net/...`` (a form delta-rs reads, and
    keeps in the table's URI) as ``wasbs://`` (hadoop-azure's Blob storage driver, which
    has no ``az`` scheme), and a relative local path made absolute (the JVM resolves
    relative paths against its own working folder, not the Python process's)."""
    if path.startswith("s3://"):
        return "s3a://" + path.removeprefix("s3://")
    if path.startswith("az://") and "@" in path.removeprefix("az://").split("/", 1)[0]:
        return "wasbs://" + path.removeprefix("az://")
    if "://" in path or path.startswith("file:"):
        return path
    return os.path.abspath(path)


def may_hold(keys: KeySet, listed: int = LISTED_KEYS, alias: str | None = None) -> Column:
    """A filter on the key column (of the table aliased ``alias``, if given) that Delta's
    data skipping turns into file pruning (see ``may_hold_sql``)."""
    return F.expr(may_hold_sql(keys, listed, alias))


def may_hold_sql(keys: KeySet, listed: int = LISTED_KEYS, alias: str | None = None) -> str:
    """A filter on the key column, as SQL text, that Delta's data skipping turns into file
    pruning: the values themselves (up to ``listed`` of them), else their range."""
    column = f"{alias}.{quote(keys.column)}" if alias else quote(keys.column)
    if not keys.values:
        return "FALSE"
    if len(keys.values) <= listed and not keys.spans:
        return f"{column} IN ({', '.join(sql_literal(v) for v in keys.values)})"
    ranges = keys.ranges() if keys.spans else [(keys.values[0], keys.values[-1])]
    between = [f"{column} BETWEEN {sql_literal(a)} AND {sql_literal(b)}" for a, b in ranges]
    return between[0] if len(between) == 1 else f"({' OR '.join(between)})"


def sql_literal(value: object) -> str:
    """A key value as a Spark SQL literal (integers, text, dates)."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return f"{value}L" if not -(2**31) <= value < 2**31 else str(value)
    if isinstance(value, datetime):
        raise TypeError("timestamps are not key values of a KeySet")
    if isinstance(value, date):
        return f"DATE'{value.isoformat()}'"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def unflagged_rows(table: DeltaTable, flagged_at: str, taken_from: str) -> int | None:
    """The rows whose ``flagged_at`` is null, from the log's statistics alone, where that
    column is ``taken_from``'s value on the rows a flag marks and null on the others (a
    soft-delete table's ``deleted_at``, from the delete's time: changes.soft_delete_columns):
    so where no file holds a null ``taken_from`` (whose flagged rows would have a null
    ``flagged_at`` too), the unflagged rows are ``flagged_at``'s nulls.

    None when the statistics cannot tell: a file without them (Delta keeps them for a
    table's first 32 columns unless its properties say otherwise: ``deleted_at`` comes
    last), a null ``taken_from``, either column missing, a partition column, or
    ``taken_from`` of a type whose cast to a timestamp may be null (text, decimals),
    deletion vectors (the statistics count the rows they delete) or column mapping."""
    if needs_delta_reader(table):
        return None
    schema = spark_schema(table)
    partitions = set(table.metadata().partition_columns)
    for column in (flagged_at, taken_from):
        if column not in schema.names or column in partitions:
            return None
    if not _cast_keeps_values(schema[taken_from].dataType):
        return None
    files = live_files(table)
    needed = [f"null_count.{flagged_at}", f"null_count.{taken_from}"]
    if files.num_rows == 0:
        return 0
    if any(name not in files.column_names or files.column(name).null_count for name in needed):
        return None
    if pc.sum(files.column(f"null_count.{taken_from}")).as_py():
        return None
    return int(pc.sum(files.column(f"null_count.{flagged_at}")).as_py() or 0)


def _cast_keeps_values(kind: DataType) -> bool:
    """Whether a value of ``kind`` cast to a timestamp is never null."""
    return isinstance(kind, (TimestampType, TimestampNTZType, DateType, IntegralType))


def needs_delta_reader(table: DeltaTable) -> bool:
    """Whether the table's Parquet files alone would read wrong: physical column names
    (column mapping) or rows deleted by deletion vectors."""
    config = table.metadata().configuration
    mapped = config.get("delta.columnMapping.mode", "none") != "none"
    return mapped or has_deletion_vectors(table)


def has_deletion_vectors(table: DeltaTable) -> bool:
    """Whether the table's files may carry deletion vectors (its protocol allows them)."""
    return "deletionVectors" in (table.protocol().reader_features or [])


def rows_deleted_by_vectors(table: DeltaTable) -> int:
    """Rows of the live files that their deletion vectors mark deleted (the log keeps
    each file's row count with the deleted rows in it). delta-rs reads the vectors."""
    if not has_deletion_vectors(table):
        return 0
    vectors = pa.table(table.deletion_vectors())
    if vectors.num_rows == 0:
        return 0
    kept = pc.list_flatten(vectors.column("selection_vector"))
    return len(kept) - int(pc.sum(kept.cast(pa.int64())).as_py() or 0)


def writes_deletion_vectors(table: DeltaTable | None) -> bool:
    """Whether Spark's DML on the table marks rows deleted in deletion vectors rather than
    rewriting their files (``delta.enableDeletionVectors``)."""
    if table is None:
        return False
    return table.metadata().configuration.get("delta.enableDeletionVectors") == "true"


def _within_stats(files: list[dict], column: str, partitions: set[str]) -> Column | None:
    """A filter on ``column`` that every row of ``files`` passes, from their min/max
    statistics (overlapping ranges merged, at most ``_RANGES`` of them), for Delta's data
    skipping; None when a file has no statistics of it."""
    if column in partitions or not files:
        return None
    ranges = []
    for row in files:
        low, high = row.get(f"min.{column}"), row.get(f"max.{column}")
        if low is None or high is None:
            return None
        if isinstance(low, datetime):
            low, high = low - _STATS_SLACK, high + _STATS_SLACK
        ranges.append((low, high))
    ranges.sort()
    merged = [list(ranges[0])]
    for low, high in ranges[1:]:
        if low <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    if len(merged) > _RANGES:
        merged = [[merged[0][0], max(high for _, high in merged)]]
    value = F.col(quote(column))
    out = None
    for low, high in merged:
        part = value.between(F.lit(low), F.lit(high))
        out = part if out is None else out | part
    return out


def _through_delta(spark: SparkSession, table: DeltaTable, files: list[dict] | None) -> DataFrame:
    """The given files' rows read by Spark's Delta Lake, each at the version given with it
    (``version``; default the table's), so a file a later OPTIMIZE compacted away is still
    read as it was, with its deletion vector and column mapping."""
    uri = spark_uri(table_root(table))
    if files is None:
        return spark.read.format("delta").option("versionAsOf", table.version()).load(uri)
    by_version: dict[int, set[str]] = {}
    for row in files:
        name = unquote(row["path"]).rsplit("/", 1)[-1]
        by_version.setdefault(int(row.get("version", table.version())), set()).add(name)
    name = F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1)
    # Delta's data skipping ignores the file name: the files' own statistics narrow the
    # scan to the files whose first column overlaps theirs, not the whole table.
    partitions = set(table.metadata().partition_columns)
    near = _within_stats(files, table.schema().fields[0].name, partitions)
    frames = []
    for version, names in sorted(by_version.items()):
        rows = spark.read.format("delta").option("versionAsOf", version).load(uri)
        if near is not None:
            rows = rows.filter(near)
        listed = sorted(names)
        frames.append(rows.filter(F.url_decode(name).isin(listed) | name.isin(listed)))
    if not frames:
        return spark.read.format("delta").option("versionAsOf", table.version()).load(uri).limit(0)
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame, allowMissingColumns=True)
    return out
