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
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from incremental_assets.engine.spark.aggregates import aggregated
from incremental_assets.engine.transforms import KEY_RANGE, quote

# Spark's hash partitioning: pmod(murmur3_x86_32(value, seed 42), partitions).
_SEED = 42
_MASK = 0xFFFFFFFF


Shuffle = Callable[[DataFrame], DataFrame]


def ranged(rows: DataFrame, key: str, *also: Column) -> tuple[DataFrame | None, dict]:
    """``rows`` with a ``KEY_RANGE`` column, hash-shuffled on it so that partition ``i``
    holds the ``i``-th range of ``key``; None where this does not apply (the caller then
    range-partitions): a key that is not a number, date or timestamp, no rows, or a
    shuffle partition count Spark decides itself. Then the values of the aggregates
    ``also`` (each named with ``alias``), counted in the pass that finds the ranges'
    bounds: empty when no pass was made."""
    shuffle, found = ranges_of(rows, key, *also)
    return (shuffle(rows) if shuffle is not None else None), found


def ranges_of(rows: DataFrame, key: str, *also: Column) -> tuple[Shuffle | None, dict]:
    """``ranged``, as the shuffle it makes: it gives any rows with ``key`` the same
    ranges, found in ``rows`` (the same key goes to the same partition)."""
    partitions = shuffle_partitions(rows.sparkSession)
    column = F.col(quote(key))
    position = _position(rows.schema[key].dataType, column)
    if partitions is None or position is None:
        return None, {}
    if partitions == 1:
        return _shuffled_on(F.lit(0), 1), {}
    fractions = [i / partitions for i in range(1, partitions)]
    # Two jobs (agg) rather than one observed write: a window read through deletion
    # vectors cannot be observed under a write command (aggregates.py).
    found = aggregated(
        rows, F.percentile_approx(position, fractions).alias("bounds"), *also, one_job=False
    )
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
