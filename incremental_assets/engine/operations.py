"""Day-2 operations on a table's Delta log, with delta-rs alone (no Spark): the table's
status (cursor, lag, last run and its counts, Delta version), and rewinding its cursor.

Everything is read from, and written to, the Delta log, which is the truth; Dagster's
records only mirror it.

Example:
    >>> table_status(spec, DeltaTarget(spec.name, path)).cursor  # doctest: +SKIP
    >>> rewind(spec, target, "2026-01-02", by="alice", reason="rows restored")  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pyspark.sql import SparkSession

from incremental_assets.engine import cursor_range
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.commits import SOURCE_IDENTITY
from incremental_assets.engine.delta_lake.store import (
    DeltaTarget,
    TargetState,
    row_count,
)
from incremental_assets.engine.errors import (
    ConcurrentLoadError,
    IncrementalLoadError,
    OperationError,
)
from incremental_assets.engine.sources import source_class
from incremental_assets.engine.watermarks import (
    ID_MIN,
    WatermarkValue,
    format_value,
    lag_seconds,
    parse_value,
    shift_back,
    to_utc,
)
from incremental_assets.specs import TableSpec

# Commits read to find the latest rewind (the last load is found however far back).
_RECENT = 50


@dataclass(frozen=True)
class LastRun:
    """The table's most recent load commit."""

    version: int
    time: datetime
    run_id: str
    partition: str
    mode: str
    window: str
    cursor_before: str | None
    """None when the load has no watermark (a landing table) or started from none."""
    cursor_after: str | None
    rows_extracted: int | None
    rows_inserted: int
    rows_updated: int
    rows_deleted: int


@dataclass(frozen=True)
class RewindRecord:
    """A rewind or reset of the cursor, as recorded in the Delta log."""

    version: int
    time: datetime
    cursor_before: str
    cursor_after: str
    by: str
    reason: str
    operation: str = "rewind"
    """'rewind', 'reset' or 'accept-source' (the cursor kept, another source accepted)."""
    source: str | None = None
    source_before: str | None = None
    """The source it accepted, and the one recorded before, when it accepted another."""


@dataclass(frozen=True)
class TableStatus:
    """One table as its Delta log describes it. ``rewind`` is the latest rewind when it is
    newer than the last run (the next run starts from it)."""

    table: str
    path: str
    strategy: str
    watermark_kind: str
    loaded: bool
    cursor: WatermarkValue | None = None
    lag_seconds: float | None = None
    delta_version: int | None = None
    rows: int | None = None
    files: int | None = None
    last_run: LastRun | None = None
    rewind: RewindRecord | None = None
    error: str | None = None
    """Why the table could not be read (a corrupt log, say); the other fields are empty."""

    def to_json(self) -> dict[str, Any]:
        def plain(record: object) -> dict | None:
            if record is None:
                return None
            values = dict(record.__dict__)
            values["time"] = format_value(values["time"])
            return values

        return {
            "table": self.table,
            "path": self.path,
            "strategy": self.strategy,
            "watermark_kind": self.watermark_kind,
            "loaded": self.loaded,
            "watermark": format_value(self.cursor) if self.cursor is not None else None,
            "lag_seconds": self.lag_seconds,
            "delta_version": self.delta_version,
            "rows": self.rows,
            "files": self.files,
            "last_run": plain(self.last_run),
            "rewind": plain(self.rewind),
            "error": self.error,
        }


def table_status(spec: TableSpec, target: DeltaTarget, now: datetime | None = None) -> TableStatus:
    """The table's cursor, lag (against ``now``, time watermarks only), last run, Delta
    version, rows and files, all from the Delta log (rows from file statistics)."""
    base = {
        "table": spec.name,
        "path": target.path,
        "strategy": spec.strategy.kind,
        "watermark_kind": _kind(spec),
    }
    if not target.exists():
        return TableStatus(**base, loaded=False)
    try:
        state = target.state(spec.watermark.kind)
    except IncrementalLoadError as exc:
        return TableStatus(**base, loaded=False, error=str(exc))
    table = state.table
    assert table is not None
    last = _last_run(state.last_load)
    rewinds = [
        r
        for r in target.rewinds(table, limit=_RECENT)
        if last is None or int(r["version"]) > last.version
    ]
    return TableStatus(
        **base,
        loaded=last is not None or bool(rewinds),
        cursor=state.cursor,
        lag_seconds=lag_seconds(state.cursor, now or datetime.now(timezone.utc)),
        delta_version=state.version,
        rows=row_count(table),
        files=delta_io.live_files(table).num_rows,
        last_run=last,
        rewind=_rewind_record(rewinds[0]) if rewinds else None,
    )


@dataclass(frozen=True)
class RewindResult:
    table: str
    version: int
    cursor_before: WatermarkValue | None
    cursor_after: WatermarkValue | None
    by: str
    reason: str
    next_run_reads: str
    # The source the next run must read (engine/sources/identity.py), and the one recorded
    # before when this commit accepted another (else None).
    source: str = ""
    source_before: str | None = None


def rewind(
    spec: TableSpec,
    target: DeltaTarget,
    to: str | None,
    *,
    by: str,
    reason: str,
    spark: SparkSession,
    accept_source: bool = False,
) -> RewindResult:
    """Move the table's cursor back to ``to`` (None: reset it, so the next run loads from
    the start of the table's history), in a Delta commit (written by ``spark``) that
    records who and why.

    The commit changes no data: the next run re-extracts from the new cursor (minus the
    lookback) and merges as usual, so rows already loaded are matched, not duplicated.
    It records the source the next run must read: a reset takes the spec's as it is now;
    a rewind to a value is refused when the spec names another source than the table was
    loaded from, unless ``accept_source``.

    Raises:
        OperationError: unknown or unparsable value, a value no run can read from or at or
            after the cursor, a table not loaded yet, a snapshot table, a switched source
            not accepted, or a load committing meanwhile.
    """
    name = spec.name
    _refuse_without_watermark(spec)
    _check_who_and_why(spec, by, reason)
    value = parse_watermark(spec, to) if to is not None else None
    state = _loaded_state(spec, target)
    current = source_class(name, spec.source).identity_of(spec.source)
    recorded = state.source_identity
    switched = recorded not in (None, current)
    before = state.cursor
    if before is None and (value is not None or not switched):
        raise OperationError(
            name,
            "the watermark is already reset: the next run reads from partitioning.start.",
            "nothing to do; materialize the table"
            + (" (--accept-source alone records the spec's source)" if switched else ""),
        )
    if value is not None:
        _check_not_after(spec, state, value)
        if switched and not accept_source:
            raise OperationError(
                name,
                f"the spec names another source than the table was loaded from: Delta "
                f"version {state.source_identity_version} recorded {recorded}, the spec now "
                f"names {current}; nothing was written.",
                "add --accept-source to go on from the new source at --to, use --reset to "
                f"reload the table from it, or restore {_fields(spec)} in the spec",
            )
    metadata = {
        "operation": "reset" if value is None else "rewind",
        # Read back as "action": a commit's "operation" is Delta's (WRITE) when read.
        "action": "reset" if value is None else "rewind",
        "watermark_kind": spec.watermark.kind,
        "cursor_before": format_value(before),
        "cursor_after": format_value(value),
        "by": by,
        "reason": reason,
        **_source_metadata(current, recorded),
    }
    version = _record(spark, spec, target, state, value, metadata)
    return RewindResult(
        name,
        version,
        before,
        value,
        by,
        reason,
        _next_run_reads(spec, value),
        current,
        recorded if switched else None,
    )


def accept_source(
    spec: TableSpec, target: DeltaTarget, *, by: str, reason: str, spark: SparkSession
) -> RewindResult:
    """Accept the source the spec names now as the table's, keeping the cursor: a commit
    without data (written by ``spark``) records it with who and why, and the next run
    reads it from the cursor on (a snapshot table: its whole state; a landing table: its
    files not loaded yet). See engine/sources/identity.py.

    Raises:
        OperationError: a table not loaded yet, a source already recorded as the table's,
            or a load committing meanwhile.
    """
    name = spec.name
    _check_who_and_why(spec, by, reason)
    state = _loaded_state(spec, target)
    current = source_class(name, spec.source).identity_of(spec.source)
    recorded = state.source_identity
    if recorded == current:
        raise OperationError(
            name,
            f"the table's source is already {current} (recorded at Delta version "
            f"{state.source_identity_version}); there is no other source to accept.",
            "nothing to do; materialize the table",
        )
    cursor = state.cursor
    metadata = {
        "operation": "accept-source",
        "action": "accept-source",
        "watermark_kind": _kind(spec),
        "cursor_before": format_value(cursor),
        "cursor_after": format_value(cursor),
        "by": by,
        "reason": reason,
        **_source_metadata(current, recorded, accepted=True),
    }
    version = _record(spark, spec, target, state, cursor, metadata)
    reads = _next_run_reads(spec, cursor)
    return RewindResult(name, version, cursor, cursor, by, reason, reads, current, recorded)


def _refuse_without_watermark(spec: TableSpec) -> None:
    if spec.landing is not None:
        raise OperationError(
            spec.name,
            "a landing table loads each file once, by its path and version; it has no "
            "watermark to rewind.",
            "to load a file again, write it again (a new size or modification time makes "
            "it a new version)",
        )
    if spec.takes_snapshots:
        raise OperationError(
            spec.name,
            "a snapshot table reads its whole source on every run, so it has no watermark "
            "to rewind.",
            "materialize the table again to take a new snapshot",
        )


def _check_who_and_why(spec: TableSpec, by: str, reason: str) -> None:
    # Kept as given (the log's JSON escapes it); printed escaped (incremental_assets/
    # terminal.py), so control characters cannot forge the output.
    if not reason.strip():
        raise OperationError(spec.name, "a rewind needs a reason.", "say why with --reason TEXT")
    if not by.strip():
        raise OperationError(spec.name, "a rewind needs the name of who asks.", "pass --by WHO")


def _loaded_state(spec: TableSpec, target: DeltaTarget) -> TargetState:
    kind = "timestamp" if spec.landing is not None else spec.watermark.kind
    state = target.state(kind) if target.exists() else None
    if state is None or (state.cursor is None and not state.last_load):
        raise OperationError(
            spec.name,
            f"the table has not been loaded yet (no watermark in {target.path}), so there is "
            "nothing to rewind; its first run reads from partitioning.start "
            f"({format_value(spec.partitioning.start)}).",
            "materialize the table first",
        )
    return state


def _check_not_after(spec: TableSpec, state: TargetState, value: WatermarkValue) -> None:
    """A rewind moves the cursor back, never past rows not loaded. A cursor no run can
    read from (set by an earlier release) is measured by the last load's instead, so the
    table can be rewound to a usable value."""
    before = state.cursor
    assert before is not None
    if cursor_range.refusal(spec, before) is None:
        if value >= before:  # type: ignore[operator]
            raise OperationError(
                spec.name,
                f"--to {format_value(value)} is not before the current watermark "
                f"{format_value(before)}; moving it forward would skip the rows in between.",
                f"give a value before {format_value(before)}",
            )
        return
    loaded = _last_loaded_cursor(spec, state)
    if loaded is not None and value > loaded:  # type: ignore[operator]
        raise OperationError(
            spec.name,
            f"--to {format_value(value)} is after {format_value(loaded)}, the watermark of "
            f"the last load (the current one, {format_value(before)}, cannot be used); "
            "moving past it would skip the rows in between.",
            f"give a value up to {format_value(loaded)}",
        )


def _last_loaded_cursor(spec: TableSpec, state: TargetState) -> WatermarkValue | None:
    text = state.last_load.get("cursor_after")
    if not text or text == "-":
        return None
    try:
        value = parse_value(str(text), spec.watermark.kind)
    except (ValueError, OverflowError):
        return None
    return value if cursor_range.refusal(spec, value) is None else None


def _source_metadata(current: str, recorded: str | None, accepted: bool = False) -> dict:
    """What the commit records of the source: the spec's (which the next run compares
    with), and the one it replaces when they differ."""
    replaced = recorded not in (None, current) or (accepted and recorded is None)
    return {
        SOURCE_IDENTITY: current,
        **({"source_identity_before": recorded or "-"} if replaced else {}),
    }


def _fields(spec: TableSpec) -> str:
    return source_class(spec.name, spec.source).identity_fields


def _record(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    state: TargetState,
    cursor: WatermarkValue | None,
    metadata: dict,
) -> int:
    try:
        return target.record_rewind(spark, state, cursor, metadata)
    except ConcurrentLoadError:
        raise OperationError(
            spec.name,
            "a load committed to the table while the rewind was being written; nothing "
            "was rewound.",
            "run the rewind again when no run of the table is in progress",
        ) from None


def parse_watermark(spec: TableSpec, text: str) -> WatermarkValue:
    """A cursor value typed by a person, in the table's watermark kind: an integer for id
    and sequence watermarks; an ISO-8601 instant for timestamps (zone-less: UTC); for
    hybrid watermarks ``TIME|ID`` or ``TIME`` alone (every row at TIME is re-read)."""
    wm = spec.watermark
    text = text.strip()
    if wm.kind in ("id", "sequence"):
        try:
            value = int(text)
        except ValueError:
            raise OperationError(
                spec.name,
                f"--to {text!r} is not an integer; watermark '{wm.column}' is of kind '{wm.kind}'.",
                "give a whole number, e.g. --to 10000",
            ) from None
        # The lowest integer (earlier releases' reset marker) is below the range too.
        return _in_range(spec, text, value)
    time_text, bar, id_text = text.partition("|")
    if bar and wm.kind != "hybrid":
        raise OperationError(
            spec.name,
            f"--to {text!r} has an id part, but watermark '{wm.column}' is of kind '{wm.kind}'.",
            "give a timestamp alone, e.g. --to 2026-01-02T00:00:00Z",
        )
    try:
        instant = to_utc(datetime.fromisoformat(time_text.replace("Z", "+00:00")))
    except OverflowError:  # a year-1 or year-9999 time whose offset crosses the calendar
        raise OperationError(
            spec.name,
            f"--to {time_text!r} is outside the instants a watermark can hold.",
            f"give {cursor_range.describe(spec)}",
        ) from None
    except ValueError:
        raise OperationError(
            spec.name,
            f"--to {time_text!r} is not a timestamp; watermark '{wm.column}' is of kind "
            f"'{wm.kind}'.",
            "write an ISO-8601 time, e.g. --to 2026-01-02T00:00:00Z (a time without a zone "
            "is read as UTC)"
            + (", optionally with '|ID' for the tie-break id" if wm.kind == "hybrid" else ""),
        ) from None
    if wm.kind != "hybrid":
        return _in_range(spec, text, instant)
    if not bar:
        return _in_range(spec, text, (instant, ID_MIN))
    try:
        ident = int(id_text)
    except ValueError:
        raise OperationError(
            spec.name,
            f"--to {text!r}: the part after '|' is not an integer ({wm.tiebreak} ids).",
            "write TIME|ID, e.g. --to '2026-01-02T00:00:00Z|1500'",
        ) from None
    return _in_range(spec, text, (instant, ident))


def _in_range(spec: TableSpec, text: str, value: WatermarkValue) -> WatermarkValue:
    """``value``, unless the next run could not read from it (engine/cursor_range.py):
    refused before anything is written."""
    problem = cursor_range.refusal(spec, value)
    if problem is not None:
        raise OperationError(
            spec.name,
            f"--to {text!r}: {problem}; nothing was written.",
            f"give {cursor_range.describe(spec)}",
        )
    return value


def _kind(spec: TableSpec) -> str:
    if spec.landing is not None:
        return "landing"
    return "snapshot" if spec.takes_snapshots else spec.watermark.kind


def _next_run_reads(spec: TableSpec, cursor: WatermarkValue | None) -> str:
    wm = spec.watermark
    if spec.landing is not None:
        return f"the files of {spec.source.path} it has not loaded"
    if spec.takes_snapshots:
        return "the whole source, as a new snapshot"
    if cursor is None:
        start = format_value(spec.partitioning.start)
        return f"every row of the source from partitioning.start ({start}) on"
    lower = shift_back(cursor, wm.lookback)
    return f"rows with {wm.column} after {format_value(lower)}"


def _last_run(load: dict) -> LastRun | None:
    if not load:
        return None
    metrics = load.get("operation_metrics") or {}
    merged = load.get("operation") == "MERGE"

    def metric(name: str) -> int:
        return int(metrics.get(name) or 0)

    extracted = load.get("rows_extracted")
    return LastRun(
        version=int(load["version"]),
        time=_commit_time(load),
        run_id=str(load.get("run_id", "")),
        partition=str(load.get("partition", "")),
        mode=str(load.get("mode", "")),
        window=str(load.get("window", "")),
        cursor_before=_cursor(load.get("cursor_before")),
        cursor_after=_cursor(load.get("cursor_after")),
        rows_extracted=int(extracted) if extracted is not None else None,
        rows_inserted=metric("num_target_rows_inserted" if merged else "num_added_rows"),
        rows_updated=metric("num_target_rows_updated"),
        rows_deleted=metric("num_target_rows_deleted"),
    )


def _cursor(value: object) -> str | None:
    # Commits write "-" for "no cursor"; readers of status --json get null.
    return None if value is None or value == "-" else str(value)


def _rewind_record(commit: dict) -> RewindRecord:
    cursor_after = str(commit.get("cursor_after", "-"))
    before = commit.get("source_identity_before")
    return RewindRecord(
        version=int(commit["version"]),
        time=_commit_time(commit),
        cursor_before=str(commit.get("cursor_before", "-")),
        cursor_after=cursor_after,
        by=str(commit.get("by", "")),
        reason=str(commit.get("reason", "")),
        operation=str(commit.get("action") or ("reset" if cursor_after == "-" else "rewind")),
        source=commit.get(SOURCE_IDENTITY),
        source_before=None if before in (None, "-") else str(before),
    )


def _commit_time(commit: dict) -> datetime:
    millis = int(commit.get("timestamp") or 0)
    return datetime.fromtimestamp(millis / 1000, tz=timezone.utc).replace(microsecond=0)
