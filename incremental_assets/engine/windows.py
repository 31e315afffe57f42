"""Which rows a run reads: the window, planned from the cursor and the requested partitions.

A run is asked for a range of time partitions ``[start, end)``. It reads up to two parts:

- the **incremental part** ``(cursor - lookback, high-water mark]`` on the watermark column.
  The high-water mark is captured from the source before any row is read, and is capped
  below the range end (when partitions cut the watermark column) and below
  ``source clock - settle_lag``, so rows written during the run wait for the next one.
- the **backfill part** ``[start, end)`` on the partition column, limited to watermark
  values at or below the cursor. A backfill re-reads whole partition windows (and so loads
  rows that arrived later than any lookback) without running ahead of the cursor.

A plain run of the partition that holds the cursor (or a later one) reads only the
incremental part. A run whose partitions lie wholly behind the cursor, or a backfill,
reads the backfill part, plus the incremental part if the range reaches past the cursor.
"Behind" is measured on the partition column: the range ends at or before the highest
partition-column value incremental runs have loaded (the cursor itself when partitions cut
the watermark column). The cursor only ever moves forward, to the high-water mark of the
incremental part.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from incremental_assets.engine.errors import IncrementalLoadError
from incremental_assets.engine.watermarks import (
    ID_MAX,
    WatermarkKind,
    WatermarkValue,
    instant,
    shift_back,
    to_utc,
)

_MICRO = timedelta(microseconds=1)

Mode = Literal["incremental", "backfill", "backfill+incremental", "snapshot"]


@dataclass(frozen=True)
class LoadRequest:
    """What the orchestrator asks for: a range of partitions and how it was launched."""

    partition_start: datetime
    partition_end: datetime
    backfill: bool = False
    run_id: str = "manual"
    partition_label: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "partition_start", to_utc(self.partition_start))
        object.__setattr__(self, "partition_end", to_utc(self.partition_end))
        if self.partition_end <= self.partition_start:
            raise ValueError(
                f"partition range [{self.partition_start}, {self.partition_end}) is empty"
            )


@dataclass(frozen=True)
class WindowPolicy:
    """The table's watermark settings the planner needs (a view of the spec)."""

    kind: WatermarkKind
    lookback: timedelta | int
    settle_lag: timedelta
    partitions_cut_watermark: bool
    history_start: datetime


@dataclass(frozen=True)
class Window:
    """The planned window. ``high_water`` is filled in by the probe of the source."""

    mode: Mode
    cursor_before: WatermarkValue | None
    # Incremental part: watermark in (lower, high_water]; lower None means unbounded.
    incremental: bool
    lower: WatermarkValue | None
    cap: datetime | None  # exclusive cap the high-water mark must stay below (timestamps)
    # Backfill part: partition column in [start, end) and watermark <= cursor_before.
    backfill_range: tuple[datetime, datetime] | None
    high_water: WatermarkValue | None = None
    # Late part: files of a folder source, or of a Delta source's commits, new since the
    # last load (engine/late_files.py); their rows at or below the cursor, outside the
    # other parts, are read too.
    late_files: tuple[str, ...] = ()

    def with_high_water(self, value: WatermarkValue | None) -> Window:
        return replace(self, high_water=value)

    def with_late_files(self, files: tuple[str, ...]) -> Window:
        return replace(self, late_files=files)

    @property
    def upper(self) -> WatermarkValue | None:
        """Inclusive upper bound of the incremental part, once probed."""
        if not self.incremental:
            return None
        if self.high_water is None:
            return self.cursor_before
        if self.cursor_before is not None and self.high_water < self.cursor_before:
            return self.cursor_before
        return self.high_water

    @property
    def cursor_after(self) -> WatermarkValue | None:
        candidates = [v for v in (self.cursor_before, self.upper) if v is not None]
        return max(candidates) if candidates else None

    @property
    def reads_incremental(self) -> bool:
        """False when the incremental part cannot hold a row (no new rows, no lookback)."""
        if not self.incremental or self.upper is None:
            return False
        return self.lower is None or self.lower < self.upper

    @property
    def above_cursor(self) -> bool:
        """Every row the window reads, late files' rows aside (those are at or below the
        cursor), has a watermark above the cursor: the incremental part alone (no backfill
        part), from a cursor with no lookback."""
        return (
            self.mode == "incremental"
            and self.cursor_before is not None
            and self.lower == self.cursor_before
        )

    @property
    def is_empty(self) -> bool:
        return not self.reads_incremental and self.backfill_range is None and not self.late_files

    def describe(self) -> str:
        from incremental_assets.engine.watermarks import format_value

        if self.mode == "snapshot":
            return f"whole source, snapshot taken at {format_value(self.high_water)}"
        parts = []
        if self.reads_incremental:
            parts.append(f"watermark in ({format_value(self.lower)}, {format_value(self.upper)}]")
        if self.backfill_range:
            start, end = self.backfill_range
            parts.append(
                f"partition column in [{format_value(start)}, {format_value(end)})"
                f" and watermark <= {format_value(self.cursor_before)}"
            )
        if self.late_files:
            count = len(self.late_files)
            parts.append(
                f"watermark <= {format_value(self.cursor_before)} in {count} new "
                f"file{'s' if count != 1 else ''}"
            )
        return " OR ".join(parts) if parts else "empty"


def plan_window(
    policy: WindowPolicy,
    cursor: WatermarkValue | None,
    request: LoadRequest,
    source_clock: datetime,
    partition_high_water: datetime | None = None,
) -> Window:
    """Plan the window of one run (before the source's high-water mark is known).

    ``partition_high_water`` is the highest partition-column value incremental runs have
    loaded; a range ending at or before it lies behind the cursor. When partitions cut the
    watermark column it is the cursor itself.
    """
    start, end = request.partition_start, request.partition_end
    if policy.partitions_cut_watermark:
        partition_high_water = instant(cursor) if cursor is not None else None
        assert partition_high_water is None or isinstance(partition_high_water, datetime)
    behind = cursor is not None and partition_high_water is not None and end <= partition_high_water

    incremental = not behind
    backfill = (request.backfill or behind) and cursor is not None

    lower: WatermarkValue | None
    if cursor is not None:
        lower = shift_back(cursor, policy.lookback)
    elif policy.kind == "timestamp":
        # The first load starts at the table's history start (inclusive).
        lower = policy.history_start - _MICRO
    elif policy.kind == "hybrid":
        lower = (policy.history_start - _MICRO, ID_MAX)
    else:
        lower = None

    cap: datetime | None = None
    if policy.kind in ("timestamp", "hybrid"):
        if policy.settle_lag:
            cap = to_utc(source_clock) - policy.settle_lag + _MICRO
        if policy.partitions_cut_watermark:
            cap = end if cap is None else min(cap, end)

    mode: Mode
    if backfill and incremental:
        mode = "backfill+incremental"
    elif backfill:
        mode = "backfill"
    else:
        mode = "incremental"
    return Window(
        mode=mode,
        cursor_before=cursor,
        incremental=incremental,
        lower=lower,
        cap=cap,
        backfill_range=(start, end) if backfill else None,
    )


def snapshot_window(
    table: str,
    cursor: WatermarkValue | None,
    request: LoadRequest,
    source_clock: datetime,
    last_partition_end: datetime | None,
) -> Window:
    """A snapshot table's run: the source's whole current state, taken now.

    The cursor is the time the snapshot was taken. A snapshot source only has its present
    state, so a partition older than the one the last snapshot was taken for cannot be
    rebuilt: such a run is refused rather than labelling today's state with a past day.
    """
    if last_partition_end is not None and request.partition_end < last_partition_end:
        raise IncrementalLoadError(
            table,
            "this table takes snapshots of its source's current state, which cannot be "
            f"rebuilt for partition {request.partition_label or request.partition_start} "
            f"(older than the partition of the last snapshot, ending "
            f"{last_partition_end.isoformat()}).",
            "materialize the latest partition; a backfill of a snapshot table cannot "
            "recover past states",
        )
    taken_at = to_utc(source_clock)
    if isinstance(cursor, datetime) and taken_at <= cursor:
        taken_at = cursor + _MICRO  # the clock went back: keep snapshot times increasing
    return Window(
        mode="snapshot",
        cursor_before=cursor,
        incremental=True,
        lower=None,
        cap=None,
        backfill_range=None,
        high_water=taken_at,
    )
