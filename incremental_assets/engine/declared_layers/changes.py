"""The upstream rows a layer's refresh reads: those whose keys changed since the upstream
version the layer last covered, as they were at that version and as they are now.

Which keys changed comes from the upstream's change data feed when it has one (on at both
versions: every insert, update and delete in between names its key), else from the data
files the versions in between added and removed (a superset: a rewritten file also holds
copies of rows it did not change, which the layer then recomputes to the same values).
Both reads follow the increment, not the upstream's size; the rows themselves are then
read at the two versions (Delta's time travel), pruned to the files whose key statistics
may hold the changed keys.

A first run (nothing covered yet) reads the whole upstream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.sources.delta_log import change_feed_enabled
from incremental_assets.engine.transforms import quote

FULL_READ = "full read"
CHANGE_FEED = "change data feed"
FILES = "added and removed files"


@dataclass(frozen=True)
class UpstreamChanges:
    """``before``: upstream rows at ``since`` whose keys changed (none on a first run);
    ``after``: those rows at ``until`` (every row on a first run)."""

    since: int
    until: int
    before: DataFrame
    after: DataFrame
    found_by: str

    @property
    def first(self) -> bool:
        return self.since < 0


def changes_since(
    spark: SparkSession, upstream: DeltaTarget, keys: Sequence[str], since: int
) -> UpstreamChanges | None:
    """The upstream's changes after version ``since`` (-1: everything); None when the
    upstream has no version after it."""
    until = upstream.open().version()
    if until == since:
        return None
    now = upstream.to_spark(spark, version=until)
    if since < 0:
        return UpstreamChanges(since, until, now.limit(0), now, FULL_READ)
    if _feed_covers(upstream, since):
        touched, found_by = _feed_keys(spark, upstream, keys, since, until), CHANGE_FEED
    else:
        touched, found_by = _file_keys(spark, upstream, keys, since), FILES
    touched = touched.distinct()
    holding = delta_io.touched_keys(touched, keys)
    then = upstream.to_spark(spark, version=since, holding=holding)
    now = upstream.to_spark(spark, version=until, holding=holding)
    return UpstreamChanges(
        since, until, having_keys(then, touched, keys), having_keys(now, touched, keys), found_by
    )


def having_keys(
    rows: DataFrame, keys_of: DataFrame, keys: Sequence[str], how: str = "left_semi"
) -> DataFrame:
    """The ``rows`` whose ``keys`` equal those of a row of ``keys_of`` (nulls equal too);
    with ``how="left_anti"``, the others."""
    named = keys_of.select(*[F.col(quote(k)).alias(f"_ia_key{i}") for i, k in enumerate(keys)])
    same = [F.col(quote(k)).eqNullSafe(F.col(f"_ia_key{i}")) for i, k in enumerate(keys)]
    return rows.join(named, reduce(lambda a, b: a & b, same), how)


def _feed_covers(upstream: DeltaTarget, since: int) -> bool:
    """Whether the upstream records its change data feed at ``since`` and now (then every
    version in between has it, unless it was turned off and on again: Spark says so)."""
    return all(
        change_feed_enabled(upstream.open(version).metadata().configuration)
        for version in (since, None)
    )


def _feed_keys(
    spark: SparkSession, upstream: DeltaTarget, keys: Sequence[str], since: int, until: int
) -> DataFrame:
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", since + 1)
        .option("endingVersion", until)
        .load(upstream.spark_path)
    )
    return changes.select(*[F.col(quote(k)) for k in keys])


def _file_keys(
    spark: SparkSession, upstream: DeltaTarget, keys: Sequence[str], since: int
) -> DataFrame:
    """Keys of the rows in the files live now but not at ``since``, and in the files live
    then but not now (a file with a new deletion vector counts as both)."""
    now, then = upstream.open(), upstream.open(since)
    now_files = delta_io.live_files(now).to_pylist()
    then_files = delta_io.live_files(then).to_pylist()
    now_ids, then_ids = {_identity(f) for f in now_files}, {_identity(f) for f in then_files}
    added = [f for f in now_files if _identity(f) not in then_ids]
    removed = [f for f in then_files if _identity(f) not in now_ids]
    columns = [F.col(quote(k)) for k in keys]
    return (
        delta_io.read_files(spark, now, added)
        .select(*columns)
        .unionByName(delta_io.read_files(spark, then, removed).select(*columns))
    )


def _identity(action: dict) -> tuple:
    """A live file as a version sees it: its path and deletion vector (a DELETE on a table
    with deletion vectors keeps the path and gives it a new vector)."""
    vector = tuple(
        sorted((k, str(v)) for k, v in action.items() if k.lower().startswith("deletion"))
    )
    return (action["path"], vector)
