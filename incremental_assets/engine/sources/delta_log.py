"""What the commits of a Delta source added since a version, and a read of just those rows.

A Delta source's ledger is the source version each load read (engine/late_files.py). The
next run asks the source's log, through Spark's Delta Lake, what the commits after that
version added; this reads the commit files of those versions only, never a data file.

- An **append** (new files, none removed as a data change) adds rows: its files are read,
  through Spark's Delta Lake, so deletion vectors and column mapping are honoured, and no
  other file of the table is opened. Files a later OPTIMIZE compacted are read as they
  were appended (compaction is no data change); files a later DELETE rewrote are read as
  rewritten.
- A **rewrite** (UPDATE, MERGE, an overwrite: files removed as a data change) mixes the
  rows it changed with copies of rows it did not; only the table's change data feed tells
  them apart. With ``delta.enableChangeDataFeed`` on the source, its inserted and
  updated rows are read from the feed; without it the versions are reported as
  unchecked, never passed over in silence. Files appended before it in the range are
  still read as appended.
- A **DELETE** adds no rows; an appended file it rewrote is read as rewritten.

The log is read through delta-spark's JVM classes (``DeltaLog.getChanges``,
``DeltaLog.createDataFrame``): the same reads Delta's own streaming source makes, which
the Python API does not expose. delta-spark's version is pinned in pyproject.toml; the
tests of this module fail first if those classes change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

# Names of late "files" that are a rewrite version's change data, not a data file.
CHANGE_DATA = "change-data@v"
# What getChanges raises when log files of the range are gone (log retention).
_VERSIONS_GONE = (
    "DELTA_MISSING_FILES_UNEXPECTED_VERSION",
    "versionNotContiguous",
    "FileNotFoundException",
)
_CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
# Statistics of time columns are milliseconds; a zone-less timestamp is in the source's
# zone, up to 14 hours either side of UTC.
_SLACK = {True: timedelta(milliseconds=1), False: timedelta(hours=15)}


@dataclass
class Added:
    """What the commits after a version added: appended files (path -> AddFile), the
    versions that rewrote files, and whether the log still held every version."""

    appended: dict = field(default_factory=dict)
    rewrites: list[int] = field(default_factory=list)
    complete: bool = True


def added_since(spark: SparkSession, uri: str, start: int, end: int) -> Added:
    """The data the commits ``start..end`` (inclusive) of the table at ``uri`` added."""
    jvm = spark.sparkContext._jvm  # type: ignore[union-attr]
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri)
    added = Added()
    try:
        changes = log.getChanges(start, end, jvm.scala.Option.empty(), True)
        while changes.hasNext():
            pair = changes.next()
            _apply(added, int(pair._1()), pair._2())
    except Py4JJavaError as exc:
        if any(sign in str(exc) for sign in _VERSIONS_GONE):
            added.complete = False  # the log's retention dropped versions since the load
            return added
        raise
    return added


def _apply(added: Added, version: int, actions) -> None:
    adds, removes, operation = [], [], None
    it = actions.iterator()
    while it.hasNext():
        action = it.next()
        kind = action.getClass().getSimpleName()
        if kind == "AddFile" and action.dataChange():
            adds.append(action)
        elif kind == "RemoveFile" and action.dataChange():
            removes.append(action)
        elif kind == "CommitInfo":
            operation = action.operation()
    if not removes:
        added.appended.update((a.path(), a) for a in adds)
        return
    if operation != "DELETE":
        # Files appended earlier in the range stay read as appended (their files remain
        # until a VACUUM); the rewrite's own rows come from the change data feed.
        added.rewrites.append(version)
        return
    hit = [r for r in removes if added.appended.pop(r.path(), None) is not None]
    if hit:
        # An appended file the DELETE rewrote (or marked with a deletion vector): its
        # remaining rows are in the files this commit added.
        added.appended.update((a.path(), a) for a in adds)


def may_hold_below(add, physical: str, cursor: object) -> bool:
    """Whether an AddFile's statistics allow a row whose ``physical`` column is at or
    below ``cursor`` (True without statistics)."""
    stats = add.stats()
    if not stats:
        return True
    low = json.loads(stats).get("minValues", {}).get(physical)
    if low is None:
        return True
    bound = cursor[0] if isinstance(cursor, tuple) else cursor
    if isinstance(bound, datetime):
        try:
            value = datetime.fromisoformat(str(low).replace("Z", "+00:00"))
        except ValueError:
            return True
        aware = value.tzinfo is not None
        value = value if aware else value.replace(tzinfo=timezone.utc)
        return value - _SLACK[aware] <= bound
    try:
        return low <= bound
    except TypeError:
        return True


def read_added(spark: SparkSession, uri: str, version: int, adds: list) -> DataFrame:
    """The rows of the given AddFiles, read by Spark's Delta Lake against the snapshot at
    ``version`` (its schema, column mapping and deletion vectors), opening no other file."""
    jvm = spark.sparkContext._jvm  # type: ignore[union-attr]
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri)
    none = jvm.scala.Option.empty()
    snapshot = log.getSnapshotAt(version, none, none, False)
    files = jvm.java.util.ArrayList()
    for add in adds:
        files.add(add)
    seq = jvm.scala.jdk.javaapi.CollectionConverters.asScala(files).toSeq()
    return DataFrame(log.createDataFrame(snapshot, seq, False, none), spark)


def change_feed_enabled(configuration: dict[str, str]) -> bool:
    return configuration.get("delta.enableChangeDataFeed", "false").lower() == "true"


def read_changes(spark: SparkSession, uri: str, versions: list[int]) -> DataFrame:
    """The rows the given versions inserted or updated (post-images), from the table's
    change data feed."""
    frames = [
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", v)
        .option("endingVersion", v)
        .load(uri)
        for v in versions
    ]
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    kept = F.col("_change_type").isin("insert", "update_postimage")
    return rows.filter(kept).drop(*_CHANGE_COLUMNS)
