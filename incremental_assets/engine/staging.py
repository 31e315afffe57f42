"""A table's staging root and its runs' folders, on the warehouse's own file system.

Every run of a table stages under the table's staging root (``<target>__staging``, or
``<staging_dir>/<table>__staging`` when the warehouse resource sets ``staging_dir``), in a folder of
its own, written and read by Spark through Hadoop paths, so executors on other machines
and a warehouse on an object store (``s3a://``, ``abfss://``) see the same files as the
driver. Nothing is staged on the driver's disk.

The root is emptied by Spark when a run ends or fails: an empty overwrite, so no
``os``/``shutil`` call and no JVM handle is needed (Spark Connect has none). A run killed
outright (SIGKILL, a lost driver) cannot empty it, and an interrupted one (Ctrl-C, Dagster's
terminate) leaves it; the next run of the table empties it as it ends (its own folder is
new, so what was left is never read, but for a dead run's claim to create the table:
``claim``). The table's pool runs one run at a time; a stray run alongside would find its
staged files gone when the other ends and fail before it commits.

Example:
    >>> with run_folder(spark, root_of("orders", "/wh/orders")) as folder:  # doctest: +SKIP
    ...     increment.write.parquet(f"{folder}/increment")
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import date

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from incremental_assets.engine.delta_lake.io import spark_uri
from incremental_assets.engine.processes import Identity, identity_alive
from incremental_assets.engine.spark.failures import is_spark_failure
from incremental_assets.specs.locations import staging_location


def root_of(table: str, target_path: str, staging_dir: str | None = None) -> str:
    """The table's staging root as Spark names it: ``<target>__staging`` beside the target
    (the specs check that no other table reads or writes there, specs/locations.py), or
    ``<staging_dir>/<table>__staging``: never ``<staging_dir>/<table>``, which is the
    table's own target when ``staging_dir`` is the warehouse root (emptying the staging
    root would then overwrite the target)."""
    if staging_dir:
        return staging_location(f"{spark_uri(staging_dir).rstrip('/')}/{table}")
    return spark_uri(staging_location(target_path))


def clear(spark: SparkSession, root: str) -> None:
    """Empty ``root`` through Spark: an overwrite with no rows replaces whatever it held
    (run folders of earlier runs, killed or not) with one empty file. Hadoop's committer
    marker is not written, so that empty file is all that stays. The empty rows are made in
    the JVM (``range(0)``): rows from a Python list would start a Python worker, 0.3-0.4 s
    of the 0.4-0.5 s this took per run."""
    (
        spark.range(0)
        .select(F.lit("").alias("value"))
        .write.mode("overwrite")
        .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        .text(root)
    )


def empty(spark: SparkSession, path: str) -> None:
    """Empty the folder at ``path`` through Spark, leaving nothing in it: an overwrite
    with no rows, partitioned by a column, so that Spark writes no file at all (``clear``
    leaves one empty file). Static, whatever the session's partition overwrite mode: a
    dynamic overwrite with no rows would replace nothing."""
    (
        spark.range(0)
        .select(F.lit("").alias("value"), F.lit(0).alias("empty"))
        .write.mode("overwrite")
        .option("partitionOverwriteMode", "static")
        .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        .partitionBy("empty")
        .text(path)
    )


# A run about to create its table records the table's location in its run folder, with
# who it is: if the run is killed during that write, the next run knows whose the files left
# there are, and whether that run is over.
_CLAIM = "creates"


@dataclass(frozen=True)
class Claim:
    """A run's claim to create the table at ``location``: its Dagster run (``run_id``), the
    process that ran it (``process``; None when the claim does not say: an older version's
    claim, or one this version cannot read) and whether it wrote through a Spark Connect
    server (``remote``)."""

    location: str
    run_id: str = ""
    process: Identity | None = None
    remote: bool = False

    def line(self) -> str:
        """The claim as one line of JSON (``parse`` reads it back)."""
        found = {"location": self.location, "run_id": self.run_id, "remote": self.remote}
        return json.dumps(found | (asdict(self.process) if self.process else {}))

    @classmethod
    def parse(cls, line: str) -> Claim:
        """A claim as ``line`` wrote it; a line that is not one is a claim of that location
        by no process named (claims once held only the location)."""
        try:
            found = json.loads(line)
        except ValueError:
            return cls(location=line)
        if not isinstance(found, dict) or not isinstance(found.get("location"), str):
            return cls(location=line)
        kinds = {"process": str, "boot": str, "pid_space": str, "started": int}
        named = {k: found.get(k) for k in kinds}
        process = None
        if all(type(named[k]) is kind for k, kind in kinds.items()) and named["process"]:
            process = Identity(**named)
        run_id, remote = found.get("run_id"), found.get("remote")
        return cls(
            found["location"],
            run_id if isinstance(run_id, str) else "",
            process,
            remote if isinstance(remote, bool) else True,  # unreadable: the careful reading
        )

    def unfinished(self) -> str | None:
        """Why the claiming run's write may still be going on (None: it is over, its
        process gone from this host)."""
        if self.process is None:
            return "a claim that names no process (an older version's, or unreadable) made it"
        who = f"run {self.run_id or '(not recorded)'} (process {self.process.process})"
        if self.remote:
            # A Connect server goes on with a write whose client is gone, until it drops
            # executions no client is attached to (spark.connect.execute.manager.
            # detachedTimeout, 5 min by default, counted from when the client went): when
            # that was cannot be told from here.
            return (
                f"{who} claimed it through a Spark Connect server, which may go on with its "
                "write after the client is gone"
            )
        alive = identity_alive(self.process)
        if alive is None:
            return f"{who} claimed it, on another host, boot or container: not checked from here"
        if alive:
            return f"{who} claimed it and is still running"
        return None


def claim(spark: SparkSession, staged_path: str, claimed: Claim) -> None:
    """Record ``claimed`` in the run folder holding ``staged_path``: this run is about to
    create the table at its location (one row of text, made in the JVM)."""
    folder = staged_path.rstrip("/").rsplit("/", 1)[0]
    (
        spark.range(1)
        .select(F.lit(claimed.line()).alias("value"))
        .write.mode("overwrite")
        .option("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
        .text(f"{folder}/{_CLAIM}")
    )


def claims(spark: SparkSession, staged_path: str, location: str) -> list[Claim]:
    """The claims to create the table at ``location`` (``claim``) that earlier runs of the
    table left in the staging root of ``staged_path``: a run that ends empties the root, so
    these runs were killed, or are still running."""
    root = staged_path.rstrip("/").rsplit("/", 2)[0]
    try:
        lines = spark.read.text(f"{root}/*/{_CLAIM}").collect()
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
            return []
        raise
    found = [Claim.parse(row.value) for row in lines if row.value]
    return [c for c in found if c.location == location]


@contextmanager
def run_folder(spark: SparkSession, root: str, kind: str = "") -> Iterator[str]:
    """A new folder ``<root>/[<kind>-]<id>`` for one run. The root is cleared on exit,
    whether the block ends or fails (not when it is interrupted), which also removes what
    a killed run left: not on entry too, which would cost every run one more Spark job to
    find, most often, nothing."""
    folder = f"{root}/{kind + '-' if kind else ''}{uuid.uuid4().hex[:12]}"
    try:
        yield folder
    except Exception as exc:
        # The run's own error is the one to report, even if Spark cannot clear now (the
        # next run clears what is left). A run refused for another run's unfinished first
        # load leaves that run's claim (errors.FirstLoadUnfinishedError).
        if not getattr(exc, "keeps_staging", False):
            with suppress(Exception):
                clear(spark, root)
        raise
    # Interrupted (Ctrl-C, Dagster's terminate: not an Exception), the folder is left as a
    # kill leaves it: Spark may still be running the run's write until the process ends,
    # and the run's claim (``claim``) is what lets the next run remove that write's files.
    clear(spark, root)


# The schema of each folder this process staged, the newest few: a read of the folder
# names it rather than have Spark infer it from the files' footers, a job of its own.
_WRITTEN: OrderedDict[str, StructType] = OrderedDict()
_KEPT = 256
_WRITTEN_LOCK = threading.Lock()


def written(rows: DataFrame, path: str) -> None:
    """Remember that ``rows`` were just written to ``path`` (Parquet), for ``read``."""
    schema = rows.schema
    with _WRITTEN_LOCK:  # runs of other tables may stage from other threads
        _WRITTEN.pop(path, None)
        _WRITTEN[path] = schema
        while len(_WRITTEN) > _KEPT:
            _WRITTEN.popitem(last=False)


def read(spark: SparkSession, path: str) -> DataFrame:
    """The rows staged at ``path``: with the schema they were written with when this
    process wrote them (``written``), else as Spark infers it from the files."""
    schema = _WRITTEN.get(path)
    return (spark.read if schema is None else spark.read.schema(schema)).parquet(path)


def write_counted(rows: DataFrame, path: str, *counters: Column) -> dict:
    """Write ``rows`` to ``path`` (Parquet, replacing it) and return what was counted as
    they were written: ``rows``, and each of ``counters`` by its alias (a number, 0 when
    there was nothing to count, or a text, date or list as counted). No second pass over
    the written files: the counts are the write's own."""
    observation = Observation(f"written_{uuid.uuid4().hex}")
    counted = rows.observe(observation, F.count(F.lit(1)).alias("rows"), *counters)
    counted.write.mode("overwrite").parquet(path)
    written(rows, path)
    return observed_counts(observation)


def bytes_per_row(spark: SparkSession, path: str, rows: int) -> float | None:
    """The bytes a row of the ``rows`` staged at ``path`` takes: their Parquet files' sizes
    (listed by Spark's ``binaryFile`` source, whose content column is never read) over
    ``rows``. None when no row was staged."""
    if rows <= 0:
        return None
    listed = (
        spark.read.format("binaryFile")
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.parquet")
        .load(path)
    )
    size = listed.select(F.sum("length")).first()[0]
    return int(size) / rows if size else None


def sampled_bytes_per_row(spark: SparkSession, sample: DataFrame, path: str) -> float | None:
    """The bytes a row of ``sample`` (a few of a source's rows, ``Source.sample``) takes
    as Parquet: written to ``path`` by Spark's own writer, as the table's files will be,
    then sized as ``bytes_per_row`` sizes staged rows. None when it holds no row, and when
    Spark fails to read it (a file gone since the listing: an estimate is not worth a
    failed run, and the run's own read says what is wrong, if anything is)."""
    try:
        rows = write_counted(sample, path)["rows"]
        return bytes_per_row(spark, path, rows)
    except Exception as exc:
        if not is_spark_failure(exc):
            raise
        return None


def observed_counts(observation: Observation) -> dict:
    """What a write counted (``observation``'s values): numbers as ints (0 for nothing
    counted), texts, dates and lists (a histogram's bins) as they were counted."""
    found = dict(observation.get)
    return {
        k: v if isinstance(v, (str, list)) or type(v) is date else int(v or 0)
        for k, v in found.items()
    }


@contextmanager
def vanished_as(folder: str, error: Callable[[str], Exception]) -> Iterator[None]:
    """Turn a failure to read this run's staged files because they are gone into
    ``error(detail)``: another run of the table ran meanwhile and emptied the staging root
    as it ended (a table's pool runs one at a time; this is the stray second run), so nothing of
    this run is committed."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        missing = any(m in text for m in ("PATH_NOT_FOUND", "FileNotFound", "does not exist"))
        if not (missing and folder.split("://")[-1] in text):
            raise
        detail = "another run of this table ran meanwhile and emptied its staging folder"
        raise error(detail) from None
