"""Rows shuffled into ranges of their first key, without Spark's range partitioner.

A run that creates a table writes its files each over a narrow range of keys: that is
what lets later merges skip target files by their statistics. ``repartitionByRange``
gives it, but its range partitioner first samples its input in a Spark job of its own
that evaluates the whole plan below the shuffle, every column of it (at 3M rows, 4.8 s
of a 23.7 s reload). Here the ranges' bounds come from ``percentile_approx`` over the
first key alone, a pass that reads that one column, and the rows are hash-shuffled on a
bucket column whose values are chosen so that Spark's hash partitioning sends range
``i`` to partition ``i``. Adjacent partitions hold adjacent ranges, so adaptive
execution's coalescing of small partitions keeps each file's keys in one range.

Any bucket a key is given is correct (all rows of a key share its first key, so its
bucket): the bounds only decide how evenly the files are filled and how narrow they are.
Keys of other types (text, binary) keep ``repartitionByRange``; so does a session whose
shuffle partition count is not a number (Databricks' ``auto``).

Where a source's file statistics state each file's lowest and highest key and its rows
(a Delta log: ``FileKeys``), the bounds come from them, each file's rows taken as spread
evenly over its keys, and the pass counts the rows without the sketch (at 5M rows the
sketch was about 0.5 s of that pass, at 20M about 1.2 s). The source gives them only
where they bound the rows read (``Source.key_files``); the pass's count checks that they
count them: when the window keeps less than ``STATED_SHARE`` of the rows they count (a
feed's rows its strategy drops, rows deletion vectors delete), the sketch runs after all,
in a pass of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.engine.spark.aggregates import aggregated
from incremental_assets.engine.transforms import KEY_RANGE, quote

# Spark's hash partitioning: pmod(murmur3_x86_32(value, seed 42), partitions).
_SEED = 42
_MASK = 0xFFFFFFFF


Shuffle = Callable[[DataFrame], DataFrame]

# The least share of the rows the statistics count that the window must keep for its
# ranges to be taken from them.
STATED_SHARE = 0.9
_STATED_ROWS = "_ia_stated_rows"


@dataclass(frozen=True)
class FileKeys:
    """What a source's file statistics state of the files a window reads: each file's
    lowest and highest first key (as numbers in the key's order) and its rows, for a key
    of type ``data_type``."""

    files: tuple[tuple[float, float, int], ...]
    data_type: T.DataType

    @property
    def rows(self) -> int:
        return sum(rows for _, _, rows in self.files)

    def bounds(self, fractions: Sequence[float]) -> list[float]:
        """The keys at or below which each of ``fractions`` of the rows lie, each file's
        rows taken as spread evenly between its lowest and highest key (a file of one key:
        all at that key)."""
        return spread_bounds(self.files, fractions)


def spread_bounds(
    files: Sequence[tuple[float, float, int]], fractions: Sequence[float]
) -> list[float]:
    """``FileKeys.bounds`` of ``files``: one sweep over the files' ends in key order, the
    rows below a key rising by each open file's rows per key between ends, and at once by
    a one-key file's rows at its key. Between files (none open) nothing rises: the slope
    is set to 0 there, not left to the float error of adding and taking off each file's
    own. Files without rows, or with an end that is not a finite number, are left out."""
    kept = [
        (low, high, rows)
        for low, high, rows in files
        if rows > 0 and math.isfinite(low) and math.isfinite(high)
    ]
    total = sum(rows for _, _, rows in kept)
    if not total or not fractions:
        return []
    jumps: dict[float, float] = {}
    slopes: dict[float, float] = {}
    opened: dict[float, int] = {}
    for low, high, rows in kept:
        if high <= low:
            jumps[low] = jumps.get(low, 0.0) + rows
        else:
            slope = rows / (high - low)
            slopes[low] = slopes.get(low, 0.0) + slope
            slopes[high] = slopes.get(high, 0.0) - slope
            opened[low] = opened.get(low, 0) + 1
            opened[high] = opened.get(high, 0) - 1
    targets = [f * total for f in fractions]
    found: list[float] = []
    below, slope, open_files, previous = 0.0, 0.0, 0, None
    for key in sorted(jumps.keys() | slopes.keys()):
        if previous is not None and slope > 0:
            rising = slope * (key - previous)
            while len(found) < len(targets) and below + rising >= targets[len(found)]:
                found.append(previous + (targets[len(found)] - below) / slope)
            below += rising
        below += jumps.get(key, 0.0)
        while len(found) < len(targets) and below >= targets[len(found)]:
            found.append(key)
        open_files += opened.get(key, 0)
        slope = max(slope + slopes.get(key, 0.0), 0.0) if open_files else 0.0
        previous = key
    last = previous if previous is not None else 0.0
    return found + [last] * (len(targets) - len(found))


def ranged(rows: DataFrame, key: str, *also: Column) -> tuple[DataFrame | None, dict]:
    """``rows`` with a ``KEY_RANGE`` column, hash-shuffled on it so that partition ``i``
    holds the ``i``-th range of ``key``; None where this does not apply (the caller then
    range-partitions): a key that is not a number, date or timestamp, no rows, or a
    shuffle partition count Spark decides itself. Then the values of the aggregates
    ``also`` (each named with ``alias``), counted in the pass that finds the ranges'
    bounds: empty when no pass was made."""
    shuffle, found = ranges_of(rows, key, *also)
    return (shuffle(rows) if shuffle is not None else None), found


def ranges_of(
    rows: DataFrame,
    key: str,
    *also: Column,
    stated: Callable[[], FileKeys | None] | None = None,
) -> tuple[Shuffle | None, dict]:
    """``ranged``, as the shuffle it makes: it gives any rows with ``key`` the same
    ranges, found in ``rows`` (the same key goes to the same partition). ``stated``:
    what the source's file statistics say of ``rows``' files, asked only here (None:
    they say nothing, and the ranges come from a sketch of the keys)."""
    partitions = shuffle_partitions(rows.sparkSession)
    data_type = rows.schema[key].dataType
    column = F.col(quote(key))
    position = _position(data_type, column)
    if partitions is None or position is None:
        return None, {}
    if partitions == 1:
        return _shuffled_on(F.lit(0), 1), {}
    fractions = [i / partitions for i in range(1, partitions)]

    def sketch() -> Column:
        return F.percentile_approx(position, fractions).alias("bounds")

    files = stated() if stated is not None else None
    # Two jobs (agg) rather than one observed write: a window read through deletion
    # vectors cannot be observed under a write command (aggregates.py).
    if files is not None and files.data_type == data_type and files.rows:
        found = aggregated(rows, *also, F.count(F.lit(1)).alias(_STATED_ROWS), one_job=False)
        if found.pop(_STATED_ROWS) >= STATED_SHARE * files.rows:
            bounds = files.bounds(fractions)
        else:  # the window keeps too few of the rows they count: sketched after all
            bounds = aggregated(rows, sketch(), one_job=False)["bounds"]
    else:
        found = aggregated(rows, sketch(), *also, one_job=False)
        bounds = found.pop("bounds")
    if not bounds:
        return None, found
    values = bucket_values(partitions)
    bucket = _bucket(position, [float(b) for b in bounds], values, 0, len(bounds))
    return _shuffled_on(bucket), found


def _shuffled_on(bucket: Column, partitions: int | None = None) -> Shuffle:
    def shuffle(rows: DataFrame) -> DataFrame:
        ranged = rows.withColumn(KEY_RANGE, bucket)
        if partitions is None:
            return ranged.repartition(F.col(KEY_RANGE))
        return ranged.repartition(partitions, F.col(KEY_RANGE))

    return shuffle


def shuffle_partitions(spark: SparkSession) -> int | None:
    """The partitions a shuffle by column starts with: adaptive execution's initial
    count where it sets one and coalesces partitions, else ``spark.sql.shuffle.partitions``
    (as Spark's ``SQLConf.numShufflePartitions``)."""
    conf = spark.conf
    initial = None
    if _on(conf.get("spark.sql.adaptive.enabled", "true")) and _on(
        conf.get("spark.sql.adaptive.coalescePartitions.enabled", "true")
    ):
        initial = conf.get("spark.sql.adaptive.coalescePartitions.initialPartitionNum", None)
    return partition_count(initial or conf.get("spark.sql.shuffle.partitions", "200"))


def _on(text: str | None) -> bool:
    return str(text).strip().lower() == "true"


def partition_count(text: str | None) -> int | None:
    """A setting's partition count; None for one Spark decides (Databricks' ``auto``)."""
    try:
        count = int(str(text))
    except ValueError:
        return None
    return count if count > 0 else None


def bucket_values(partitions: int) -> list[int]:
    """For each partition ``i``, the smallest integer Spark's hash partitioning sends to
    ``i`` among ``partitions``."""
    values: dict[int, int] = {}
    candidate = 0
    while len(values) < partitions:
        values.setdefault(partition_of(candidate, partitions), candidate)
        candidate += 1
    return [values[i] for i in range(partitions)]


def partition_of(value: int, partitions: int) -> int:
    """The partition Spark's hash partitioning gives an integer column's ``value``."""
    return _signed(_hash_int(value, _SEED)) % partitions


def _position(data_type: T.DataType, column: Column) -> Column | None:
    """The key as a number whose order is the key's order (None: no such number here)."""
    if isinstance(data_type, T.NumericType):
        return column.cast("double")
    if isinstance(data_type, T.DateType):
        return F.unix_date(column).cast("double")
    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        return F.unix_micros(column.cast("timestamp")).cast("double")
    return None


def _bucket(position: Column, bounds: list[float], values: list[int], lo: int, hi: int):
    """The bucket value of the range ``position`` falls in, among ranges ``lo``..``hi``
    (range ``i`` ends at ``bounds[i]``; the last one is open): a binary search, so a row
    makes about log2(partitions) comparisons. A null key goes to the last range."""
    if lo == hi:
        return F.lit(values[lo])
    middle = (lo + hi) // 2
    return F.when(
        position <= F.lit(bounds[middle]), _bucket(position, bounds, values, lo, middle)
    ).otherwise(_bucket(position, bounds, values, middle + 1, hi))


def _hash_int(value: int, seed: int) -> int:
    """Murmur3 x86 32-bit of a 4-byte integer, as Spark's ``Murmur3_x86_32.hashInt``."""
    k1 = _mix_k1(value & _MASK)
    h1 = _mix_h1(seed & _MASK, k1)
    return _fmix(h1, 4)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix_k1(k1: int) -> int:
    k1 = (k1 * 0xCC9E2D51) & _MASK
    k1 = _rotl(k1, 15)
    return (k1 * 0x1B873593) & _MASK


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = _rotl(h1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK
    h1 ^= h1 >> 16
    return h1


def _signed(x: int) -> int:
    return x - (1 << 32) if x & 0x80000000 else x
