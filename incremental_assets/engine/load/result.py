"""The result phase of a run: what it did, for metadata and checks (``LoadResult``), and
the time each phase took."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime

from incremental_assets.engine import quality
from incremental_assets.engine.delta_lake.maintenance import Compaction, Purge
from incremental_assets.engine.delta_lake.store import CommitResult, TargetState
from incremental_assets.engine.gaps import Gaps
from incremental_assets.engine.guards import GuardReport, OutOfRange
from incremental_assets.engine.sources import Source
from incremental_assets.engine.watermarks import WatermarkValue, lag_seconds
from incremental_assets.engine.windows import Window
from incremental_assets.specs import TableSpec


@dataclass(frozen=True)
class LoadResult:
    """What a run did, for metadata and checks. Counts come from the write itself."""

    table: str
    mode: str
    window: str
    cursor_before: WatermarkValue | None
    cursor_after: WatermarkValue | None
    high_water: WatermarkValue | None
    rows_extracted: int
    rows_staged: int
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    committed: bool
    delta_version: int | None
    lag_seconds: float | None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    files_added: int = 0
    files_removed: int = 0
    new_columns: tuple[str, ...] = ()
    source: str = ""
    gaps: Gaps | None = None
    # Snapshot and history tables: staged change rows by kind (insert/change/vanish, or
    # open/close/update/remove versions) and the rows that needed no write.
    changes: dict[str, int] = field(default_factory=dict)
    unchanged: int | None = None
    # History tables: events already logged, but by a run that died before its commit,
    # whose versions this run wrote (ChangeLog.uncommitted; counted only when the run
    # found no new event).
    events_recovered: int = 0
    quality: quality.QualityReport | None = None
    # Landing tables: the files seen, loaded, waiting and quarantined (landing.LandingReport).
    landing: object | None = None
    # Snapshot and CDC tables: the deletes this run makes against the guard's limit.
    guard: GuardReport | None = None
    # Time watermarks: source rows no window can reach (before the start, far in the future).
    out_of_range: OutOfRange | None = None
    # Folder and Delta sources: rows at or below the cursor the run read from files (or
    # commits) new since the last load, and the files that held them (engine/late_files.py).
    files_late: int = 0
    rows_late: int = 0
    # Delta sources: versions since the last load whose rows at or below the cursor could
    # not be checked (rewrites without a change data feed), or why ("" when none).
    late_unchecked: str = ""
    # Loaded rows by partition key (engine/load/stage.py rows_by_partition).
    rows_by_partition: dict[str, int] = field(default_factory=dict)
    # Whether the run's queries ran without Spark's code generation (a small run,
    # engine/load/interpreted.py).
    interpreted: bool = False
    # Tables with target.compact_after (engine/load/upkeep.py): the small files the load
    # left in the table (None: not counted, compaction_note says why), the files the
    # compaction after it removed and wrote (0 when not due) and its commit's version.
    small_files: int | None = None
    files_compacted: int = 0
    files_compacted_into: int = 0
    compaction_version: int | None = None
    compaction_note: str = ""
    # Tables with target.purge_after (engine/load/upkeep.py): the share of the table's rows
    # its deletion vectors marked deleted after the load (None: not counted), the files
    # the purge after it rewrote and wrote (0 when not due) and its commit's version.
    deleted_share: float | None = None
    files_purged: int = 0
    files_purged_into: int = 0
    purge_version: int | None = None

    @property
    def rows_unchanged(self) -> int:
        if self.unchanged is not None:
            return self.unchanged
        # Staged rows the merge did not write (a CDC delete is staged and deletes a row).
        return self.rows_staged - self.rows_inserted - self.rows_updated - self.rows_deleted

    @property
    def duplicates_in_batch(self) -> int:
        """Extracted rows superseded by a newer row of their key in the same batch (or by a
        tombstone); quarantined rows are counted apart."""
        if self.unchanged is not None:
            return 0
        quarantined = self.quality.rows_quarantined if self.quality else 0
        return self.rows_extracted - self.rows_staged - quarantined

    def with_upkeep(self, purge: Purge | None, compaction: Compaction | None) -> LoadResult:
        """This result with the purge and the compaction after its commit
        (``upkeep.after_load``; None: not asked for)."""
        found = {}
        if purge is not None:
            found.update(
                deleted_share=purge.deleted_share,
                files_purged=purge.files_purged,
                files_purged_into=purge.files_written,
                purge_version=purge.version,
            )
        if compaction is not None:
            found.update(
                small_files=compaction.small_files,
                files_compacted=compaction.files_compacted,
                files_compacted_into=compaction.files_written,
                compaction_version=compaction.version,
                compaction_note=compaction.note,
            )
        return replace(self, **found) if found else self


class Phases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - start, 3)


def result(
    spec: TableSpec,
    source: Source,
    window: Window,
    state: TargetState,
    commit: CommitResult | None,
    rows_extracted: int,
    rows_staged: int,
    clock: datetime,
    phase: Phases,
    started: float,
    new_columns: tuple[str, ...] = (),
    gaps: Gaps | None = None,
    changes: dict[str, int] | None = None,
    unchanged: int | None = None,
    events_recovered: int = 0,
    quality: quality.QualityReport | None = None,
    guard: GuardReport | None = None,
    out_of_range: OutOfRange | None = None,
    rows_late: int = 0,
    files_late: int = 0,
    late_unchecked: str = "",
    rows_by_partition: dict[str, int] | None = None,
    interpreted: bool = False,
) -> LoadResult:
    phase.seconds["total"] = round(time.perf_counter() - started, 3)
    committed = bool(commit and commit.committed)
    cursor_after = window.cursor_after if committed else window.cursor_before
    return LoadResult(
        table=spec.name,
        mode=window.mode,
        window=window.describe(),
        cursor_before=window.cursor_before,
        cursor_after=cursor_after,
        high_water=window.high_water,
        rows_extracted=rows_extracted,
        rows_staged=rows_staged,
        rows_inserted=commit.rows_inserted if commit else 0,
        rows_updated=commit.rows_updated if commit else 0,
        rows_deleted=commit.rows_deleted if commit else 0,
        committed=committed,
        delta_version=commit.version if commit else state.version,
        lag_seconds=lag_seconds(cursor_after, clock),
        phase_seconds=dict(phase.seconds),
        files_added=commit.files_added if commit else 0,
        files_removed=commit.files_removed if commit else 0,
        new_columns=new_columns,
        source=source.describe(),
        gaps=gaps,
        changes=dict(changes or {}),
        unchanged=unchanged,
        events_recovered=events_recovered,
        quality=quality,
        guard=guard,
        out_of_range=out_of_range,
        files_late=files_late,
        late_unchecked=late_unchecked,
        rows_late=rows_late,
        rows_by_partition=dict(rows_by_partition or {}),
        interpreted=interpreted,
    )
