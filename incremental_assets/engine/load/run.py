"""One incremental load: probe -> window -> extract -> validate -> stage -> commit.

Example:
    >>> result = run_load(spark, spec, DeltaTarget(spec.name, path), request)  # doctest: +SKIP
    >>> result.rows_inserted, result.cursor_after  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack, nullcontext

from pyspark.sql import SparkSession

from incremental_assets.engine import late_files, staging
from incremental_assets.engine.delta_lake.preload import snapshot_preloaded
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.disk_full import naming_full_disks
from incremental_assets.engine.faults import crash_point
from incremental_assets.engine.load.commit import commit
from incremental_assets.engine.load.interpreted import interpreted, is_small, table_bytes
from incremental_assets.engine.load.probe import open_source, probe
from incremental_assets.engine.load.result import LoadResult, Phases, result
from incremental_assets.engine.load.stage import extract, rows_by_partition
from incremental_assets.engine.load.upkeep import after_load
from incremental_assets.engine.spark import remote
from incremental_assets.engine.store_errors import naming_store_errors
from incremental_assets.engine.strategies import strategy_for
from incremental_assets.engine.unreadable import naming_source_files
from incremental_assets.engine.windows import LoadRequest
from incremental_assets.specs import TableSpec

Hook = Callable[[str], None]


def run_load(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    request: LoadRequest,
    *,
    source_storage: Mapping[str, str] | None = None,
    staging_dir: str | None = None,
    hook: Hook | None = None,
) -> LoadResult:
    """Load one window of ``spec``'s source into ``target``, exactly once. (A landing
    folder is loaded by file instead: ``engine.landing.run_landing_load``.)

    ``hook`` is called with a phase name (``probed``, ``staged``, ``committed``) as the run
    passes it; tests use it to change the source mid-run.

    Raises:
        IncrementalLoadError: bad source, schema or rows, or a full disk (DiskFullError);
            nothing is committed.
    """
    staging_root = staging.root_of(spec.name, target.path, staging_dir)
    stores = {
        "target": (target.path, "warehouse.root (or the table's target.path)"),
        "staging folder": (staging_root, "the warehouse resource's staging_dir"),
        "source": (spec.source.path or "", "the table's source.path"),
    }
    with (
        remote.naming_lost_server(spark),
        naming_store_errors(spec.name, stores),
        naming_full_disks(spark, spec.name, target.path, staging_dir or staging_root),
        ExitStack() as stack,
    ):
        return _run_load(spark, spec, target, request, source_storage, staging_root, hook, stack)


def _run_load(
    spark: SparkSession,
    spec: TableSpec,
    target: DeltaTarget,
    request: LoadRequest,
    source_storage: Mapping[str, str] | None,
    staging_root: str,
    hook: Hook | None,
    stack: ExitStack,
) -> LoadResult:
    """``stack``: what the run enters is left as it ends (the interpreted settings of a
    small run, engine/load/interpreted.py)."""
    hook = hook or (lambda _phase: None)
    phase = Phases()
    started = time.perf_counter()

    source_path = spec.source.path or ""
    with phase("probe"), naming_source_files(spec.name, source_path, source_storage):
        opened = open_source(spark, spec, target, source_storage)
        small = is_small(opened.source.scan_bytes(), lambda: table_bytes(opened.state.table))
        ran_interpreted = stack.enter_context(interpreted(spark, small))
        probed = probe(spark, spec, target, request, source_storage, opened)
    source, state, clock, window = probed.source, probed.state, probed.clock, probed.window
    # Rows are hashed the target's way: its stored hashes are compared with theirs.
    strategy = strategy_for(spec, state.row_hash)
    hook("probed")

    if window.is_empty:
        return result(
            spec,
            source,
            window,
            state,
            None,
            0,
            0,
            clock,
            phase,
            started,
            out_of_range=probed.out_of_range,
            late_unchecked=_unchecked(probed.ledger),
            interpreted=ran_interpreted,
        )

    with (
        staging.run_folder(spark, staging_root) as stage_root,
        staging.vanished_as(stage_root, target.concurrent_error),
    ):
        with (
            phase("extract"),
            naming_source_files(spec.name, source_path, source_storage),
            snapshot_preloaded(spark, target.sql_table, state.exists),
        ):
            extracted = extract(
                spark, strategy, source, window, state, target, stage_root, request.run_id
            )
        hook("staged")
        crash_point("after_extract")

        # An increment written once reads the source as the commit writes it.
        written_once = extracted.increment is not None
        with (
            phase("commit"),
            (
                naming_source_files(spec.name, source_path, source_storage)
                if written_once
                else nullcontext()
            ),
        ):
            committed = commit(
                spark,
                strategy,
                target,
                state,
                request,
                window,
                extracted,
                probed.out_of_range,
                probed.ledger,
                source.identity,
            )
        hook("committed")
        if written_once:
            # Written once: what its write counted. Its rows, if the count did not come
            # back, are the rows the commit wrote (short of a change set's hard deletes,
            # which a new table holds no row for and the write leaves out).
            counted = {"rows": committed.rows_inserted, **committed.written}
            extracted = extracted.written(strategy, counted)
        by_partition = {}
        if committed.committed:
            late_files.record_after_commit(spark, target, probed.ledger, committed.version)
            by_partition = rows_by_partition(spark, strategy, target, extracted, committed)
        crash_point("after_commit")

    purge = compaction = None
    if committed.committed and (spec.target.purge_after or spec.target.compact_after):
        with phase("compact"):
            purge, compaction = after_load(spark, target, spec.target, committed.version)
    return result(
        spec,
        source,
        window,
        state,
        committed,
        extracted.rows_extracted,
        extracted.rows_staged,
        clock,
        phase,
        started,
        new_columns=tuple(extracted.new_columns),
        gaps=extracted.gaps,
        changes=extracted.changes,
        unchanged=extracted.unchanged,
        events_recovered=extracted.events_recovered,
        quality=extracted.quality,
        guard=extracted.guard,
        out_of_range=probed.out_of_range,
        rows_late=extracted.rows_late,
        files_late=extracted.files_late,
        late_unchecked=_unchecked(probed.ledger),
        rows_by_partition=by_partition,
        interpreted=ran_interpreted,
    ).with_upkeep(purge, compaction)


def _unchecked(ledger: late_files.FileLedger | None) -> str:
    return str(late_files.metadata(ledger).get(late_files.UNCHECKED_KEY, ""))
