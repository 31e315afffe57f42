"""What the commits of a Delta source added since a version, and a read of just those rows.

A Delta source's ledger is the source version each load read (engine/late_files.py). The
next run asks the source's log what the commits after that version added: it reads the
JSON commit files of those versions (``_delta_log/<version>.json``) through delta-rs's
object store, with the source's storage options (local disk, S3 and ADLS alike, as the
source's log is opened), never a data file and with no Spark job.

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

Reading the log needs no JVM: it runs the same way through Spark Connect, whose clients
have none.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from deltalake.fs import DeltaStorageHandler
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

# Names of late "files" that are a rewrite version's change data, not a data file.
CHANGE_DATA = "change-data@v"
_CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
# Statistics of time columns are milliseconds; a zone-less timestamp is in the source's
# zone, up to 14 hours either side of UTC.
_SLACK = {True: timedelta(milliseconds=1), False: timedelta(hours=15)}
# Commit files read at once.
_READERS = 8


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


def commit_file(version: int) -> str:
    """A commit file's path under the table's root."""
    return f"_delta_log/{version:020d}.json"


def added_since(root: str, storage: dict[str, str], start: int, end: int) -> Added:
    """The data the commits ``start..end`` (inclusive) of the table at ``root`` added."""
    added = Added()
    if end < start:
        return added
    store = DeltaStorageHandler(root.rstrip("/"), dict(storage) or None)

    def read(version: int) -> list[dict]:
        with store.open_input_stream(commit_file(version)) as commit:
            text = commit.read().decode("utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    versions = range(start, end + 1)
    try:
        # Many commits since a load (an object store answers each read in tens of ms):
        # read side by side, applied in order.
        with ThreadPoolExecutor(min(_READERS, len(versions))) as pool:
            commits = list(pool.map(read, versions))
    except FileNotFoundError:
        added.complete = False  # the log's retention dropped versions since the load
        return added
    for version, actions in zip(versions, commits, strict=True):
        _apply(added, version, actions)
    return added


def _apply(added: Added, version: int, actions: list[dict]) -> None:
    adds, removes, operation = [], [], None
    for action in actions:
        add, remove, info = action.get("add"), action.get("remove"), action.get("commitInfo")
        if add is not None and add.get("dataChange"):
            adds.append(AddFile(add["path"], add.get("stats"), version))
        elif remove is not None and remove.get("dataChange"):
            removes.append(remove["path"])
        elif info is not None:
            operation = info.get("operation")
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
