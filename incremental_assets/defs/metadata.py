"""A load result as Dagster materialization metadata (numbers the UI can plot)."""

from __future__ import annotations

import dagster as dg

from incremental_assets.engine.load import LoadResult
from incremental_assets.engine.watermarks import format_value

# Staged changes by kind: snapshot diffs, and versions of history (scd2) tables.
_CHANGE_NAMES = {
    "insert": "snapshot_inserted",
    "change": "snapshot_changed",
    "vanish": "snapshot_vanished",
    "open": "versions_opened",
    "close": "versions_closed",
    "update": "versions_updated_in_place",
    "remove": "versions_replaced",
}


def load_metadata(result: LoadResult, target_rows: int | None, target_path: str) -> dict:
    metadata: dict[str, object] = {
        "rows_extracted": result.rows_extracted,
        "rows_inserted": result.rows_inserted,
        "rows_updated": result.rows_updated,
        "rows_deleted": result.rows_deleted,
        "rows_unchanged": result.rows_unchanged,
        "duplicates_in_batch": result.duplicates_in_batch,
        "watermark_before": format_value(result.cursor_before),
        "watermark_after": format_value(result.cursor_after),
        "high_water_mark": format_value(result.high_water),
        "window": result.window,
        "mode": result.mode,
        "committed": result.committed,
        "delta_version": result.delta_version if result.delta_version is not None else -1,
        "files_added": result.files_added,
        "files_removed": result.files_removed,
        "source": result.source,
        "target": dg.MetadataValue.path(target_path),
    }
    if result.lag_seconds is not None:
        metadata["lag_seconds"] = float(result.lag_seconds)
    for phase, seconds in result.phase_seconds.items():
        metadata[f"seconds_{phase}"] = float(seconds)
    if result.gaps is not None:
        metadata["sequence_gaps"] = result.gaps.missing
        metadata["sequence_gap_ranges"] = result.gaps.describe()
    names = _CHANGE_NAMES
    for kind, count in result.changes.items():
        metadata[names.get(kind, f"changes_{kind}")] = count
    if result.quality is not None:
        metadata["rows_checked"] = result.quality.rows_checked
        metadata["quality_score"] = float(result.quality.score)
        metadata["rows_quarantined"] = result.quality.rows_quarantined
        for rule, count in result.quality.failures.items():
            metadata[f"rows_failing_{rule}"] = count
    if result.guard is not None:
        metadata.update(result.guard.metadata())
    if result.out_of_range is not None:
        metadata.update(result.out_of_range.metadata())
    if result.new_columns:
        metadata["new_columns"] = ", ".join(result.new_columns)
    if target_rows is not None:
        metadata["dagster/row_count"] = target_rows
    return metadata
