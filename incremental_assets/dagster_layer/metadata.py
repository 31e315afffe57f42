"""A load result as Dagster materialization metadata (numbers the UI can plot)."""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg
from deltalake import DeltaTable

from incremental_assets.engine.delta_lake.catalog import sql_table
from incremental_assets.engine.delta_lake.io import spark_uri
from incremental_assets.engine.delta_lake.store import row_count
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


def column_schema(table: DeltaTable, roles: dict[str, str] | None = None) -> dg.TableSchema:
    """The Delta table's columns as Dagster's ``dagster/column_schema`` (read from the log,
    so the catalog shows what the table holds, after any schema evolution); ``roles``
    describes columns by name (key, watermark)."""
    roles = roles or {}
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=field.name,
                type=delta_type(field.type),
                description=roles.get(field.name),
                constraints=dg.TableColumnConstraints(nullable=field.nullable),
            )
            for field in table.schema().fields
        ]
    )


def delta_type(kind) -> str:
    """A Delta Lake column type as Spark SQL spells it (``array<long>``, ``struct<a:int>``)."""
    name = type(kind).__name__
    if name == "PrimitiveType":
        return kind.type
    if name == "ArrayType":
        return f"array<{delta_type(kind.element_type)}>"
    if name == "MapType":
        return f"map<{delta_type(kind.key_type)},{delta_type(kind.value_type)}>"
    if name == "StructType":
        return "struct<" + ",".join(_fields(kind.fields)) + ">"
    return str(kind)


def _fields(fields: Iterable) -> list[str]:
    return [f"{field.name}:{delta_type(field.type)}" for field in fields]


def table_metadata(table: DeltaTable | None, roles: dict[str, str] | None = None) -> dict:
    """Dagster's standard table metadata: the columns and the row count (from the log's
    file statistics: no scan)."""
    if table is None:
        return {}
    return {
        "dagster/column_schema": column_schema(table, roles),
        "dagster/row_count": row_count(table),
    }


def table_name_metadata(target_path: str, catalog_table: str | None) -> dict:
    """The table's name as Dagster's catalog shows it (``dagster/table_name``, a fully
    qualified name): its catalog name, or for a path target the name Spark SQL gives it
    (``delta.`<location>```), with ``dagster/uri`` the location and ``dagster/storage_kind``
    delta."""
    name = sql_table(spark_uri(target_path), None) if catalog_table is None else catalog_table
    return {
        "dagster/table_name": name,
        "dagster/storage_kind": "delta",
        "dagster/uri": target_path,
    }


def load_metadata(result: LoadResult, target_path: str) -> dict:
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
    metadata["spark_interpreted"] = result.interpreted
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
        for rule, count in result.quality.nulls.items():
            metadata[f"rows_null_{rule}"] = count
    if result.guard is not None:
        metadata.update(result.guard.metadata())
    if result.out_of_range is not None:
        metadata.update(result.out_of_range.metadata())
    if result.new_columns:
        metadata["new_columns"] = ", ".join(result.new_columns)
    if result.rows_by_partition:
        metadata["rows_by_partition"] = dg.MetadataValue.json(result.rows_by_partition)
    if result.source.split(" ", 1)[0] in ("parquet", "csv", "json", "delta"):
        # Folder and Delta sources: files that arrived after the run that passed their range.
        metadata["files_late"] = result.files_late
        metadata["rows_late"] = result.rows_late
    if result.late_unchecked:
        metadata["source_versions_unchecked"] = result.late_unchecked
    if result.small_files is not None:
        # Tables with target.compact_after: the small files the load left, and the
        # compaction after its commit (0 when not due).
        metadata["small_files"] = result.small_files
        metadata["files_compacted"] = result.files_compacted
        metadata["files_compacted_into"] = result.files_compacted_into
        if result.compaction_version is not None:
            metadata["compaction_version"] = result.compaction_version
    if result.compaction_note:
        metadata["small_files_not_counted"] = result.compaction_note
    if result.deleted_share is not None:
        # Tables with target.purge_after: the share of rows deletion vectors marked deleted
        # after the load, and the purge after its commit (0 when not due).
        metadata["deleted_share"] = round(result.deleted_share, 6)
        metadata["files_purged"] = result.files_purged
        metadata["files_purged_into"] = result.files_purged_into
        if result.purge_version is not None:
            metadata["purge_version"] = result.purge_version
    return metadata
