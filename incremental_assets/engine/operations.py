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

from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import NO_CURSOR, DeltaTarget, row_count
from incremental_assets.engine.errors import (
    ConcurrentLoadError,
    IncrementalLoadError,
    OperationError,
)
from incremental_assets.engine.watermarks import (
    ID_MIN,
    WatermarkValue,
    format_value,
    lag_seconds,
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


def rewind(
    spec: TableSpec,
    target: DeltaTarget,
    to: str | None,
    *,
    by: str,
    reason: str,
    spark: SparkSession,
) -> RewindResult:
    """Move the table's cursor back to ``to`` (None: reset it, so the next run loads from
    the start of the table's history), in a Delta commit (written by ``spark``) that
    records who and why.

    The commit changes no data: the next run re-extracts from the new cursor (minus the
    lookback) and merges as usual, so rows already loaded are matched, not duplicated.

    Raises:
        OperationError: unknown or unparsable value, a value at or after the cursor, a
            table not loaded yet, a snapshot table, or a load committing meanwhile.
    """
    name = spec.name
    if spec.landing is not None:
        raise OperationError(
            name,
            "a landing table loads each file once, by its path and version; it has no "
            "watermark to rewind.",
            "to load a file again, write it again (a new size or modification time makes "
            "it a new version)",
        )
    if spec.takes_snapshots:
        raise OperationError(
            name,
            "a snapshot table reads its whole source on every run, so it has no watermark "
            "to rewind.",
            "materialize the table again to take a new snapshot",
        )
    if not reason.strip():
        raise OperationError(name, "a rewind needs a reason.", "say why with --reason TEXT")
    if not by.strip():
        raise OperationError(name, "a rewind needs the name of who asks.", "pass --by WHO")
    value = parse_watermark(spec, to) if to is not None else None
    state = target.state(spec.watermark.kind) if target.exists() else None
    if state is None or (state.cursor is None and not state.last_load):
        raise OperationError(
            name,
            f"the table has not been loaded yet (no watermark in {target.path}), so there is "
            "nothing to rewind; its first run reads from partitioning.start "
            f"({format_value(spec.partitioning.start)}).",
            "materialize the table first",
        )
    before = state.cursor
    if before is None:
        raise OperationError(
            name,
            "the watermark is already reset: the next run reads from partitioning.start.",
            "nothing to do; materialize the table",
        )
    if value is not None and value >= before:
        raise OperationError(
            name,
            f"--to {format_value(value)} is not before the current watermark "
            f"{format_value(before)}; moving it forward would skip the rows in between.",
            f"give a value before {format_value(before)}",
        )
    metadata = {
        "operation": "reset" if value is None else "rewind",
        "watermark_kind": spec.watermark.kind,
        "cursor_before": format_value(before),
        "cursor_after": format_value(value),
        "by": by,
        "reason": reason,
    }
    try:
        version = target.record_rewind(spark, state, value, metadata)
    except ConcurrentLoadError:
        raise OperationError(
            name,
            "a load committed to the table while the rewind was being written; nothing "
            "was rewound.",
            "run the rewind again when no run of the table is in progress",
        ) from None
    return RewindResult(name, version, before, value, by, reason, _next_run_reads(spec, value))


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
        if value == NO_CURSOR:
            raise OperationError(spec.name, "--to is the reset marker.", "use --reset")
        return value
    time_text, bar, id_text = text.partition("|")
    if bar and wm.kind != "hybrid":
        raise OperationError(
            spec.name,
            f"--to {text!r} has an id part, but watermark '{wm.column}' is of kind '{wm.kind}'.",
            "give a timestamp alone, e.g. --to 2026-01-02T00:00:00Z",
        )
    try:
        instant = to_utc(datetime.fromisoformat(time_text.replace("Z", "+00:00")))
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
        return instant
    if not bar:
        return (instant, ID_MIN)
    try:
        return (instant, int(id_text))
    except ValueError:
        raise OperationError(
            spec.name,
            f"--to {text!r}: the part after '|' is not an integer ({wm.tiebreak} ids).",
            "write TIME|ID, e.g. --to '2026-01-02T00:00:00Z|1500'",
        ) from None


def _kind(spec: TableSpec) -> str:
    if spec.landing is not None:
        return "landing"
    return "snapshot" if spec.takes_snapshots else spec.watermark.kind


def _next_run_reads(spec: TableSpec, cursor: WatermarkValue | None) -> str:
    wm = spec.watermark
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
    return RewindRecord(
        version=int(commit["version"]),
        time=_commit_time(commit),
        cursor_before=str(commit.get("cursor_before", "-")),
        cursor_after=str(commit.get("cursor_after", "-")),
        by=str(commit.get("by", "")),
        reason=str(commit.get("reason", "")),
    )


def _commit_time(commit: dict) -> datetime:
    millis = int(commit.get("timestamp") or 0)
    return datetime.fromtimestamp(millis / 1000, tz=timezone.utc).replace(microsecond=0)
