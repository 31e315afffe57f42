"""Incremental load vs full reload, on one machine, for targets of growing size and for
several strategies (``bench_cases.py``: upsert of a mutable table; CDC with hard and with
soft deletes of a change feed).

For each size N and each source scenario that the chosen cases use:

1. write the scenario's source of N rows as a Delta table, in chunks (one file per
   chunk), with pyarrow and delta-rs;
2. build each case's target with the engine's own first load (``run_load`` on an empty
   target over all history): timed and reported as the initial load; it also records the
   cursor;
3. change the source the way such a source changes: a delta-rs merge of updates and new
   orders into the ``orders`` table, or an appended batch of I/U/D events (with
   duplicates) to the change feed, all stamped later than anything loaded;
4. for each case, time one incremental ``run_load`` (the increment only), then empty runs
   (nothing new since: the fixed per-run overhead), then a full reload of the same source
   into a fresh target, done the way a user of the tool does it: ``run_load`` on an empty
   target with one partition range covering all history (the same end state);
5. for the upsert case, also time the same increment applied by hand: a notebook's
   ``DeltaTable.forPath(...).merge`` into a copy of the initial target, and dlt's merge
   (``write_disposition="merge"`` into a Delta table) into a table dlt's own first run
   seeded with the initial source (untimed; dlt comes from the ``bench`` extra, and its
   column shows ``-`` without it).

Every run's *rows written* is counted the same way from its Delta commits: the rows in
the data files they added (``num_output_rows`` of a merge: inserted, updated and unchanged
rows copied out of rewritten files; every row of a plain write).

Run from the repository root::

    .venv/bin/python benchmarks/incremental_vs_full.py      # all cases at their sizes
    .venv/bin/python benchmarks/incremental_vs_full.py --cases cdc_hard,cdc_soft
    .venv/bin/python benchmarks/incremental_vs_full.py --cases upsert,cdc_hard --sizes 5000000
    .venv/bin/python benchmarks/incremental_vs_full.py --sizes 100000,200000 --increment 5000
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from bench_cases import (
    CASES,
    HISTORY_START,
    Case,
    Increment,
    Scenario,
    day_after,
    day_floor,
    instant,
    last_existing_update_us,
)
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget, LoadRequest, LoadResult, run_load
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.io import KeySet
from incremental_assets.engine.delta_lake.store import operation_metrics, row_count
from incremental_assets.engine.spark_session import local_session
from incremental_assets.engine.watermarks import to_transaction_version

T = TypeVar("T")

DLT_MISSING = "dlt merge: dlt is not installed; pip install -e '.[bench]' adds that column"


# --- measurements ---------------------------------------------------------------------


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def live_files(path: str) -> int:
    return len(DeltaTable(path).file_uris())


def files_overlapping(path: str, low: int, high: int) -> int:
    """Live files whose order_id statistics overlap [low, high]: the files a merge of keys
    in that range has to read at least (delta-rs prunes the rest by the same statistics)."""
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    mins = actions.column("min.order_id").to_pylist()
    maxs = actions.column("max.order_id").to_pylist()
    return sum(
        1
        for lo, hi in zip(mins, maxs, strict=True)
        if lo is None or hi is None or (lo <= high and hi >= low)
    )


def files_holding_keys(path: str, increment: Increment) -> str:
    """For a history (scd2) table: the files of the target and of its change log that the
    engine reads (those whose statistics bracket one of the increment's keys)."""
    keys = KeySet("order_id", sorted(set(increment.table.column("order_id").to_pylist())))
    parts = []
    for table_path in (path, f"{path}__changes"):
        actions = delta_io.live_files(DeltaTable(table_path))
        parts.append(f"{len(delta_io.files_holding(actions, keys))} of {actions.num_rows}")
    return f"files holding the increment's keys: target {parts[0]}, change log {parts[1]}"


def last_operation_metrics(path: str) -> dict:
    """The last commit's metrics by delta-rs's names (``num_target_rows_copied``, ...)."""
    return operation_metrics(DeltaTable(path).history(1)[0])


def rows_written(path: str, after_version: int) -> int:
    """Rows in the data files that the commits after ``after_version`` added, from their
    metrics: a merge's ``num_output_rows`` (inserted, updated, and unchanged rows copied
    out of the files it rewrote), a write's rows. The same count whoever wrote the commits
    (Spark or delta-rs)."""
    total = 0
    for commit in DeltaTable(path).history():
        if commit["version"] > after_version:
            metrics = operation_metrics(commit)
            total += int(metrics.get("num_output_rows", metrics.get("num_added_rows", 0)) or 0)
    return total


@dataclass
class Baseline:
    """The same increment applied another way: its time, the rows its commits wrote, and
    the rows its table holds after (checked against the incremental target)."""

    seconds: float
    rows_written: int
    rows_after: int


def notebook_merge(spark, source: str, target: str, after_us: int) -> float:
    """What a hand-written notebook does for the upsert case, timed: read the source rows
    changed after the last load (one filter on ``updated_at``), keep the newest per key,
    and ``DeltaTable.forPath(...).merge`` them (update all when newer, insert the rest),
    without metadata, checks or a recorded cursor."""
    from delta.tables import DeltaTable as SparkDeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def run() -> None:
        changed = (
            spark.read.format("delta")
            .load(source)
            .filter(F.col("updated_at") > F.timestamp_micros(F.lit(after_us)))
        )
        newest = Window.partitionBy("order_id").orderBy(F.col("updated_at").desc())
        changed = changed.withColumn("_n", F.row_number().over(newest)).filter("_n = 1")
        changed = changed.drop("_n")
        # The source's columns (the copy of the target also holds the engine's row hash).
        every = {c: f"s.{c}" for c in changed.columns}
        (
            SparkDeltaTable.forPath(spark, target)
            .alias("t")
            .merge(changed.alias("s"), "t.order_id = s.order_id")
            .whenMatchedUpdate(condition="s.updated_at > t.updated_at", set=every)
            .whenNotMatchedInsert(values=every)
            .execute()
        )

    return timed(run)[1]


def notebook_baseline(spark, p: Prepared, source: str, say: Callable[[str], None]) -> Baseline:
    """The increment merged by hand into a copy of the same initial target."""
    copy = str(p.root / "notebook")
    shutil.copytree(p.target.path, copy)
    before = DeltaTable(copy).version()
    after = int(to_transaction_version(p.target.state("timestamp").cursor, "timestamp"))
    seconds = notebook_merge(spark, source, copy, after)
    result = Baseline(seconds, rows_written(copy, before), row_count(DeltaTable(copy)))
    say(
        f"{p.case.name}: notebook merge (DeltaTable.forPath): {seconds:.1f}s, "
        f"{result.rows_written:,} rows written"
    )
    shutil.rmtree(copy, ignore_errors=True)
    return result


# --- dlt's merge (the ``bench`` extra) ------------------------------------------------


def dlt_installed() -> bool:
    return importlib.util.find_spec("dlt") is not None


@dataclass
class DltTarget:
    """A dlt pipeline that loads the ``orders`` source into a Delta table on a local
    bucket, as a dlt user writes it: a resource with dlt's own ``updated_at`` cursor,
    ``primary_key="order_id"``, ``write_disposition="merge"`` (dlt's ``upsert`` strategy
    for Delta tables: a delta-rs merge on the key, update all, insert all) and
    ``table_format="delta"``, everything else dlt's defaults."""

    pipeline: Any
    source: str
    path: str  # the Delta table dlt writes: <bucket>/<dataset>/<table>

    @classmethod
    def create(cls, source: str, root: Path) -> DltTarget:
        # A benchmark sends no usage telemetry; dlt's schema-hint warnings (the key is
        # nullable in the Arrow schema) would only clutter the output.
        os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
        os.environ.setdefault("RUNTIME__LOG_LEVEL", "ERROR")
        import dlt

        pipeline = dlt.pipeline(
            pipeline_name="orders_bench",
            destination=dlt.destinations.filesystem(bucket_url=str(root / "bucket")),
            dataset_name="bench",
            pipelines_dir=str(root / "pipelines"),
        )
        return cls(pipeline, source, str(root / "bucket" / "bench" / "orders"))

    def run(self) -> None:
        """One ``pipeline.run``: the source rows changed since the last run, read as Arrow,
        extracted, normalized and merged by dlt."""
        import dlt

        source = self.source

        @dlt.resource(
            name="orders",
            primary_key="order_id",
            write_disposition="merge",
            table_format="delta",
        )
        def orders(
            # dlt declares the cursor as the argument's default (its documented form).
            updated_at: Any = dlt.sources.incremental("updated_at"),  # noqa: B008
        ) -> Iterator[pa.RecordBatch]:
            last = updated_at.last_value
            changed = None if last is None else pc.field("updated_at") > last
            yield from DeltaTable(source).to_pyarrow_dataset().to_batches(filter=changed)

        self.pipeline.run(orders())


def dlt_seed(case: Case, source: str, root: Path, say: Callable[[str], None]) -> DltTarget:
    """dlt's target for a case, filled by the pipeline's own first run over the initial
    source (untimed for the table: it stands for the user's first load)."""
    target, seconds = timed(lambda: DltTarget.create(source, root))
    _, run_s = timed(target.run)
    say(
        f"{case.name}: dlt first run (seeds its Delta table, not reported): "
        f"{row_count(DeltaTable(target.path)):,} rows, {live_files(target.path)} files in "
        f"{seconds + run_s:.1f}s"
    )
    return target


def dlt_baseline(target: DltTarget, case: Case, say: Callable[[str], None]) -> Baseline:
    """dlt's second run, timed: it reads the increment and merges it into its table."""
    before = DeltaTable(target.path).version()
    files_before = live_files(target.path)
    _, seconds = timed(target.run)
    table = DeltaTable(target.path)
    commit = table.history(1)[0]
    merge = operation_metrics(commit)
    result = Baseline(seconds, rows_written(target.path, before), row_count(table))
    pruned = "predicate" in (commit.get("operationParameters") or {})
    say(
        f"{case.name}: dlt merge (pipeline.run): {seconds:.1f}s, {commit['operation']} "
        f"{int(merge.get('execution_time_ms', 0)) / 1000:.1f}s "
        f"+{merge.get('num_target_rows_inserted')} ~{merge.get('num_target_rows_updated')} "
        f"rows; files removed {merge.get('num_target_files_removed')} of {files_before}, "
        f"added {merge.get('num_target_files_added')}; {result.rows_written:,} rows written "
        f"({merge.get('num_target_rows_copied')} copied); target pruned by the source's "
        f"keys: {'yes' if pruned else 'no'}"
    )
    return result


@dataclass
class CaseResult:
    case: Case
    rows: int
    increment: Increment
    source_files: int
    initial_s: float
    initial: LoadResult
    target_files: int
    incremental_s: float
    files_overlapping: int
    merge_metrics: dict
    incremental: LoadResult
    empty_s: float
    empty: LoadResult
    full_s: float
    full: LoadResult
    rows_incremental_target: int
    rows_full_target: int
    incremental_written: int
    full_written: int
    notebook: Baseline | None = None
    dlt: Baseline | None = None
    mismatch: str = ""

    @property
    def ratio(self) -> float:
        return self.full_s / self.incremental_s if self.incremental_s else float("nan")

    @property
    def rows_copied(self) -> int:
        return int(self.merge_metrics.get("num_target_rows_copied", 0))

    @property
    def merge_s(self) -> float:
        """Spark's MERGE alone (its own execution time), inside the commit phase."""
        return int(self.merge_metrics.get("execution_time_ms", 0)) / 1000


@dataclass
class Prepared:
    """A case whose target holds the initial load, waiting for the increment."""

    case: Case
    root: Path
    target: DeltaTarget
    initial: LoadResult
    initial_s: float
    target_files: int
    dlt: DltTarget | None = None


def initial_request(rows: int) -> LoadRequest:
    return LoadRequest(
        HISTORY_START, day_after(instant(last_existing_update_us(rows))), run_id="initial"
    )


def run_scenario(
    spark, scenario: Scenario, cases: list[Case], rows: int, args, verbose: bool = True
) -> list[CaseResult]:
    """One source of ``rows`` rows, loaded and then incremented through each case."""
    root = Path(args.data_dir) / f"{scenario.name}_{rows}"
    shutil.rmtree(root, ignore_errors=True)
    stage = root / "stage"
    stage.mkdir(parents=True)
    source = str(root / "source")
    say = _say(rows, scenario.name) if verbose else (lambda _text: None)

    source_files, generate_s = timed(lambda: scenario.write_source(source, rows, args.chunk_rows))
    say(f"source written: {source_files} files in {generate_s:.1f}s")

    prepared = []
    for case in cases:
        case_root = root / case.name
        spec = case.spec(source, str(case_root / "target"))
        target = DeltaTarget(spec.name, str(case_root / "target"))
        initial, initial_s = timed(
            lambda s=spec, t=target: run_load(
                spark, s, t, initial_request(rows), staging_dir=str(stage)
            )
        )
        prepared.append(
            Prepared(case, case_root, target, initial, initial_s, live_files(target.path))
        )
        say(
            f"{case.name}: initial load: {initial.rows_inserted} rows, "
            f"{live_files(target.path)} files in {initial_s:.1f}s {initial.phase_seconds}"
        )
        if case.merge_baselines and dlt_installed():
            prepared[-1].dlt = dlt_seed(case, source, case_root / "dlt", say)

    increment = scenario.increment(rows, args.increment, seed=rows)
    applied, source_update_s = timed(lambda: scenario.apply(source, increment))
    say(f"source changed ({increment.description}): {applied} in {source_update_s:.1f}s")

    results = [
        measure(spark, p, source, rows, increment, source_files, args, stage, say) for p in prepared
    ]
    if not args.keep_data:
        shutil.rmtree(root, ignore_errors=True)
    return results


def measure(
    spark, p: Prepared, source: str, rows: int, increment: Increment, source_files: int,
    args, stage: Path, say: Callable[[str], None],
) -> CaseResult:  # fmt: skip
    case, target = p.case, p.target
    spec = case.spec(source, target.path)
    # The daily partitions an orchestrator would run next: through the increment's day.
    run_request = LoadRequest(
        day_floor(instant(increment.first_us)),
        day_after(instant(increment.last_us)),
        run_id="incremental",
    )
    overlapping = files_overlapping(target.path, *increment.key_range)
    notebook = dlt = None
    if case.merge_baselines:
        notebook = notebook_baseline(spark, p, source, say)
        if p.dlt is not None:
            dlt = dlt_baseline(p.dlt, case, say)
    if spec.history:
        say(f"{case.name}: {files_holding_keys(target.path, increment)}")
    before = DeltaTable(target.path).version()
    incremental, incremental_s = timed(
        lambda: run_load(spark, spec, target, run_request, staging_dir=str(stage))
    )
    say(
        f"{case.name}: incremental: {incremental_s:.1f}s {incremental.phase_seconds} "
        f"+{incremental.rows_inserted} ~{incremental.rows_updated} "
        f"-{incremental.rows_deleted} rows; files overlapping the increment's keys "
        f"{overlapping} of {p.target_files}, removed {incremental.files_removed} added "
        f"{incremental.files_added}"
    )
    merge_metrics = last_operation_metrics(target.path)
    incremental_written = rows_written(target.path, before)

    empties = []
    for i in range(args.empty_runs):
        request = LoadRequest(
            run_request.partition_start, run_request.partition_end, run_id=f"e{i}"
        )
        empties.append(timed(lambda r=request: run_load(spark, spec, target, r)))
    empty, empty_s = sorted(empties, key=lambda e: e[1])[len(empties) // 2]
    say(f"{case.name}: empty run: {empty_s:.2f}s (median of {len(empties)}), {empty.window}")

    full_path = str(p.root / "full")
    full_spec = case.spec(source, full_path)
    full_target = DeltaTarget(full_spec.name, full_path)
    full_request = LoadRequest(HISTORY_START, day_after(instant(increment.last_us)), run_id="full")
    full, full_s = timed(
        lambda: run_load(spark, full_spec, full_target, full_request, staging_dir=str(stage))
    )
    say(
        f"{case.name}: full reload: {row_count(full_target.open())} rows, "
        f"{live_files(full_path)} files in {full_s:.1f}s {full.phase_seconds}"
    )

    result = CaseResult(
        case=case,
        rows=rows,
        increment=increment,
        source_files=source_files,
        initial_s=p.initial_s,
        initial=p.initial,
        target_files=p.target_files,
        incremental_s=incremental_s,
        files_overlapping=overlapping,
        merge_metrics=merge_metrics,
        incremental=incremental,
        empty_s=empty_s,
        empty=empty,
        full_s=full_s,
        full=full,
        rows_incremental_target=row_count(target.open()),
        rows_full_target=row_count(full_target.open()),
        incremental_written=incremental_written,
        full_written=rows_written(full_path, -1),
        notebook=notebook,
        dlt=dlt,
    )
    result.mismatch = check(result, args, spark, spec, target)
    if result.mismatch:
        say(f"{case.name}: WARNING: {result.mismatch}")
    return result


def check(result: CaseResult, args, spark, spec, target) -> str:
    """The incremental run did what the increment asks, and matches the full reload."""
    problems = []
    inc = result.incremental
    if result.initial.rows_inserted != result.rows:
        problems.append(f"initial load wrote {result.initial.rows_inserted} rows")
    if inc.mode != "incremental":
        problems.append(f"the timed run was a {inc.mode} run")
    reported = (inc.rows_inserted, inc.rows_updated, inc.rows_deleted)
    expect = result.case.expect
    if expect is not None and reported != expect(result.increment):
        problems.append(f"incremental wrote +{reported[0]} ~{reported[1]} -{reported[2]}")
    if result.empty.committed:
        problems.append("the empty run committed")
    for name, baseline in (("notebook merge", result.notebook), ("dlt merge", result.dlt)):
        if baseline is not None and baseline.rows_after != result.rows_incremental_target:
            problems.append(
                f"{name} left {baseline.rows_after} rows, incremental "
                f"{result.rows_incremental_target}"
            )
    if not result.case.reload_equal:
        return "; ".join(problems)
    if result.rows_incremental_target != result.rows_full_target:
        problems.append(
            f"target has {result.rows_incremental_target} rows, full reload "
            f"{result.rows_full_target}"
        )
    if args.verify:
        from incremental_assets.engine.reload import differences

        only_target, only_full = differences(spark, spec, target)
        if only_target or only_full:
            problems.append(f"{only_target} rows only in target, {only_full} only in reload")
    return "; ".join(problems)


def _say(rows: int, scenario: str) -> Callable[[str], None]:
    def say(text: str) -> None:
        print(f"[{rows:>11,} {scenario}] {text}", flush=True)

    return say


# --- report ---------------------------------------------------------------------------


def table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *[line(r) for r in body]])


def report(results: list[CaseResult], startup: tuple[float, float], increment: int) -> str:
    # Cases side by side at each size.
    order = list(CASES)
    results = sorted(results, key=lambda r: (r.rows, order.index(r.case.name)))

    def written(r: CaseResult) -> str:
        inc = r.incremental
        return f"+{inc.rows_inserted:,} ~{inc.rows_updated:,} -{inc.rows_deleted:,}"

    def seconds(b: Baseline | None) -> str:
        return "-" if b is None else f"{b.seconds:.2f}"

    def rows(b: Baseline | None) -> str:
        return "-" if b is None else f"{b.rows_written:,}"

    main = table(
        [
            "case",
            "size",
            "target files",
            "incremental s",
            "notebook merge s",
            "dlt merge s",
            "full reload s",
            "ratio full/incr",
            "rows +ins ~upd -del",
            "incr rows written",
            "notebook rows written",
            "dlt rows written",
            "full rows written",
            "files rewritten by the merge",
        ],
        [
            [
                r.case.name,
                f"{r.rows:,}",
                str(r.target_files),
                f"{r.incremental_s:.2f}",
                seconds(r.notebook),
                seconds(r.dlt),
                f"{r.full_s:.2f}",
                f"{r.ratio:.1f}x",
                written(r),
                f"{r.incremental_written:,}",
                rows(r.notebook),
                rows(r.dlt),
                f"{r.full_written:,}",
                f"{r.incremental.files_removed} of {r.target_files} (+{r.incremental.files_added})",
            ]
            for r in results
        ],
    )

    def phases(res: LoadResult) -> str:
        p = res.phase_seconds
        return "/".join(f"{p.get(k, 0):.1f}" for k in ("probe", "extract", "commit"))

    details = table(
        [
            "case",
            "size",
            "source files",
            "initial load s",
            "incr probe/extract/commit s",
            "merge s",
            "files overlapping incr keys",
            "rows copied by merge",
            "empty run s",
            "full probe/extract/commit s",
            "check",
        ],
        [
            [
                r.case.name,
                f"{r.rows:,}",
                str(r.source_files),
                f"{r.initial_s:.2f}",
                phases(r.incremental),
                f"{r.merge_s:.1f}",
                f"{r.files_overlapping} of {r.target_files}",
                f"{r.rows_copied:,}",
                f"{r.empty_s:.2f}",
                phases(r.full),
                r.mismatch or "ok",
            ]
            for r in results
        ],
    )
    increments = {}
    for r in results:
        increments.setdefault(r.case.scenario.name, r.increment.description)
    session_s, first_job_s = startup
    overhead = statistics.median(r.empty_s for r in results) if results else float("nan")
    missing = [DLT_MISSING] if any(r.notebook and not r.dlt for r in results) else []
    return "\n".join(
        [
            f"Incremental run of a {increment:,}-change increment vs full reload",
            *[f"  {name}: {text}" for name, text in increments.items()],
            *[
                f"  {name}: {CASES[name].note}"
                for name in dict.fromkeys(r.case.name for r in results)
                if CASES[name].note
            ],
            *[f"  {line}" for line in missing],
            "",
            main,
            "",
            details,
            "",
            f"spark start-up: {session_s + first_job_s:.2f} s (session {session_s:.2f} s + "
            f"first job {first_job_s:.2f} s)",
            f"empty-run overhead: {overhead:.2f} s (median over runs of an incremental run "
            "with nothing new)",
        ]
    )


# --- command line ---------------------------------------------------------------------


def plan(cases: list[Case], sizes: list[int] | None) -> list[tuple[int, Scenario, list[Case]]]:
    """(size, scenario, cases) groups, smallest size first: each group shares one source."""
    groups: dict[tuple[int, str], tuple[Scenario, list[Case]]] = {}
    for case in cases:
        for rows in sizes or case.sizes:
            groups.setdefault((rows, case.scenario.name), (case.scenario, []))[1].append(case)
    return [(rows, scenario, group) for (rows, _), (scenario, group) in sorted(groups.items())]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated, from {', '.join(CASES)} (default: all); each runs at its "
        "own sizes: "
        + "; ".join(f"{c.name} {'/'.join(f'{s:,}' for s in c.sizes)}" for c in CASES.values()),
    )
    parser.add_argument(
        "--sizes",
        default=None,
        help="target sizes in rows, comma-separated, for every chosen case (default: each "
        "case's own sizes)",
    )
    parser.add_argument(
        "--increment",
        type=int,
        default=50_000,
        help="changes per increment (default: %(default)s); upsert: half updates, half "
        "inserts; cdc: 40%% updates, 40%% inserts, 20%% deletes, plus 5%% duplicate events",
    )
    parser.add_argument(
        "--data-dir",
        default=str(Path(__file__).resolve().parent / ".data"),
        help="scratch folder for sources and targets (default: benchmarks/.data)",
    )
    parser.add_argument(
        "--chunk-rows",
        type=int,
        default=1_000_000,
        help="rows per source write, one file each (default: %(default)s)",
    )
    parser.add_argument(
        "--empty-runs", type=int, default=3, help="empty runs per case, median reported"
    )
    parser.add_argument(
        "--warmup-rows",
        type=int,
        default=200_000,
        help="size of an unreported warm-up round of the chosen cases before the first "
        "size; 0 skips it (default: %(default)s)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also compare each incremental target with a full reload row by row (slow)",
    )
    parser.add_argument(
        "--keep-data", action="store_true", help="keep each size's tables after measuring it"
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        parser.error(
            f"--cases: unknown {', '.join(unknown) or '(none given)'}; use {', '.join(CASES)}"
        )
    args.cases = [CASES[n] for n in names]
    if args.sizes is not None:
        args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    if args.increment < 20 or any(s < 1 for s in args.sizes or []):
        parser.error("--increment must be at least 20 and sizes positive")
    if args.warmup_rows:
        args.warmup_rows = max(args.warmup_rows, args.increment)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    spark, session_s = timed(lambda: local_session("incremental-vs-full"))
    _, first_job_s = timed(lambda: spark.range(1).collect())
    print(f"spark start-up: session {session_s:.2f}s, first job {first_job_s:.2f}s", flush=True)
    if not dlt_installed() and any(c.merge_baselines for c in args.cases):
        print(DLT_MISSING, flush=True)
    results: list[CaseResult] = []
    try:
        if args.warmup_rows:
            # One untimed small round first, so JIT and caches do not bill the first size.
            print(f"warm-up round of {args.warmup_rows:,} rows (not reported)", flush=True)
            for _, scenario, cases in plan(args.cases, [args.warmup_rows]):
                run_scenario(spark, scenario, cases, args.warmup_rows, args, verbose=False)
        for rows, scenario, cases in plan(args.cases, args.sizes):
            results += run_scenario(spark, scenario, cases, rows, args)
    finally:
        spark.stop()
    print()
    print(report(results, (session_s, first_job_s), args.increment))
    return 1 if any(r.mismatch for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
