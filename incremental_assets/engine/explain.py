"""Explain a run before doing it: its window, the predicate sent to the source, how many
source rows the window holds and which target files the merge would touch. Nothing is
written: the run's own probe (``load.probe``) plans the window, then one aggregation over
the window's rows counts them and takes their key range.

Example:
    >>> plan = explain(spark, spec, target, request)  # doctest: +SKIP
    >>> plan.rows, plan.target_files  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from incremental_assets.engine import predicates
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import IncrementalLoadError
from incremental_assets.engine.landing import pending_files
from incremental_assets.engine.landing_folder import LandedFile
from incremental_assets.engine.load import Probe, probe, window_rows
from incremental_assets.engine.predicates import Range
from incremental_assets.engine.sources.jdbc import JdbcSource, sql_condition
from incremental_assets.engine.transforms import quote
from incremental_assets.engine.watermarks import format_value, from_transaction_version
from incremental_assets.engine.windows import LoadRequest
from incremental_assets.specs import TableSpec
from incremental_assets.specs.durations import format_duration


@dataclass(frozen=True)
class Plan:
    """What a run of ``partition`` would do. ``rows`` counts the window's source rows
    before the newest version per key is kept (an upper bound of the rows staged);
    ``target_files`` are the live files whose key statistics overlap the window's key
    range (the files the merge may rewrite), None when the target does not exist yet."""

    table: str
    partition: str
    mode: str
    cursor_before: str
    high_water: str
    cursor_after: str
    window: str
    source: str
    predicate: str
    rows: int
    key_range: dict[str, tuple[str, str]] = field(default_factory=dict)
    source_files: tuple[int, int] | None = None
    target_files: list[str] | None = None
    target_files_total: int | None = None
    target_bytes: int | None = None
    note: str = ""

    @property
    def empty(self) -> bool:
        return self.rows == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "partition": self.partition,
            "mode": self.mode,
            "watermark_before": self.cursor_before,
            "high_water_mark": self.high_water,
            "watermark_after": self.cursor_after,
            "window": self.window,
            "source": self.source,
            "predicate": self.predicate,
            "source_files": list(self.source_files) if self.source_files else None,
            "rows": self.rows,
            "key_range": {k: list(v) for k, v in self.key_range.items()},
            "target_files": self.target_files,
            "target_files_total": self.target_files_total,
            "target_bytes": self.target_bytes,
            "note": self.note,
        }


def explain(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    request: LoadRequest,
    *,
    source_storage: Mapping[str, str] | None = None,
) -> Plan:
    """Plan the run of ``request`` for ``spec`` without writing anything.

    Raises:
        IncrementalLoadError: what the run itself would fail on in its probe (missing
            source or column, null watermarks, a snapshot partition in the past).
    """
    if spec.landing is not None:
        raise IncrementalLoadError(
            spec.name,
            "explain plans watermark windows; a landing table loads each new file once, "
            "by its path and version.",
            "use explain_landing, which lists the files the next run would load",
        )
    probed = probe(spark, spec, target, request, source_storage)
    window, source = probed.window, probed.source
    base = {
        "table": spec.name,
        "partition": request.partition_label or format_value(request.partition_start),
        "mode": window.mode,
        "cursor_before": format_value(window.cursor_before),
        "high_water": format_value(window.high_water),
        "cursor_after": format_value(window.cursor_after),
        "window": window.describe(),
        "source": source.describe(),
    }
    if window.is_empty:
        # Nothing to read and nothing to merge: no target file is touched.
        return Plan(
            **base,
            predicate="(none: the window is empty)",
            rows=0,
            target_files=None,
            note="none: the window is empty, so the run reads nothing and writes nothing",
        )
    rows, key_range = _rows_and_key_range(spec, probed)
    files = (getattr(source, "files_read", None), getattr(source, "files_total", None))
    touched, total, size, note = _target_files(spec, probed, key_range if rows else None)
    return Plan(
        **base,
        predicate=_predicate(spec, probed),
        rows=rows,
        key_range={k: (format_value(lo), format_value(hi)) for k, (lo, hi) in key_range.items()},
        source_files=files if None not in files else None,  # type: ignore[arg-type]
        target_files=touched,
        target_files_total=total,
        target_bytes=size,
        note=note,
    )


def _predicate(spec: TableSpec, probed: Probe) -> str:
    """The window as the SQL condition the source receives (for a database, the WHERE of
    the window's query; for files, the filter Spark pushes down to them)."""
    if spec.takes_snapshots:
        return "(none: a snapshot reads the whole source)"
    source, window = probed.source, probed.window
    wm = spec.watermark
    parts = predicates.window_parts(window, wm.column, spec.partition_column, wm.tiebreak)
    types = {f.name: f.dataType for f in source.schema.fields}
    raw = predicates.to_source_ranges(parts, types, spec.source.timezone)
    if isinstance(source, JdbcSource):
        return f"SELECT ... FROM {spec.source.table} WHERE {source._where(raw)}"
    return sql_condition(raw, types, lambda name: '"' + name.replace('"', '""') + '"')


def _rows_and_key_range(
    spec: TableSpec, probed: Probe
) -> tuple[int, dict[str, tuple[object, object]]]:
    """One aggregation over the window's prepared rows: their count and each key's range."""
    rows = window_rows(spec, probed.source, probed.window)
    types = {f.name: f.dataType for f in rows.schema.fields}

    def value(key: str):
        column = F.col(quote(key))
        # Collect instants as microseconds: PySpark turns timestamps into local-zone values.
        return F.unix_micros(column) if isinstance(types[key], TimestampType) else column

    aggregates = [F.count(F.lit(1)).alias("rows")]
    for i, key in enumerate(spec.keys):
        aggregates += [F.min(value(key)).alias(f"lo{i}"), F.max(value(key)).alias(f"hi{i}")]
    result = rows.agg(*aggregates).collect()[0]
    key_range = {}
    for i, key in enumerate(spec.keys):
        lo, hi = result[f"lo{i}"], result[f"hi{i}"]
        if isinstance(types[key], TimestampType) and lo is not None:
            lo, hi = (from_transaction_version(int(v), "timestamp") for v in (lo, hi))
        key_range[key] = (lo, hi)
    return int(result["rows"]), key_range


def _target_files(
    spec: TableSpec, probed: Probe, key_range: dict[str, tuple[object, object]] | None
) -> tuple[list[str] | None, int | None, int | None, str]:
    """Live target files the merge may rewrite: those whose key statistics overlap the
    window's key range, as delta-rs prunes them; with their total size."""
    state = probed.state
    if not state.exists or state.table is None:
        return None, None, None, "the target does not exist yet: the run creates it"
    live = delta_io.live_files(state.table)
    if spec.takes_snapshots:
        selected = live.to_pylist()
        note = "a snapshot is diffed against the whole target; files holding changed or "
        note += "vanished keys are rewritten"
    elif key_range is None:
        selected, note = [], "no source row in the window"
    else:
        part = tuple(Range(k, lo, True, hi, True) for k, (lo, hi) in key_range.items())
        selected, note = delta_io.prune_files(live, [part]), ""
    size = sum(int(row.get("size_bytes") or 0) for row in selected)
    return [str(row["path"]) for row in selected], live.num_rows, size, note


@dataclass(frozen=True)
class LandingPlan:
    """What the next run of a landing table would load: the ready file versions that are
    neither loaded nor quarantined (``pending``), and the files still settling or waiting
    for their marker (``waiting``). Listing only: no file is read."""

    table: str
    folder: str
    settle: str
    marker: str | None
    ready: int
    pending: list[LandedFile]
    waiting: list[LandedFile]

    @property
    def known(self) -> int:
        return self.ready - len(self.pending)

    def to_json(self) -> dict[str, Any]:
        def files(items: list[LandedFile]) -> list[dict[str, Any]]:
            return [
                {"path": f.path, "size": f.size, "modified": format_value(f.modified)}
                for f in items
            ]

        return {
            "table": self.table,
            "mode": "landing",
            "folder": self.folder,
            "settle": self.settle,
            "marker": self.marker,
            "ready": self.ready,
            "already_loaded_or_quarantined": self.known,
            "pending": files(self.pending),
            "waiting": files(self.waiting),
        }


def explain_landing(spec: TableSpec, target: DeltaTarget, now: datetime | None = None):
    """Plan the next run of a landing table without reading a file or writing anything.

    Raises:
        SourceNotFoundError: the folder cannot be listed (see ``pending_files``).
    """
    landing = spec.landing
    assert landing is not None, f"{spec.name} is not a landing table"
    pending, listing = pending_files(spec, target, now)
    return LandingPlan(
        table=spec.name,
        folder=str(spec.source.path),
        settle=format_duration(landing.settle),
        marker=landing.marker,
        ready=len(listing.ready),
        pending=pending,
        waiting=listing.waiting,
    )
