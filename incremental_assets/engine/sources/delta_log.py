"""What the commits of a Delta source added since a version, and a read of just those rows.

A Delta source's ledger is the source version each load read (engine/late_files.py). The
next run asks the source's log what the commits after that version added: it reads the
JSON commit files of those versions (``_delta_log/<version>.json``) with Spark's JSON
reader, through the same Hadoop file system as the table (``file``, ``s3a``, ``abfss``
alike, and through Spark Connect), never a data file.

- An **append** (new files, none removed as a data change) adds rows: its files are read
  alone, and no other file of the table is opened. Files a later OPTIMIZE compacted are
  read as they were appended (compaction is no data change); files a later DELETE rewrote
  are read as rewritten.
- A **rewrite** (UPDATE, MERGE, an overwrite: files removed as a data change) mixes the
  rows it changed with copies of rows it did not; only the table's change data feed tells
  them apart. With ``delta.enableChangeDataFeed`` on the source, its inserted and
  updated rows are read from the feed; without it the versions are reported as
  unchecked, never passed over in silence. Files appended before it in the range are
  still read as appended.
- A **DELETE** adds no rows; an appended file it rewrote is read as rewritten.

Only public APIs are used (Spark's JSON reader, ``format("delta")``): the loader runs the
same way through Spark Connect, whose clients have no JVM.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

# Names of late "files" that are a rewrite version's change data, not a data file.
CHANGE_DATA = "change-data@v"
_CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
# Statistics of time columns are milliseconds; a zone-less timestamp is in the source's
# zone, up to 14 hours either side of UTC.
_SLACK = {True: timedelta(milliseconds=1), False: timedelta(hours=15)}
# The parts of a commit file's actions this module reads; the rest is left unparsed.
_ACTIONS = (
    "add STRUCT<path: STRING, partitionValues: MAP<STRING, STRING>, dataChange: BOOLEAN, "
    "stats: STRING, deletionVector: STRUCT<storageType: STRING>>, "
    "remove STRUCT<path: STRING, dataChange: BOOLEAN>, "
    "commitInfo STRUCT<operation: STRING>"
)


@dataclass(frozen=True)
class AddFile:
    """A file a commit added: its path as the log writes it (relative, URL-encoded), its
    statistics (JSON text, or None) and the version that added it."""

    path: str
    stats: str | None
    version: int


@dataclass
class Added:
    """What the commits after a version added: appended files (path -> AddFile), the
    versions that rewrote files, and whether the log still held every version."""

    appended: dict[str, AddFile] = field(default_factory=dict)
    rewrites: list[int] = field(default_factory=list)
    complete: bool = True


def commit_file(uri: str, version: int) -> str:
    return f"{uri.rstrip('/')}/_delta_log/{version:020d}.json"


def added_since(spark: SparkSession, uri: str, start: int, end: int) -> Added:
    """The data the commits ``start..end`` (inclusive) of the table at ``uri`` added."""
    added = Added()
    if end < start:
        return added
    try:
        actions = _actions(spark, uri, start, end)
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
            added.complete = False  # the log's retention dropped versions since the load
            return added
        raise
    for version in range(start, end + 1):
        _apply(added, version, actions.get(version, []))
    return added


def _actions(spark: SparkSession, uri: str, start: int, end: int) -> dict[int, list]:
    """The actions of each commit file ``start..end``, in file order, by version."""
    files = [commit_file(uri, v) for v in range(start, end + 1)]
    name = F.col("_metadata.file_name")
    rows = (
        spark.read.schema(_ACTIONS)
        .json(files)
        .select(
            F.regexp_extract(name, r"^(\d+)\.json$", 1).cast("long").alias("version"),
            "add",
            "remove",
            "commitInfo",
        )
        .filter("add IS NOT NULL OR remove IS NOT NULL OR commitInfo IS NOT NULL")
        .collect()
    )
    out: dict[int, list] = {}
    for row in rows:
        out.setdefault(int(row["version"]), []).append(row)
    return out


def _apply(added: Added, version: int, actions: list) -> None:
    adds, removes, operation = [], [], None
    for action in actions:
        if action["add"] is not None and action["add"]["dataChange"]:
            add = action["add"]
            adds.append(AddFile(add["path"], add["stats"], version))
        elif action["remove"] is not None and action["remove"]["dataChange"]:
            removes.append(action["remove"]["path"])
        elif action["commitInfo"] is not None:
            operation = action["commitInfo"]["operation"]
    if not removes:
        added.appended.update((a.path, a) for a in adds)
        return
    if operation != "DELETE":
        # Files appended earlier in the range stay read as appended (their files remain
        # until a VACUUM); the rewrite's own rows come from the change data feed.
        added.rewrites.append(version)
        return
    hit = [path for path in removes if added.appended.pop(path, None) is not None]
    if hit:
        # An appended file the DELETE rewrote (or marked with a deletion vector): its
        # remaining rows are in the files this commit added.
        added.appended.update((a.path, a) for a in adds)


def may_hold_below(add: AddFile, physical: str, cursor: object) -> bool:
    """Whether an added file's statistics allow a row whose ``physical`` column is at or
    below ``cursor`` (True without statistics)."""
    if not add.stats:
        return True
    low = json.loads(add.stats).get("minValues", {}).get(physical)
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
