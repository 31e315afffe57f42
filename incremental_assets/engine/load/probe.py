"""The probe phase of a run, which writes nothing (``explain`` stops after it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import SparkSession

from incremental_assets.engine import cursor_range, late_files, validation
from incremental_assets.engine.delta_lake.store import DeltaTarget, TargetState
from incremental_assets.engine.guards import OutOfRange
from incremental_assets.engine.sources import Source, source_class
from incremental_assets.engine.sources.identity import check_unchanged
from incremental_assets.engine.strategies import strategy_for
from incremental_assets.engine.windows import LoadRequest, Window
from incremental_assets.specs import TableSpec


@dataclass(frozen=True)
class Probe:
    """What a run knows before it reads a row: the opened source, the target's committed
    state, the source's clock, and the window with the high-water mark captured."""

    source: Source
    state: TargetState
    clock: datetime
    window: Window
    out_of_range: OutOfRange | None = None
    # Folder and Delta sources: what this run records as covered, and what it reads late.
    ledger: late_files.FileLedger | None = None


@dataclass(frozen=True)
class Opened:
    """The target's committed state and the source, opened and checked."""

    source: Source
    state: TargetState


def open_source(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    source_storage: Mapping[str, str] | None = None,
) -> Opened:
    """Read the cursor from the target's Delta log, check that the source is the one the
    table was loaded from, open it and check its columns."""
    strategy = strategy_for(spec)
    target.check_catalog(spark)
    state = target.state(spec.watermark.kind)
    kind = source_class(spec.name, spec.source)
    check_unchanged(
        spec.name,
        state.source_identity,
        state.source_identity_version,
        kind.identity_of(spec.source),
        fields=kind.identity_fields,
        rewindable=not strategy.reads_whole_source,
    )
    cursor_range.check_cursor(spec, state.cursor)
    source = kind.open(spark, spec.name, spec.source, dict(source_storage or {}))
    validation.check_source_columns(spec, source.read([]).transform(strategy.shape()).schema)
    return Opened(source, state)


def probe(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    request: LoadRequest,
    source_storage: Mapping[str, str] | None = None,
    opened: Opened | None = None,
) -> Probe:
    """Open the source (unless ``opened`` says what ``open_source`` found), plan the
    window and capture the source's high-water mark (as the strategy reads)."""
    strategy = strategy_for(spec)
    opened = opened or open_source(spark, spec, target, source_storage)
    source, state = opened.source, opened.state
    clock = source.clock()
    window, outside = strategy.plan_window(source, state, request, clock)
    ledger = None
    if not strategy.reads_whole_source:
        column = spec.watermark.column
        ledger = late_files.plan(source, target, state, window.cursor_before, column)
        if ledger is not None:
            window = window.with_late_files(ledger.late)
    return Probe(source, state, clock, window, outside, ledger)
