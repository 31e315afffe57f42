"""Verifications of a target table, for asset checks: plain functions over Spark and the
Delta log."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from incremental_assets.engine.changes import DELETED_AT, IS_DELETED
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget, row_count
from incremental_assets.engine.predicates import Range
from incremental_assets.engine.spark.aggregates import aggregated
from incremental_assets.engine.transforms import ROW_HASH, null_count, quote
from incremental_assets.engine.watermarks import WatermarkKind, parse_value
from incremental_assets.specs import TableSpec

if TYPE_CHECKING:  # load imports quality, which imports this module
    from incremental_assets.engine.load import LoadResult

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


def keys_not_null(spark: SparkSession, target: DeltaTarget, keys: Sequence[str]) -> CheckOutcome:
    """No key column is null anywhere in the target.

    Answered from the Delta log: each file's ``null_count`` statistic per key (and, for a
    key that is a Delta partition column, the file's partition value). Only files the log
    holds no such statistic for are read, by one Spark aggregation over those files.
    """
    if not target.exists():
        return CheckOutcome(True, "target does not exist yet", {f"null_{k}": 0 for k in keys})
    table = target.open()
    partition_columns = set(table.metadata().partition_columns)
    nulls = dict.fromkeys(keys, 0)
    unknown: list[dict] = []
    files = delta_io.live_files(table).to_pylist()
    for row in files:
        counts = _null_counts_from_log(row, keys, partition_columns)
        if counts is None:
            unknown.append(row)
            continue
        for key, count in counts.items():
            nulls[key] += count
    if unknown:
        df = delta_io.read_files(spark, table, unknown)
        counts = [null_count(k).alias(f"n{i}") for i, k in enumerate(keys)]
        # Read through Spark's Delta (deletion vectors, column mapping): agg's two jobs.
        agg = aggregated(df, *counts, one_job=not delta_io.needs_delta_reader(table))
        for i, key in enumerate(keys):
            nulls[key] += int(agg[f"n{i}"] or 0)
    scope = (
        f"from the statistics of {len(files) - len(unknown)} of {len(files)} files, "
        f"{len(unknown)} without statistics counted by Spark"
    )
    per_key = ", ".join(f"{k}: {n}" for k, n in nulls.items())
    bad = {k: n for k, n in nulls.items() if n}
    metadata: dict[str, object] = {
        **{f"null_{k}": n for k, n in nulls.items()},
        "files_from_statistics": len(files) - len(unknown),
        "files_counted_by_spark": len(unknown),
    }
    if bad:
        return CheckOutcome(False, f"null keys in the target ({per_key}; {scope})", metadata)
    return CheckOutcome(True, f"no key column is null ({per_key}; {scope})", metadata)


def _null_counts_from_log(
    row: dict, keys: Sequence[str], partition_columns: set[str]
) -> dict[str, int] | None:
    """A file's null count per key from its add action, or None if any is not recorded."""
    counts = {}
    for key in keys:
        if key in partition_columns:
            records = row.get("num_records")
            if records is None:
                return None
            counts[key] = int(records) if row.get(f"partition.{key}") is None else 0
            continue
        value = row.get(f"null_count.{key}")
        if value is None:
            return None
        counts[key] = int(value)
    return counts


def rows_reconciled(spec: TableSpec, result: LoadResult) -> CheckOutcome:
    """Every row the run extracted is accounted for, in buckets that partition them.

    The run measures independently: rows extracted (counted as they are read), rows
    quarantined and rows staged (counted in their staged files), rows inserted, updated and
    deleted (the Delta merge's own metrics), and for snapshot and history tables the
    staged change rows by kind. Per strategy:

    - append, upsert, cdc (and landing files): extracted = inserted + updated + deleted +
      unchanged + superseded + quarantined. ``superseded`` (older versions of a key in the
      same batch; for hard-delete CDC also changes older than a recorded delete) is
      extracted - quarantined - staged, and ``unchanged`` (staged rows the merge left alone:
      not newer than the target's, or already present) is staged - inserted - updated -
      deleted; neither is counted on its own, so the equation holds exactly when both are
      non-negative, and a merge that wrote more rows than were staged, or staged plus
      quarantined rows above those extracted, fail it. An append never updates or deletes;
      an upsert and soft-delete CDC never delete.
    - snapshot: the snapshot's rows = inserted + changed + unchanged (by the diff), and the
      merge's inserted + updated + deleted = inserted + changed + vanished staged rows
      (each staged change lands once; hard deletes: deleted = vanished).
    - scd2: a change event may open, close, update in place or replace several versions,
      so extracted rows do not partition into written rows. Checked: extracted = new
      events + events already logged (or repeated), the merge's inserted = versions opened,
      updated = closed + updated in place, deleted = replaced, and no version is written
      when no event was new, unless the run recovers events logged for a commit the
      table does not hold (``events_recovered``: a run killed after the log's append, or
      a table created from a log that already holds its events).
    """
    if spec.history:
        return _history_reconciled(result)
    if spec.takes_snapshots:
        return _snapshot_reconciled(spec, result)
    extracted, staged = result.rows_extracted, result.rows_staged
    ins, upd, dele = result.rows_inserted, result.rows_updated, result.rows_deleted
    quarantined = result.quality.rows_quarantined if result.quality else 0
    unchanged = staged - ins - upd - dele
    superseded = extracted - quarantined - staged
    kind = spec.strategy.kind
    deletes = getattr(spec.strategy, "deletes", "hard")
    terms = [("inserted", ins), ("updated", upd)]
    if kind == "cdc":
        terms.append(("deleted", dele))
    terms += [("unchanged", unchanged), ("superseded", superseded), ("quarantined", quarantined)]
    problems = []
    if superseded < 0:
        problems.append(
            f"{staged} staged + {quarantined} quarantined rows exceed the {extracted} extracted"
        )
    if unchanged < 0:
        problems.append(f"the merge wrote {ins + upd + dele} rows from {staged} staged rows")
    forbidden = {"append": ("updated", "deleted"), "upsert": ("deleted",)}.get(kind, ())
    if kind == "cdc" and deletes == "soft":
        forbidden = ("deleted",)
    counts = {"inserted": ins, "updated": upd, "deleted": dele}
    for name in forbidden:
        if counts[name]:
            problems.append(f"{counts[name]} rows {name}, which {kind} loads never do")
    equation = f"extracted {extracted} = " + " + ".join(f"{n} {v}" for n, v in terms)
    metadata: dict[str, object] = {
        "equation": equation,
        "rows_extracted": extracted,
        "rows_staged": staged,
        **{f"rows_{n}": v for n, v in terms},
        **({"rows_deleted": dele} if kind != "cdc" else {}),
    }
    return _equation_outcome(equation, problems, metadata)


def _snapshot_reconciled(spec: TableSpec, result: LoadResult) -> CheckOutcome:
    changes = result.changes
    new, changed, vanished = (changes.get(k, 0) for k in ("insert", "change", "vanish"))
    unchanged = result.rows_unchanged
    extracted = result.rows_extracted
    ins, upd, dele = result.rows_inserted, result.rows_updated, result.rows_deleted
    staged = new + changed + vanished
    problems = []
    if extracted != new + changed + unchanged:
        problems.append(
            f"the snapshot's {extracted} rows are not {new} new + {changed} changed + "
            f"{unchanged} unchanged"
        )
    if ins + upd + dele != staged:
        problems.append(
            f"the merge wrote {ins} inserted + {upd} updated + {dele} deleted rows for "
            f"{staged} staged changes"
        )
    if getattr(spec.strategy, "deletes", "hard") == "hard" and dele != vanished:
        problems.append(f"{vanished} rows vanished but {dele} were deleted")
    if result.rows_staged != staged:
        problems.append(f"{result.rows_staged} rows staged, {staged} counted by kind")
    equation = (
        f"extracted {extracted} = {new} new + {changed} changed + {unchanged} unchanged; "
        f"written {ins} inserted + {upd} updated + {dele} deleted = {new} new + {changed} "
        f"changed + {vanished} vanished"
    )
    metadata: dict[str, object] = {
        "equation": equation,
        "rows_extracted": extracted,
        "rows_new": new,
        "rows_changed": changed,
        "rows_unchanged": unchanged,
        "rows_vanished": vanished,
        "rows_inserted": ins,
        "rows_updated": upd,
        "rows_deleted": dele,
    }
    return _equation_outcome(equation, problems, metadata)


def _history_reconciled(result: LoadResult) -> CheckOutcome:
    changes = result.changes
    opened, closed, in_place, replaced = (
        changes.get(k, 0) for k in ("open", "close", "update", "remove")
    )
    extracted, known = result.rows_extracted, result.rows_unchanged
    recovered = result.events_recovered
    fresh = extracted - known
    ins, upd, dele = result.rows_inserted, result.rows_updated, result.rows_deleted
    problems = []
    if fresh < 0:
        problems.append(f"{known} events already logged exceed the {extracted} extracted")
    if (ins, upd, dele) != (opened, closed + in_place, replaced):
        problems.append(
            f"the merge wrote {ins} inserted + {upd} updated + {dele} deleted rows for "
            f"{opened} opened, {closed} closed + {in_place} updated in place, "
            f"{replaced} replaced versions"
        )
    if fresh == 0 and ins + upd + dele and not recovered:
        problems.append(f"{ins + upd + dele} version rows written without a new event")
    # Logged for a commit the table does not hold (by a run killed after the log's append,
    # or before the table was created anew): this run writes their versions.
    uncommitted = f" ({recovered} logged for a commit the table does not hold)" if recovered else ""
    equation = (
        f"extracted {extracted} = {fresh} new events + {known} already logged{uncommitted}; "
        "versions: "
        f"inserted {ins} = {opened} opened, updated {upd} = {closed} closed + {in_place} "
        f"in place, deleted {dele} = {replaced} replaced"
    )
    metadata: dict[str, object] = {
        "equation": equation,
        "rows_extracted": extracted,
        "events_new": fresh,
        "events_already_logged": known,
        "events_recovered": recovered,
        "versions_opened": opened,
        "versions_closed": closed,
        "versions_updated_in_place": in_place,
        "versions_replaced": replaced,
        "rows_inserted": ins,
        "rows_updated": upd,
        "rows_deleted": dele,
    }
    return _equation_outcome(equation, problems, metadata)


def _equation_outcome(
    equation: str, problems: list[str], metadata: dict[str, object]
) -> CheckOutcome:
    if problems:
        return CheckOutcome(False, f"{'; '.join(problems)} ({equation})", metadata)
    return CheckOutcome(True, equation, metadata)


# Expected kinds of the columns a spec names (None: any type).
_KINDS = {
    "timestamp": (TimestampType, TimestampNTZType),
    "integer": (ByteType, ShortType, IntegerType, LongType),
    "boolean": (BooleanType,),
}
_WIDTH = {ByteType: 1, ShortType: 2, IntegerType: 4, LongType: 8, FloatType: 4, DoubleType: 8}


def schema_matches_spec(target: DeltaTarget, spec: TableSpec) -> CheckOutcome:
    """The target's Delta schema against what the spec says it holds.

    Every column the spec names (keys, watermark and tie-break, partition column, Delta
    partition columns, the strategy's columns: snapshot time, tracked columns, validity and
    soft-delete flags) must be present with a compatible type, and so must every column of a
    declared ``source.schema`` (as the loader lands it). Target columns the spec does not
    know are judged only when ``source.schema`` declares the source's columns (otherwise the
    spec does not list them): they fail the check under ``on_schema_change: fail`` and pass
    with a warning under ``append_new_columns``.
    """
    if not target.exists():
        return CheckOutcome(True, "target does not exist yet", {})
    actual = {f.name: f.dataType for f in delta_io.spark_schema(target.open()).fields}
    expected = expected_columns(spec)
    missing = [f"{c} ({why})" for c, (_, why) in expected.items() if c not in actual]
    retyped = [
        f"{c}: {actual[c].simpleString()}, expected {_kind_text(kind)}"
        for c, (kind, _) in expected.items()
        if c in actual and not _compatible(kind, actual[c])
    ]
    declared = spec.source.schema_ddl is not None
    unknown = [c for c in actual if c not in expected]
    metadata: dict[str, object] = {
        "missing_columns": ", ".join(missing),
        "retyped_columns": ", ".join(retyped),
        "unexpected_columns": ", ".join(unknown) if declared else "",
        "columns_checked": len(expected),
        "target_columns": len(actual),
    }
    problems = []
    if missing:
        problems.append(f"missing: {', '.join(missing)}")
    if retyped:
        problems.append(f"retyped: {', '.join(retyped)}")
    warning = ""
    if declared and unknown:
        text = f"columns the spec does not declare: {', '.join(unknown)}"
        if spec.on_schema_change == "fail":
            problems.append(f"{text} (on_schema_change: fail)")
        else:
            warning = f"; warning: {text} (added under on_schema_change: append_new_columns)"
    if problems:
        return CheckOutcome(False, "; ".join(problems), metadata)
    undeclared = "" if declared else f", {len(unknown)} other columns (no source.schema)"
    return CheckOutcome(
        True,
        f"{len(expected)} columns the spec names are present with compatible types"
        f"{undeclared}{warning}",
        metadata,
    )


def expected_columns(spec: TableSpec) -> dict[str, tuple[object, str]]:
    """The target columns a spec implies: name -> (expected kind or type, why)."""
    out: dict[str, tuple[object, str]] = {}

    def want(column: str | None, kind: object, why: str) -> None:
        if column and column not in out:
            out[column] = (kind, why)

    for column, kind in _declared_columns(spec).items():
        want(column, kind, "source.schema")
    for key in spec.keys:
        want(key, None, "keys")
    wm = spec.watermark
    want(wm.column, "timestamp" if wm.is_time else "integer", "watermark.column")
    want(wm.tiebreak, "integer", "watermark.tiebreak")
    want(spec.partition_column, "timestamp", "partitioning.column")
    for column in spec.target.partition_by:
        want(column, None, "target.partition_by")
    if spec.landing is not None:
        return out
    want(ROW_HASH, "integer", "loader's row hash")
    strategy = spec.strategy
    tracked = getattr(strategy, "tracked", None) or []
    for column in tracked:
        want(column, None, "strategy.tracked")
    scd2 = spec.history
    if scd2 is not None:
        want(spec.effective_column, "timestamp", "strategy.effective")
        want(scd2.valid_from, "timestamp", "strategy.valid_from")
        want(scd2.valid_to, "timestamp", "strategy.valid_to")
        want(scd2.is_current, "boolean", "strategy.is_current")
    elif getattr(strategy, "deletes", None) == "soft":
        want(IS_DELETED, "boolean", "strategy.deletes: soft")
        want(DELETED_AT, "timestamp", "strategy.deletes: soft")
    return out


def _declared_columns(spec: TableSpec) -> dict[str, DataType]:
    """A declared ``source.schema`` as the loader lands it: a CDC feed's operation column
    (and SQL Server's ``__$`` columns) dropped, Debezium images flattened."""
    ddl = spec.source.schema_ddl
    if not ddl:
        return {}
    fields = {f.name: f.dataType for f in StructType.fromDDL(ddl).fields}
    feed = spec.feed
    if feed is None:
        return fields
    keep = (spec.watermark.column, spec.partition_column)
    if feed.encoding == "debezium":
        after = fields.get(feed.after)
        image = {f.name: f.dataType for f in after.fields} if isinstance(after, StructType) else {}
        envelope = {
            c: t
            for c, t in fields.items()
            if c not in (feed.before, feed.after, feed.operation_column) and c not in image
        }
        return {**image, **envelope}
    return {
        c: t
        for c, t in fields.items()
        if c != feed.operation_column
        and not (feed.encoding == "sqlserver" and c.startswith("__$") and c not in keep)
    }


def _compatible(kind: object, actual: DataType) -> bool:
    if kind is None:
        return True
    if isinstance(kind, str):
        return isinstance(actual, _KINDS[kind])
    assert isinstance(kind, DataType)
    timestamps = _KINDS["timestamp"]
    if isinstance(kind, timestamps) and isinstance(actual, timestamps):
        return True  # zone-less source timestamps land as UTC instants
    wide = _WIDTH.get(type(kind)), _WIDTH.get(type(actual))
    if None not in wide and (isinstance(kind, (FloatType, DoubleType))) == isinstance(
        actual, (FloatType, DoubleType)
    ):
        return wide[1] >= wide[0]  # type: ignore[operator]
    return kind.simpleString() == actual.simpleString()


def _kind_text(kind: object) -> str:
    if kind is None:
        return "any"
    return kind if isinstance(kind, str) else kind.simpleString()  # type: ignore[union-attr]


def deletes_within_limit(spec: TableSpec, result: LoadResult) -> CheckOutcome:
    """The run deleted no more than ``strategy.max_delete_share`` of the target's live
    rows (a run over the limit fails before writing; this shows the margin)."""
    guard = result.guard
    limit = getattr(spec.strategy, "max_delete_share", 1.0)
    if guard is None:
        return CheckOutcome(True, "nothing to judge: no rows staged", {"max_delete_share": limit})
    text = (
        f"{guard.deleting} of {guard.live_rows} live rows deleted ({guard.share:.1%}), "
        f"limit {guard.limit:.0%} (strategy.max_delete_share)"
    )
    return CheckOutcome(guard.share <= guard.limit, text, dict(guard.metadata()))


def watermark_in_range(result: LoadResult) -> CheckOutcome:
    """No source row has a time watermark that no window can reach: before
    ``partitioning.start``, or more than a day ahead of the source clock."""
    found = result.out_of_range
    if found is None:
        return CheckOutcome(True, "not measured (watermark not a top-level column)", {})
    return CheckOutcome(found.total == 0, found.describe(), dict(found.metadata()))
