"""Verifications of a target table, for asset checks: plain functions over Spark and the
Delta log."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

from incremental_assets.engine import delta_io
from incremental_assets.engine.delta_store import DeltaTarget, row_count
from incremental_assets.engine.predicates import Range
from incremental_assets.engine.transforms import quote
from incremental_assets.engine.watermarks import WatermarkKind, parse_value

# Commits of the Delta log the watermark check reads (newest first): its cost stays flat as
# the history grows.
_HISTORY = 200


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    description: str
    metadata: dict[str, object] = field(default_factory=dict)


def keys_unique(
    spark: SparkSession,
    target: DeltaTarget,
    keys: Sequence[str],
    written_by: int | None = None,
) -> CheckOutcome:
    """No key appears twice in the target (reads only the key columns).

    With ``written_by`` (a Delta version) only a duplicate that commit could have made is
    looked for: keys of the files it added, against the files whose key statistics overlap
    them. The cost then follows the increment, not the table.
    """
    if not target.exists():
        return CheckOutcome(True, "target does not exist yet", {"duplicate_keys": 0})
    table = target.open()
    selected, scope = _files_of_keys_written(target, table, keys[0], written_by)
    df = delta_io.read_files(spark, table, selected).select(*[F.col(quote(k)) for k in keys])
    dupes = df.groupBy(*df.columns).count().filter(F.col("count") > 1)
    count = dupes.count()
    sample = [str(tuple(r[k] for k in keys)) for r in dupes.limit(5).collect()] if count else []
    description = (
        f"every key is unique ({scope})"
        if not count
        else f"{count} keys appear more than once ({scope})"
    )
    return CheckOutcome(
        count == 0,
        description,
        {"duplicate_keys": count, "sample": ", ".join(sample), "scope": scope},
    )


def _files_of_keys_written(
    target: DeltaTarget, table, key: str, written_by: int | None
) -> tuple[list[dict] | None, str]:
    """The live files whose ``key`` range overlaps the files version ``written_by`` added
    (None: every file), and a description of that scope."""
    files = delta_io.live_files(table)
    if written_by:
        before = set(delta_io.live_files(target.open(written_by - 1)).column("path").to_pylist())
        at_version = delta_io.live_files(target.open(written_by)).to_pylist()
        added = [row for row in at_version if row["path"] not in before]
        lows = [row.get(f"min.{key}") for row in added]
        highs = [row.get(f"max.{key}") for row in added]
        if added and None not in lows + highs:
            key_range = Range(key, min(lows), True, max(highs), True)
            selected = delta_io.prune_files(files, [(key_range,)])
            scope = f"{len(selected)} of {files.num_rows} files (keys written by v{written_by})"
            return selected, scope
    return None, f"all {files.num_rows} files"


def history_consistent(
    spark: SparkSession,
    target: DeltaTarget,
    keys: Sequence[str],
    valid_from: str,
    valid_to: str,
    is_current: str,
    written_by: int | None = None,
) -> CheckOutcome:
    """A history table's versions of each key follow one another without overlap: each
    version ends at or before the next one starts, only the last may be open, and
    ``is_current`` is true exactly for an open version (scoped like ``keys_unique``)."""
    if not target.exists():
        return CheckOutcome(True, "target does not exist yet", {"inconsistent_keys": 0})
    table = target.open()
    selected, scope = _files_of_keys_written(target, table, keys[0], written_by)
    start, end, current = (F.col(quote(c)) for c in (valid_from, valid_to, is_current))
    by_start = Window.partitionBy(*[F.col(quote(k)) for k in keys]).orderBy(start)
    following = F.lead(start).over(by_start)
    versions = delta_io.read_files(spark, table, selected).select(*keys, start, end, current)
    broken = (
        (following.isNotNull() & (end.isNull() | (end > following)))
        | (end.isNotNull() & (end <= start))
        | (current != end.isNull())
    )
    bad = versions.withColumn("_ia_broken", broken).filter("_ia_broken").select(*keys).distinct()
    count = bad.count()
    sample = [str(tuple(r)) for r in bad.limit(5).collect()] if count else []
    description = (
        f"versions of every key follow one another ({scope})"
        if not count
        else f"{count} keys have overlapping or inconsistent versions ({scope})"
    )
    return CheckOutcome(
        count == 0,
        description,
        {"inconsistent_keys": count, "sample": ", ".join(sample), "scope": scope},
    )


def watermark_monotonic(target: DeltaTarget, kind: WatermarkKind) -> CheckOutcome:
    """Across the loader's commits in the Delta log, the cursor never moved backwards, and
    the application transaction holds the latest commit's cursor.

    A recorded rewind (``incremental-assets rewind``: a commit with who and why) is the one
    sanctioned step back: the loads after it are compared with the rewound cursor.
    """
    if not target.exists():
        return CheckOutcome(True, "target does not exist yet", {"loads": 0})
    table = target.open()
    commits = target.cursor_commits(table, limit=_HISTORY)
    loads = [c for c in commits if "rewind" not in c]
    rewinds = [c for c in commits if "rewind" in c]
    previous = None
    for commit in reversed(commits):
        text = commit.get("cursor_after")
        if "rewind" in commit:
            previous = parse_value(text, kind) if text and text != "-" else None
            continue
        if not text or text == "-":
            continue
        value = parse_value(text, kind)
        if previous is not None and value < previous:
            return CheckOutcome(
                False,
                f"cursor moved backwards at Delta version {commit['version']}: "
                f"{text} after {previous}",
                {"loads": len(loads), "version": commit["version"]},
            )
        previous = value
    state = target.state(kind)
    if (previous is not None or rewinds) and state.cursor != previous:
        return CheckOutcome(
            False,
            f"application transaction holds {state.cursor}, last commit says {previous}",
            {"loads": len(loads)},
        )
    plural = "s" if len(rewinds) != 1 else ""
    rewound = f", {len(rewinds)} recorded rewind{plural} honoured" if rewinds else ""
    return CheckOutcome(
        True,
        f"cursor non-decreasing over {len(loads)} loads{rewound}",
        {"loads": len(loads), "rewinds": len(rewinds)},
    )


def counts_match_table(
    target: DeltaTarget, version: int | None, inserted: int, updated: int, deleted: int
) -> CheckOutcome:
    """The run's reported counts agree with the Delta commit it made: the commit's own
    merge metrics, and the change in the snapshot's row count (from file statistics)."""
    if version is None or not target.exists():
        return CheckOutcome(True, "nothing committed", {})
    table = target.open(version)
    after = row_count(table)
    before = row_count(target.open(version - 1)) if version > 0 else 0
    commit = next((c for c in target.loads(target.open(version), limit=1)), None)
    problems = []
    if after - before != inserted - deleted:
        problems.append(
            f"table grew by {after - before} rows but the run reports "
            f"{inserted} inserted and {deleted} deleted"
        )
    if commit and commit.get("operation") == "MERGE":
        metrics = commit.get("operation_metrics", {})
        for name, reported in (("inserted", inserted), ("updated", updated), ("deleted", deleted)):
            logged = int(metrics.get(f"num_target_rows_{name}", 0))
            if logged != reported:
                problems.append(f"{name}: run reports {reported}, Delta log says {logged}")
    metadata = {"rows_before": before, "rows_after": after, "delta_version": version}
    if problems:
        return CheckOutcome(False, "; ".join(problems), metadata)
    return CheckOutcome(True, f"rows {before} -> {after} match the reported counts", metadata)
