"""Landing-zone files into an append-only bronze Delta table, each file version once.

A file is identified by its path and version (size and modification time): a file
rewritten in place is a new version and is loaded again; the rows of both versions stay
in bronze, tagged, and a layer after it keeps the newest version of each file (a row
layer's ``newest.replaces: [_ia_source_file]``; ``newest_versions`` in Python).

Exactly once:

1. Every bronze row carries its key (file path, file version, row number in the file), and
   rows are merged insert-if-absent on that key: loading a file version twice, after a
   crash or by two racing runs, adds nothing the second time.
2. The commit that adds a file's rows lists the file in its commit metadata
   (``incremental_assets.files``): the set of loaded files is committed with the data.
3. A sibling Delta table ``<target>__files`` indexes loaded and quarantined files, so a
   run lists the folder without re-reading old files. It is written after the bronze
   commit and is only a cache: a run first adds the files of bronze commits newer than
   the index (step 2), and a file missing from both is merely read again (step 1).

Files still being written are skipped until their modification time is ``settle`` old
(and, with ``marker``, until ``<file><marker>`` exists). A malformed file (a line that does
not parse against the schema, an unreadable Parquet footer) is moved to the quarantine
folder with ``<file>.reason.txt`` and does not stop the other files.

Before anything is read, ``landing_schema`` compares the pending files' columns with the
table's: a new column is added (or fails the run, per ``on_schema_change``), a changed type
fails the run; a failed run commits nothing to bronze or the index.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import BinaryIO
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from incremental_assets.engine import staging
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.commits import SOURCE_IDENTITY
from incremental_assets.engine.delta_lake.store import CommitResult, DeltaTarget, SideTable
from incremental_assets.engine.disk_full import naming_full_disks
from incremental_assets.engine.errors import LandingListError, SourceNotFoundError
from incremental_assets.engine.faults import crash_point
from incremental_assets.engine.landing_folder import (
    LandedFile,
    LandingFolder,
    spark_path,
)
from incremental_assets.engine.landing_schema import Opener, csv_header, read_schema
from incremental_assets.engine.load.interpreted import interpreted, is_small, table_bytes
from incremental_assets.engine.load.result import LoadResult
from incremental_assets.engine.load.upkeep import after_load
from incremental_assets.engine.sources import source_class
from incremental_assets.engine.sources.identity import check_unchanged
from incremental_assets.engine.spark.local_rows import local_rows
from incremental_assets.engine.strategies.append import append_plan
from incremental_assets.engine.transforms import quote
from incremental_assets.engine.windows import LoadRequest
from incremental_assets.specs import TableSpec
from incremental_assets.specs.landing import (
    FILE_KEYS,
    FILE_ROW,
    FILE_VERSION,
    INGESTED_AT,
    SOURCE_FILE,
    LandingSpec,
    quarantine_folder,
)

CORRUPT = "_ia_corrupt_record"
# The files a landing run loads: the path Spark read, the listed path, the version.
_CHOSEN = pa.schema([("_f_path", pa.string()), ("_p", pa.string()), ("_v", pa.string())])


@dataclass(frozen=True)
class Listing:
    ready: list[LandedFile]
    waiting: list[LandedFile]


@dataclass(frozen=True)
class LandingReport:
    """What a landing run did with the files it saw."""

    files_seen: int
    files_loaded: list[LandedFile] = field(default_factory=list)
    files_already_loaded: int = 0
    files_waiting: int = 0
    files_changed_while_read: int = 0
    quarantined: dict[str, str] = field(default_factory=dict)
    """Original path -> reason, for the files moved to the quarantine this run."""
    rows_read: int = 0
    commit: CommitResult | None = None
    # Whether its queries ran without code generation (engine/load/interpreted.py).
    interpreted: bool = False


def quarantine_dir(source_path: str, landing: LandingSpec) -> str:
    # One rule for the spec's storage check and the run (specs/landing.py).
    return quarantine_folder(source_path, landing)


def list_files(
    source_path: str,
    landing: LandingSpec,
    now: datetime | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> Listing:
    """The files under ``source_path`` (names starting with '.' or '_' are skipped, as
    Spark does), split into ready ones and ones still settling or missing their marker.

    Raises:
        LandingListError: an object-store folder could not be listed.
    """
    now = now or datetime.now(timezone.utc)
    limit_ns = int((now - landing.settle).timestamp() * 1e9)
    # A quarantine folder inside the landing folder is never read as input.
    folder = LandingFolder(source_path, storage_options)
    entries = folder.entries(skip=quarantine_dir(source_path, landing))
    names = {path for path, _, _ in entries}
    ready, waiting = [], []
    for path, size, mtime_ns in entries:
        name = path.rsplit("/", 1)[-1]
        if landing.marker and name.endswith(landing.marker):
            continue
        if landing.pattern and not fnmatch.fnmatch(name, landing.pattern):
            continue
        if name.endswith(".reason.txt"):
            continue
        landed = LandedFile(path, size, mtime_ns)
        marked = not landing.marker or f"{path}{landing.marker}" in names
        (ready if marked and mtime_ns <= limit_ns else waiting).append(landed)
    return Listing(sorted(ready), sorted(waiting))


class FileIndex(SideTable):
    """Loaded and quarantined file versions in ``<target>__files`` (a cache; see the module
    docstring): one row per file version, with the bronze version that holds it."""

    SCHEMA = pa.schema(
        [
            ("path", pa.string()),
            ("version", pa.string()),
            ("size", pa.int64()),
            ("mtime_ns", pa.int64()),
            ("status", pa.string()),
            ("rows", pa.int64()),
            ("bronze_version", pa.int64()),
            ("reason", pa.string()),
            ("recorded_at", pa.timestamp("us", tz="UTC")),
        ]
    )

    SUFFIX = "files"

    def read(self) -> pa.Table:
        if not self.location.exists():
            return self.SCHEMA.empty_table()
        return self.location.open().to_pyarrow_table(
            columns=["path", "version", "status", "bronze_version"]
        )

    def known(self) -> set[tuple[str, str]]:
        table = self.read()
        return set(zip(table["path"].to_pylist(), table["version"].to_pylist(), strict=True))

    def indexed_bronze_version(self) -> int:
        table = self.read()
        if table.num_rows == 0:
            return -1
        value = pc.max(table["bronze_version"]).as_py()
        return -1 if value is None else int(value)

    def record(self, spark: SparkSession, rows: list[dict]) -> None:
        if not rows:
            return
        now = datetime.now(timezone.utc)
        table = pa.Table.from_pylist([{**r, "recorded_at": now} for r in rows], self.SCHEMA)
        entries = spark.createDataFrame(table, from_arrow_schema(self.SCHEMA))
        self.insert_missing(entries, ["path", "version"])


def loaded_files(target: DeltaTarget, spark: SparkSession | None = None) -> set[tuple[str, str]]:
    """File versions already in bronze or quarantined: the index, completed from the bronze
    commits it has not caught up with (their metadata lists the files they added), which
    are then recorded in the index, given ``spark`` (without it, as for a reader of another
    layer, nothing is written)."""
    index = FileIndex(target)
    known = index.known()
    if not target.exists():
        return known
    table = target.open()
    behind = table.version() - index.indexed_bronze_version()
    if behind <= 0:
        return known
    missed = []
    for load in target.loads(table, limit=behind):
        for path, version, rows in json.loads(load.get("files") or "[]"):
            known.add((path, version))
            size, mtime = (int(v) for v in version.split("-"))
            missed.append(_index_row(LandedFile(path, size, mtime), "loaded", rows, load))
    if spark is not None:
        index.record(spark, missed)
    return known


def _index_row(file: LandedFile, status: str, rows: int, load: Mapping | None, reason=""):
    return {
        "path": file.path,
        "version": file.version,
        "size": file.size,
        "mtime_ns": file.mtime_ns,
        "status": status,
        "rows": rows,
        "bronze_version": int(load["version"]) if load else -1,
        "reason": reason,
    }


def pending_files(
    spec: TableSpec,
    target: DeltaTarget,
    now: datetime | None = None,
    spark: SparkSession | None = None,
):
    """Ready files not yet loaded or quarantined, and the listing they came from
    (``spark``: see ``loaded_files``; without it nothing is written).

    Raises:
        SourceNotFoundError: an object-store folder could not be listed.
    """
    landing, folder = _landing(spec), str(spec.source.path)
    try:
        listing = list_files(folder, landing, now, target.storage_options)
    except LandingListError as exc:
        raise SourceNotFoundError(
            spec.name,
            f"landing folder {folder} could not be listed: {exc}.",
            "check the bucket or container in source.path and the warehouse's storage "
            "settings (credentials, region, endpoint)",
        ) from exc
    known = loaded_files(target, spark)
    return [f for f in listing.ready if f.identity not in known], listing


def load_landing(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    *,
    run_id: str = "manual",
    partition_label: str = "",
    staging_dir: str | None = None,
    now: datetime | None = None,
) -> LandingReport:
    """Load the landing folder's new file versions into ``target`` (bronze), exactly once.

    Raises:
        SourceNotFoundError: the landing folder does not exist, or cannot be listed.
        SourceSwitchedError: the table was loaded from another folder or format.
    """
    identity = _checked_identity(spec, target)
    source_path = str(spec.source.path)
    folder = LandingFolder(source_path, target.storage_options)
    if not folder.exists():
        raise SourceNotFoundError(
            spec.name,
            f"landing folder {source_path} does not exist.",
            "create it, or correct source.path in the table spec",
        )
    landing = _landing(spec)
    if target.exists():
        # Before anything is read or indexed: bronze must be a Delta table this table wrote.
        target.state("timestamp")
    started = now or datetime.now(timezone.utc)
    pending, listing = pending_files(spec, target, started, spark)
    already = len(listing.ready) - len(pending)
    if not pending:
        return LandingReport(len(listing.ready), [], already, len(listing.waiting))

    root = staging.root_of(spec.name, target.path, staging_dir)
    small = is_small(
        sum(f.size for f in pending),
        lambda: table_bytes(target.open() if target.exists() else None),
    )
    with (
        staging.run_folder(spark, root) as stage_root,
        interpreted(spark, small) as ran_interpreted,
    ):
        # Files are read in place, by Spark's connector when the warehouse is on an object
        # store too; into a local warehouse an object store's new files are copied first.
        direct = not folder.remote or "://" in stage_root
        if direct:
            local, moved = folder.spark_paths(pending), []
        else:
            local, moved = folder.local_copies(pending, f"{stage_root}/files")
        opened = {read: path for path, read in local.items()}

        def opener(read: str) -> BinaryIO:
            return folder.open_binary(opened[read]) if direct else open(read, "rb")

        quarantined: dict[str, str] = {}
        readable = [f for f in pending if f.path in local]
        if spec.source.format == "parquet":
            readable, quarantined = _unreadable_parquet(readable, local, opener)
        raw_path = f"{stage_root}/raw"
        stats: dict[str, dict] = {}
        if readable:
            # Before any read: a type change, or a new column under 'fail', stops the run.
            bronze = delta_io.spark_schema(target.open()) if target.exists() else None
            paths = {local[f.path]: f.path for f in readable}
            schema = read_schema(
                spark, spec, bronze, list(paths), names=paths, read_by=target.read_by, opener=opener
            )
            rows = _read(spark, spec, readable, schema, local, opener)
            rows.write.mode("overwrite").parquet(raw_path)
            staging.written(rows, raw_path)
            stats = _file_stats(spark, raw_path)
        good, changed = [], len(moved)
        for file in readable:
            stat = stats.get(local[file.path])
            if stat is None:
                good.append((file, 0))  # an empty file: nothing to load, but it is seen
            elif stat["corrupt"]:
                quarantined[file.path] = (
                    f"{stat['corrupt']} of {stat['rows']} rows do not match source.schema; "
                    f"first: {stat['example'][:300]!r}"
                )
            elif stat["size"] != file.size or _moved_on(stat["mtime_ms"], file, folder.remote):
                changed += 1  # rewritten while read: the next run reads the new version
            else:
                good.append((file, stat["rows"]))
        loaded = [f for f, _ in good]
        increment_path = f"{stage_root}/increment"
        rows_read, commit = 0, None
        if any(n for _, n in good):
            rows_read = _stage_increment(spark, raw_path, loaded, local, started, increment_path)
            metadata = _files_metadata(good, run_id, partition_label, identity)
            commit = _commit(spark, spec, target, increment_path, metadata, rows_read)
        elif good and target.exists():
            # Versions without rows (a file rewritten empty): a commit that only lists
            # them, so silver drops the lines of their earlier versions.
            commit = target.record(spark, _files_metadata(good, run_id, partition_label, identity))
        crash_point("after_commit")
        load = {"version": commit.version} if commit and commit.version is not None else None
        FileIndex(target).record(
            spark,
            [_index_row(f, "loaded", n, load) for f, n in good]
            + [
                _index_row(f, "quarantined", 0, None, quarantined[f.path])
                for f in pending
                if f.path in quarantined
            ],
        )
        for path, reason in quarantined.items():
            folder.quarantine(path, quarantine_dir(source_path, landing), reason)
    return LandingReport(
        files_seen=len(listing.ready),
        files_loaded=loaded,
        files_already_loaded=already,
        files_waiting=len(listing.waiting),
        files_changed_while_read=changed,
        quarantined=quarantined,
        rows_read=rows_read,
        commit=commit,
        interpreted=ran_interpreted,
    )


def _checked_identity(spec: TableSpec, target: DeltaTarget) -> str:
    """The landing folder's identity (its format and location), refused before anything
    is written, the file index included, when bronze was loaded from another one."""
    kind = source_class(spec.name, spec.source)
    identity = kind.identity_of(spec.source)
    if target.exists():
        state = target.state("timestamp")
        check_unchanged(
            spec.name,
            state.source_identity,
            state.source_identity_version,
            identity,
            fields=kind.identity_fields,
            rewindable=False,
        )
    return identity


def _landing(spec: TableSpec) -> LandingSpec:
    landing = spec.source.landing
    assert landing is not None, f"{spec.name} is not a landing table"
    return landing


def _moved_on(read_mtime_ms: int, file: LandedFile, remote: bool) -> bool:
    """Whether a file's modification time when read differs from its listing's: to the
    second for an object (Spark's connector asks with a HEAD, which gives whole seconds
    where a listing may give milliseconds)."""
    if remote:
        return read_mtime_ms // 1000 != file.mtime_ns // 10**9
    return read_mtime_ms != file.mtime_ns // 1_000_000


def _unreadable_parquet(
    files: list[LandedFile], local: Mapping[str, str], opener: Opener
) -> tuple[list[LandedFile], dict[str, str]]:
    good, bad = [], {}
    for file in files:
        try:
            pq.read_metadata(opener(local[file.path]))
            good.append(file)
        except Exception as exc:
            bad[file.path] = f"not a readable Parquet file: {exc}"
    return good, bad


def _read(
    spark: SparkSession,
    spec: TableSpec,
    files: list[LandedFile],
    schema: StructType,
    local: Mapping[str, str],
    opener: Opener | None = None,
) -> DataFrame:
    """The files' rows (read with ``schema``, see ``landing_schema``) with their file, size,
    modification time and row number, and for JSON/CSV the raw text of rows that do not
    parse against the schema."""
    source = spec.source
    reader = spark.read.format(source.format).options(**dict(source.options))
    corrupt = StructField(CORRUPT, StringType(), True)
    if source.format == "csv":
        reader = reader.option("header", source.options.get("header", "true"))
    if source.format in ("json", "csv"):
        reader = reader.options(mode="PERMISSIVE", columnNameOfCorruptRecord=CORRUPT)
    groups: dict[tuple[str, ...] | None, list[str]] = {}
    for file in files:
        # CSV columns are positional and a short row is malformed: files are read per
        # header, each with its own columns, then lined up by name (missing ones null).
        path = local[file.path]
        header = csv_header(spec, path, opener) if source.format == "csv" else None
        groups.setdefault(tuple(header) if header else None, []).append(path)
    frames = []
    for header, paths in groups.items():
        fields = schema.fields if header is None else [schema[n] for n in header]
        extra = [corrupt] if source.format in ("json", "csv") else []
        df = reader.schema(StructType([*fields, *extra])).load([spark_path(p) for p in paths])
        if CORRUPT not in df.columns:
            df = df.withColumn(CORRUPT, F.lit(None).cast("string"))
        frames.append(
            df.withColumn("_f_path", F.col("_metadata.file_path"))
            .withColumn("_f_size", F.col("_metadata.file_size"))
            .withColumn("_f_mtime_ms", F.unix_millis(F.col("_metadata.file_modification_time")))
            .withColumn("_f_start", F.col("_metadata.file_block_start"))
            .withColumn("_f_pos", F.monotonically_increasing_id())
        )
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other, allowMissingColumns=True)
    # Splits of one file are ordered by their offset, rows within a split by position.
    order = Window.partitionBy("_f_path").orderBy("_f_start", "_f_pos")
    return df.withColumn(FILE_ROW, F.row_number().over(order).cast("long")).drop(
        "_f_start", "_f_pos"
    )


def _local_path(uri: str) -> str:
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    elif uri.startswith("file:"):
        uri = uri[len("file:") :]
    return unquote(uri)


def _file_stats(spark: SparkSession, raw_path: str) -> dict[str, dict]:
    """Per file (by the path read): rows, corrupt rows with one example, size and mtime as
    Spark read them, aggregated by Spark from the staged rows (one row per file reaches
    the driver)."""
    grouped = (
        staging.read(spark, raw_path)
        .groupBy("_f_path")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.count(CORRUPT).alias("corrupt"),
            F.min(CORRUPT).alias("example"),
            F.max("_f_size").alias("size"),
            F.max("_f_mtime_ms").alias("mtime_ms"),
        )
    )
    return {
        _local_path(row["_f_path"]): {
            "rows": int(row["rows"]),
            "corrupt": int(row["corrupt"]),
            "example": row["example"] or "",
            "size": int(row["size"]),
            "mtime_ms": int(row["mtime_ms"]),
        }
        for row in grouped.collect()
    }


def _stage_increment(
    spark: SparkSession,
    raw_path: str,
    files: list[LandedFile],
    local: Mapping[str, str],
    ingested_at: datetime,
    increment_path: str,
) -> int:
    """The good files' rows, keyed (file, version, row) and stamped with the ingestion time;
    the file identity comes from the listing, joined on the path Spark read."""
    raw = staging.read(spark, raw_path)
    uris = raw.select("_f_path").distinct().collect()
    by_local = {_local_path(r["_f_path"]): r["_f_path"] for r in uris}
    names = [
        {"_f_path": by_local[local[f.path]], "_p": f.path, "_v": f.version}
        for f in files
        if local[f.path] in by_local
    ] or [{"_f_path": "", "_p": "", "_v": ""}]
    chosen = local_rows(spark, names, _CHOSEN)
    data = [c for c in raw.columns if not c.startswith("_f_") and c not in (CORRUPT, FILE_ROW)]
    # Microseconds, not a datetime literal: PySpark reads naive datetimes in local time.
    stamp = F.timestamp_micros(F.lit(int(ingested_at.timestamp() * 1_000_000)))
    increment = raw.join(F.broadcast(chosen), "_f_path").select(
        F.col("_p").alias(SOURCE_FILE),
        F.col("_v").alias(FILE_VERSION),
        F.col(FILE_ROW),
        stamp.alias(INGESTED_AT),
        *[F.col(quote(c)) for c in data],
    )
    return staging.write_counted(increment, increment_path)["rows"]


def _commit(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    increment_path: str,
    metadata: dict,
    staged_rows: int,
) -> CommitResult:
    """Merge the rows insert-if-absent on (file, version, row), listing the files (those
    without rows too) in the same commit's metadata."""
    state = target.state("timestamp")
    return target.commit(
        spark,
        state,
        increment_path,
        append_plan(list(FILE_KEYS), INGESTED_AT),
        cursor_before=None,
        cursor_after=None,
        metadata=metadata,
        partition_by=list(spec.target.partition_by),
        # The read schema passed landing_schema's checks: a column bronze lacks is one the
        # spec declares or on_schema_change allows.
        add_new_columns=True,
        staged_rows=staged_rows,
        deletion_vectors=spec.target.deletion_vectors,
        file_bytes=spec.target.file_size,
    )


def _files_metadata(
    good: list[tuple[LandedFile, int]], run_id: str, partition_label: str, identity: str
) -> dict:
    return {
        "run_id": run_id,
        "partition": partition_label,
        "mode": "landing",
        "files": [[f.path, f.version, n] for f, n in good],
        "files_loaded": len(good),
        SOURCE_IDENTITY: identity,
    }


def newest_versions(bronze: DataFrame) -> DataFrame:
    """Bronze rows of the newest loaded version of each file: what silver reads, so a file
    rewritten in place replaces its earlier rows instead of adding to them."""
    newest = Window.partitionBy(SOURCE_FILE)
    return (
        bronze.withColumn("_newest", F.max(INGESTED_AT).over(newest))
        .filter(F.col(INGESTED_AT) == F.col("_newest"))
        .drop("_newest")
    )


def run_landing_load(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    request: LoadRequest,
    staging_dir: str | None = None,
) -> LoadResult:
    """``run_load`` for a landing table: every pending file whatever the partition (the
    partition labels the run; bronze rows are cut by ingestion time). A full disk is a
    DiskFullError, as in ``run_load``."""
    started = time.perf_counter()
    clock = datetime.now(timezone.utc)
    target.check_catalog(spark)
    staging_root = staging.root_of(spec.name, target.path, staging_dir)
    with naming_full_disks(spark, spec.name, target.path, staging_dir or staging_root):
        report = load_landing(
            spark,
            spec,
            target,
            run_id=request.run_id,
            partition_label=request.partition_label,
            staging_dir=staging_dir,
            now=clock,
        )
    commit = report.commit
    committed = bool(commit and commit.committed)
    purge = compaction = None
    seconds = {}
    if committed and (spec.target.purge_after or spec.target.compact_after):
        assert commit is not None
        compacting = time.perf_counter()
        purge, compaction = after_load(spark, target, spec.target, commit.version)
        seconds["compact"] = round(time.perf_counter() - compacting, 3)
    return LoadResult(
        table=spec.name,
        mode="landing",
        window=f"{len(report.files_loaded)} new file versions of {report.files_seen} ready",
        cursor_before=None,
        cursor_after=None,
        high_water=None,
        rows_extracted=report.rows_read,
        rows_staged=report.rows_read,
        rows_inserted=commit.rows_inserted if commit else 0,
        rows_updated=0,
        rows_deleted=0,
        committed=committed,
        delta_version=commit.version if commit else target.state("timestamp").version,
        lag_seconds=None,
        phase_seconds={**seconds, "total": round(time.perf_counter() - started, 3)},
        files_added=commit.files_added if commit else 0,
        source=f"{spec.source.format} landing folder {spec.source.path}",
        landing=report,
        interpreted=report.interpreted,
    ).with_upkeep(purge, compaction)
