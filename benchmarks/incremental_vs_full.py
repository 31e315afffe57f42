"""This project's incremental run beside every other way to apply the same increment, and
beside full reloads, at growing target sizes, for each strategy (``bench_cases.py``).

For each size N and each source scenario that the chosen cases use, in one process and
one Spark session:

1. write the scenario's source of N rows (Delta, one file per 1M-row chunk, pyarrow and
   delta-rs);
2. build each case's target with the engine's own first load (``run_load`` over all
   history; timed apart, it also records the cursor), and seed dlt's table with the
   pipeline's own first run (untimed);
3. change the source the way such a source changes (``Scenario.apply``);
4. for each case, measure one after the other (``contenders.py``):
   - **floor**: the cheapest Spark job that reads the increment and writes it once;
   - **notebook MERGE**: the rows changed since the cursor, newest per key,
     ``DeltaTable.forPath(...).merge`` into a copy of the initial target;
   - **dlt**: the pipeline's second run (its cursor, its Delta merge or append);
   - **this project**: one incremental ``run_load`` (the daily partitions through the
     increment's day), and, with ``--deletion-vectors``, the same on a copy of the
     initial target with deletion vectors turned on (the documented migration);
   - **empty run**: the per-run overhead of a run with nothing new (median of
     ``--empty-runs``);
   - **hand-written reload**: spark.read of the whole source, newest per key, overwrite;
     for append also the **hand-written copy** (the source as it is, no key kept once);
   - **engine reload**: ``run_load`` into an empty target with one partition range over
     all history (what a backfill of all history costs);
5. after the last size, ``--aging-runs`` more increments (30) through the engine at
   ``--aging-size``, with the maintenance job every ``--maintain-every`` runs, then a full
   scan of the target against a freshly compacted copy of it;
6. with ``--huge N`` (not in the default run): an upsert target of N rows (200M) and one
   increment, its time and the driver's peak memory.

Every measurement is taken the same way (``spark_meter.py``): seconds, the rows its
commits wrote (``numOutputRows`` of a merge, every row of a write), the files its scans
read and their size (Spark's SQL metrics; dlt, which is not Spark: the bytes its process
read), the target files it removed and added, its Spark jobs, and the driver's peak heap.

Run from the repository root (``./dev bench`` installs dlt first)::

    .venv/bin/python benchmarks/incremental_vs_full.py              # every case, 1M 5M 20M
    .venv/bin/python benchmarks/incremental_vs_full.py --cases upsert,cdc_hard --sizes 1000000
    .venv/bin/python benchmarks/incremental_vs_full.py --sizes 100000 --increment 5000 \\
        --aging-runs 3 --warmup-rows 0                                 # smoke run
    .venv/bin/python benchmarks/incremental_vs_full.py --huge 200000000 # the 200M target
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import shutil
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
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
from bench_report import report
from contenders import DltTarget, floor, hand_copy, hand_reload, notebook_merge
from deltalake import DeltaTable
from spark_meter import METER_CONF, Measure, Meter

from incremental_assets.engine import DeltaTarget, LoadRequest, LoadResult, run_load
from incremental_assets.engine.delta_lake.maintenance import MaintenanceSettings, maintain_table
from incremental_assets.engine.delta_lake.store import Tombstones, operation_metrics, row_count
from incremental_assets.engine.spark_session import local_session
from incremental_assets.engine.watermarks import to_transaction_version
from incremental_assets.specs import TableSpec

DLT_MISSING = "dlt is not installed; pip install -e '.[bench]' adds its lines"
PHASES = {"probed": "extract", "staged": "commit", "committed": "after commit"}


# --- what one contender did ---------------------------------------------------------


@dataclass
class Run:
    """One contender's run, measured."""

    contender: str
    measure: Measure
    rows_written: int = 0
    files_removed: int = 0
    files_added: int = 0
    deletion_vectors: int = 0
    rows_after: int | None = None  # rows in its table after (checked against the engine)
    result: LoadResult | None = None
    spark: bool = True  # False for dlt: no Spark jobs, bytes read from the OS
    # Every run's seconds when the contender ran more than once (this one is the median).
    repeats: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.measure.seconds


@dataclass
class CaseResult:
    case: Case
    rows: int
    increment: Increment
    initial_s: float
    initial: LoadResult
    target_files: int
    runs: dict[str, Run] = field(default_factory=dict)
    empty_s: float = float("nan")
    checks: list[str] = field(default_factory=list)


@dataclass
class Aging:
    """The target after many incremental runs, against a freshly compacted copy."""

    case: str
    rows: int
    variant: str
    runs: int
    maintain_every: int
    run_seconds: list[float]
    run_rows_written: list[int]  # by each run, from its commits' metrics
    files: int
    files_compacted: int
    scan_s: float
    compacted_scan_s: float
    # A second series of scans of the compacted copy: the noise band of the ratio.
    compacted_again_s: float
    maintenance_s: float
    # The target's live files at the end, by their lowest key: (lowest, highest, rows).
    layout: list[tuple[Any, Any, int]] = field(default_factory=list)
    # target.compact_after of the runs (None: unset), and the runs that compacted: each
    # one's number and the seconds of its compaction.
    compact_after: int | None = None
    compacted_runs: list[tuple[int, float]] = field(default_factory=list)
    # target.purge_after of the runs (None: unset), and the runs that purged (each one's
    # number and the seconds of its purge and compaction).
    purge_after: float | None = None
    purged_runs: list[tuple[int, float]] = field(default_factory=list)
    # The seconds the runs that neither purged nor compacted spent deciding not to.
    idle_upkeep_s: list[float] = field(default_factory=list)


@dataclass
class Huge:
    rows: int
    initial_s: float
    run: Run
    notebook: Run


def commits_after(path: str, version: int) -> list[dict]:
    if not DeltaTable.is_deltatable(path):
        return []
    return [c for c in DeltaTable(path).history() if c["version"] > version]


def written(path: str, version: int) -> tuple[int, int, int, int]:
    """Rows written, files removed, files added and deletion vectors added by the commits
    of the table at ``path`` after ``version`` (-1: all), from their metrics (Spark's and
    delta-rs's names alike)."""
    rows = removed = added = vectors = 0
    for commit in commits_after(path, version):
        m = operation_metrics(commit)
        rows += int(m.get("num_output_rows", m.get("num_added_rows", 0)) or 0)
        removed += int(m.get("num_target_files_removed", m.get("num_removed_files", 0)) or 0)
        added += int(
            m.get("num_target_files_added", m.get("num_files", m.get("num_added_files", 0))) or 0
        )
        vectors += int(m.get("num_target_deletion_vectors_added", 0) or 0)
    return rows, removed, added, vectors


def version_of(path: str) -> int:
    return DeltaTable(path).version() if DeltaTable.is_deltatable(path) else -1


def side_tables(path: str) -> list[str]:
    return [p for p in (f"{path}__tombstones", f"{path}__changes") if DeltaTable.is_deltatable(p)]


class Bench:
    """One benchmark process: the Spark session, the meter and the options."""

    def __init__(self, args) -> None:
        self.args = args
        self.spark = local_session("incremental-vs-full", **METER_CONF)
        self.meter = Meter(self.spark)

    def measured(
        self, contender: str, paths: list[str], fn: Callable[[], Any], spark: bool = True
    ) -> tuple[Run, Any]:
        """Run ``fn`` measured; count what the commits it added to ``paths`` wrote."""
        before = {p: version_of(p) for p in paths}
        gc.collect()
        with self.meter.measure() as m:
            self.meter.mark("run")
            out = fn()
        run = Run(contender, m, spark=spark)
        for path, version in before.items():
            rows, removed, added, vectors = written(path, version)
            run.rows_written += rows
            run.files_removed += removed
            run.files_added += added
            run.deletion_vectors += vectors
        if paths and DeltaTable.is_deltatable(paths[0]):
            run.rows_after = live_rows(self.spark, paths[0])
        return run, out

    def load(self, contender: str, spec, target: DeltaTarget, request: LoadRequest, stage: Path):
        """The engine's ``run_load``, measured by phase (its hook marks them)."""
        # The side tables a run writes count too (made by the run when new).
        paths = [target.path, f"{target.path}__tombstones", f"{target.path}__changes"]

        def go() -> LoadResult:
            self.meter.mark("probe")
            return run_load(
                self.spark,
                spec,
                target,
                request,
                staging_dir=str(stage),
                hook=lambda phase: self.meter.mark(PHASES.get(phase, phase)),
            )

        run, result = self.measured(contender, paths, go)
        run.result = result
        return run


def live_rows(spark, path: str) -> int:
    """Rows in the table: from the log's statistics, less rows its deletion vectors
    removed (the engine's ``row_count`` does both)."""
    return row_count(DeltaTable(path))


def cursor_of(target: DeltaTarget, kind: str) -> int:
    return int(to_transaction_version(target.state(kind).cursor, kind))


def copy_table(src: str, dst: str) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)


def copy_with_side_tables(src: str, dst: str) -> None:
    copy_table(src, dst)
    for side in side_tables(src):
        copy_table(side, dst + side.removeprefix(src))


def remove_with_side_tables(path: str) -> None:
    for side in side_tables(path):
        shutil.rmtree(side, ignore_errors=True)
    shutil.rmtree(path, ignore_errors=True)


def enable_deletion_vectors(spark, path: str) -> None:
    """The documented migration of a target written without deletion vectors."""
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )


# --- one size of one scenario ---------------------------------------------------------


@dataclass
class Prepared:
    case: Case
    root: Path
    target: DeltaTarget
    initial: LoadResult
    initial_s: float
    target_files: int
    dlt: DltTarget | None = None
    copies: dict[str, str] = field(default_factory=dict)


def initial_request(rows: int) -> LoadRequest:
    return LoadRequest(
        HISTORY_START, day_after(instant(last_existing_update_us(rows))), run_id="initial"
    )


def increment_request(increment: Increment, run_id: str) -> LoadRequest:
    """The daily partitions an orchestrator would run next: through the increment's day."""
    return LoadRequest(
        day_floor(instant(increment.first_us)), day_after(instant(increment.last_us)), run_id=run_id
    )


def dlt_installed() -> bool:
    return importlib.util.find_spec("dlt") is not None


def seed_tombstones(spark, spec, target: DeltaTarget, count: int) -> None:
    """``count`` tombstones of keys the source never holds: what a hard-delete table keeps
    after that many deletes, read by every later run. The copies of the target take them."""
    key, wm = spec.keys[0], spec.watermark.column
    # Keys far above the source's; as long integers, the bench cases' key and watermark.
    deletes = spark.range(count).selectExpr(f"id + {10**12} AS {key}", f"id AS {wm}")
    Tombstones(target).record_deletes(deletes, [key], wm)


def run_scenario(
    bench: Bench, scenario: Scenario, cases: list[Case], rows: int, say, aging: bool
) -> tuple[list[CaseResult], list[Aging]]:
    args, spark = bench.args, bench.spark
    root = Path(args.data_dir) / f"{scenario.name}_{rows}"
    shutil.rmtree(root, ignore_errors=True)
    stage = root / "stage"
    stage.mkdir(parents=True)
    source = str(root / "source")
    files = scenario.write_source(source, rows, args.chunk_rows)
    say(f"source written: {files} files")

    prepared = []
    for case in cases:
        case_root = root / case.name
        spec = case.spec(source, str(case_root / "target"))
        target = DeltaTarget(spec.name, str(case_root / "target"))
        run = bench.load("initial load", spec, target, initial_request(rows), stage)
        if case.kind == "cdc_hard" and args.tombstones:
            seed_tombstones(spark, spec, target, args.tombstones)
            say(f"{case.name}: {args.tombstones:,} tombstones of earlier deletes recorded")
        p = Prepared(
            case, case_root, target, run.result, run.seconds, len(target.open().file_uris())
        )
        say(
            f"{case.name}: initial load {run.result.rows_inserted:,} rows, {p.target_files} "
            f"files in {run.seconds:.1f}s"
        )
        for variant in ["notebook", *(["deletion vectors"] if args.deletion_vectors else [])]:
            copy = str(case_root / variant.replace(" ", "_"))
            copy_with_side_tables(target.path, copy)
            if variant == "deletion vectors":
                enable_deletion_vectors(spark, copy)
            p.copies[variant] = copy
        if case.dlt and dlt_installed() and not args.no_dlt:
            p.dlt = DltTarget.create(case.kind, source, case_root / "dlt")
            p.dlt.run()
            say(f"{case.name}: dlt seeded ({row_count(DeltaTable(p.dlt.path)):,} rows)")
        prepared.append(p)

    increment = scenario.increment(rows, args.increment, seed=rows)
    say(f"source changed: {scenario.apply(source, increment)} ({increment.description})")
    results = [measure(bench, p, source, rows, increment, stage, say) for p in prepared]

    agings = []
    if aging and args.aging_runs:
        agings = age(bench, scenario, prepared, source, rows, stage, say)
    if not args.keep_data:
        shutil.rmtree(root, ignore_errors=True)
    return results, agings


def measure(
    bench: Bench, p: Prepared, source: str, rows: int, increment: Increment, stage: Path, say
) -> CaseResult:
    args, spark, case = bench.args, bench.spark, p.case
    spec = case.spec(source, p.target.path)
    result = CaseResult(case, rows, increment, p.initial_s, p.initial, p.target_files)
    cursor = cursor_of(p.target, spec.watermark.kind)

    def told(run: Run) -> Run:
        say(
            f"{case.name}: {run.contender}: {run.seconds:.2f}s, {run.rows_written:,} rows "
            f"written, {len(run.measure.jobs)} jobs"
        )
        return run

    def note(run: Run) -> None:
        result.runs[run.contender] = told(run)

    # Each contender applies the increment --repeats times, in turn, to a fresh copy of the
    # initial target (the last time to the prepared one itself, which later steps read);
    # the median run stands for it. dlt keeps its own state between runs: run once.
    request = increment_request(increment, "incremental")
    tried: dict[str, list[Run]] = {}

    def timed(run: Run) -> None:
        tried.setdefault(run.contender, []).append(told(run))

    def engine(contender: str, prepared: DeltaTarget, last: bool) -> Run:
        target = prepared if last else DeltaTarget(spec.name, str(p.root / "repeat"))
        if not last:
            copy_with_side_tables(prepared.path, target.path)
        run = bench.load(contender, case.spec(source, target.path), target, request, stage)
        if not last:
            remove_with_side_tables(target.path)
        return run

    out, copy = str(p.root / "floor"), p.copies["notebook"]

    def floor_run() -> None:
        floor(spark, case.kind, source, out, cursor)

    def notebook_run() -> None:
        notebook_merge(spark, case.kind, source, copy, cursor)

    for i in range(args.repeats):
        last = i == args.repeats - 1
        shutil.rmtree(out, ignore_errors=True)
        timed(bench.measured("floor", [out], floor_run)[0])
        if i:
            copy_table(p.target.path, copy)
        timed(bench.measured("notebook MERGE", [copy], notebook_run)[0])
        if p.dlt is not None and not i:
            timed(bench.measured("dlt", [p.dlt.path], p.dlt.run, spark=False)[0])
        timed(engine("this project", p.target, last))
        if "deletion vectors" in p.copies:
            dv = DeltaTarget(spec.name, p.copies["deletion vectors"])
            timed(engine("this project, deletion vectors", dv, last))
    for runs in tried.values():
        ranked = sorted(runs, key=lambda run: run.seconds)
        chosen = ranked[(len(ranked) - 1) // 2]
        chosen.repeats = [run.seconds for run in runs]
        result.runs[chosen.contender] = chosen

    empties = []
    for i in range(args.empty_runs):
        run = bench.load("empty run", spec, p.target, increment_request(increment, f"e{i}"), stage)
        if run.result.committed:
            result.checks.append("an empty run committed")
        empties.append(run.seconds)
    result.empty_s = statistics.median(empties) if empties else float("nan")

    out = str(p.root / "hand_reload")
    note(
        bench.measured(
            "hand-written reload", [out], lambda: hand_reload(spark, case.kind, source, out)
        )[0]
    )
    if case.kind == "append":
        shutil.rmtree(out, ignore_errors=True)
        note(bench.measured("hand-written copy", [out], lambda: hand_copy(spark, source, out))[0])
    full_path = str(p.root / "full")
    full = DeltaTarget(spec.name, full_path)
    full_request = LoadRequest(HISTORY_START, day_after(instant(increment.last_us)), run_id="full")
    note(bench.load("engine reload", case.spec(source, full_path), full, full_request, stage))

    result.checks += check(bench, result, spec, p.target, full)
    for problem in result.checks:
        say(f"{case.name}: WARNING: {problem}")
    for path in (str(p.root / "floor"), str(p.root / "hand_reload"), full_path):
        shutil.rmtree(path, ignore_errors=True)
    return result


def check(bench: Bench, r: CaseResult, spec, target: DeltaTarget, full: DeltaTarget) -> list:
    """The incremental run did what the increment asks, and the other ways agree."""
    problems = []
    engine = r.runs["this project"]
    inc = engine.result
    if r.initial.rows_inserted != r.rows:
        problems.append(f"initial load wrote {r.initial.rows_inserted} rows")
    if inc.mode != "incremental":
        problems.append(f"the timed run was a {inc.mode} run")
    reported = (inc.rows_inserted, inc.rows_updated, inc.rows_deleted)
    if r.case.expect is not None and reported != r.case.expect(r.increment):
        problems.append(f"incremental wrote +{reported[0]} ~{reported[1]} -{reported[2]}")
    expected = engine.rows_after
    for name in ("notebook MERGE", "dlt", "this project, deletion vectors"):
        run = r.runs.get(name)
        if run is None or run.rows_after == expected:
            continue
        problems.append(f"{name} left {run.rows_after} rows, this project {expected}")
    if r.case.reload_equal:
        reload = r.runs["engine reload"].rows_after
        if reload != expected:
            problems.append(f"target has {expected} rows, the engine's reload {reload}")
        hand = r.runs["hand-written reload"].rows_after
        if r.case.kind != "scd2" and hand != expected:
            problems.append(f"target has {expected} rows, the hand-written reload {hand}")
        if bench.args.verify:
            from incremental_assets.engine.reload import differences

            only_target, only_full = differences(bench.spark, spec, target)
            if only_target or only_full:
                problems.append(f"{only_target} rows only in target, {only_full} only in reload")
    return problems


# --- many runs, then a full scan ------------------------------------------------------


def age(
    bench: Bench, scenario: Scenario, prepared: list[Prepared], source: str, rows: int, stage, say
) -> list[Aging]:
    """``--aging-runs`` more increments through each case's targets (this project's, and
    the deletion-vector copy), the maintenance job after every ``--maintain-every`` runs
    (not after the last: the scan sees the runs since), then a full scan of each target
    against a freshly compacted copy of it."""
    args, spark = bench.args, bench.spark
    targets = []
    for p in prepared:
        targets.append((p, "default", p.target))
        if "deletion vectors" in p.copies:
            copy = DeltaTarget("orders", p.copies["deletion vectors"])
            targets.append((p, "deletion vectors", copy))
    seconds: dict[int, list[float]] = {i: [] for i in range(len(targets))}
    rows_written: dict[int, list[int]] = {i: [] for i in range(len(targets))}
    maintenance = [0.0] * len(targets)
    compacted_runs: dict[int, list[tuple[int, float]]] = {i: [] for i in range(len(targets))}
    purged_runs: dict[int, list[tuple[int, float]]] = {i: [] for i in range(len(targets))}
    idle_upkeep: dict[int, list[float]] = {i: [] for i in range(len(targets))}
    for n in range(1, args.aging_runs + 1):
        increment = scenario.increment(rows, args.increment, seed=rows, round_=n)
        scenario.apply(source, increment)
        for i, (p, _, target) in enumerate(targets):
            spec = with_upkeep(p.case.spec(source, target.path), args)
            before = version_of(target.path)
            run = bench.load("aging", spec, target, increment_request(increment, f"a{n}"), stage)
            upkeep = (n, run.result.phase_seconds.get("compact", 0.0))
            if run.result.files_compacted:
                compacted_runs[i].append(upkeep)
            if run.result.files_purged:
                purged_runs[i].append(upkeep)
            elif not run.result.files_compacted and "compact" in run.result.phase_seconds:
                idle_upkeep[i].append(upkeep[1])
            seconds[i].append(run.seconds)
            rows_written[i].append(written(target.path, before)[0])
            if args.maintain_every and n % args.maintain_every == 0 and n < args.aging_runs:
                m, _ = bench.measured("maintenance", [], lambda t=target: maintain(spark, t))
                maintenance[i] += m.seconds
        say(f"aging: run {n} of {args.aging_runs}")
    out = []
    for i, (p, variant, target) in enumerate(targets):
        compact = str(p.root / "compacted")
        copy_table(target.path, compact)
        maintain(spark, DeltaTarget("orders", compact))
        scan, fresh, again = scans(spark, target.path, compact, args.scan_repeats)
        out.append(
            Aging(
                case=p.case.name,
                rows=rows,
                variant=variant,
                runs=args.aging_runs,
                maintain_every=args.maintain_every,
                run_seconds=seconds[i],
                run_rows_written=rows_written[i],
                files=len(target.open().file_uris()),
                files_compacted=len(DeltaTarget("orders", compact).open().file_uris()),
                scan_s=scan,
                compacted_scan_s=fresh,
                compacted_again_s=again,
                maintenance_s=maintenance[i],
                compact_after=args.compact_after,
                compacted_runs=compacted_runs[i],
                purge_after=args.purge_after,
                purged_runs=purged_runs[i],
                idle_upkeep_s=idle_upkeep[i],
                layout=layout(target, p.case.spec(source, target.path).keys[0]),
            )
        )
        say(
            f"{p.case.name} ({variant}): after {args.aging_runs} runs a full scan took "
            f"{scan:.2f}s, {fresh:.2f}s on a compacted copy"
        )
        shutil.rmtree(compact, ignore_errors=True)
    return out


def with_upkeep(spec: TableSpec, args) -> TableSpec:
    """``spec`` with ``target.compact_after`` and ``target.purge_after`` of the repeated
    runs (``--compact-after``, ``--purge-after``; None: as the spec has it, unset)."""
    update = {"compact_after": args.compact_after, "purge_after": args.purge_after}
    update = {k: v for k, v in update.items() if v is not None}
    if not update:
        return spec
    return spec.model_copy(update={"target": spec.target.model_copy(update=update)})


def layout(target: DeltaTarget, key: str) -> list[tuple[Any, Any, int]]:
    """The table's live files as their statistics give them: lowest and highest ``key``
    and rows, in the order of the lowest key (which files an increment's keys fall in)."""
    files = pa.table(target.open().get_add_actions(flatten=True)).to_pylist()
    found = [(f.get(f"min.{key}"), f.get(f"max.{key}"), f["num_records"]) for f in files]
    return sorted(found, key=lambda f: (f[0] is None, f[0]))


def maintain(spark, target: DeltaTarget) -> None:
    """The maintenance job's work on one table (its defaults; no vacuum: nothing here is
    older than the retention)."""
    maintain_table(spark, target, MaintenanceSettings(retention_hours=None))


def scans(spark, path: str, compacted: str, repeats: int) -> tuple[float, float, float]:
    """Median seconds of a full scan (every column of every row) of each table, after one
    scan of each that is not counted (the snapshot's and the files' first reads), taking
    turns so both see the same machine; and the median of a second series of scans of the
    compacted copy, taken in the same turns: the noise band (two series of one table)."""
    import time

    def scan(p: str) -> float:
        started = time.perf_counter()
        spark.read.format("delta").load(p).selectExpr("sum(hash(*))").collect()
        return time.perf_counter() - started

    scan(path)
    scan(compacted)
    a, b, c = [], [], []
    for _ in range(repeats):
        a.append(scan(path))
        b.append(scan(compacted))
        c.append(scan(compacted))
    return statistics.median(a), statistics.median(b), statistics.median(c)


# --- the 200M target ------------------------------------------------------------------


def huge(bench: Bench, rows: int, say) -> Huge:
    """An upsert target of ``rows`` rows built by the engine's first load from a source
    generated on local disk, then one increment: its time and the driver's peak memory."""
    args = bench.args
    case = CASES["upsert"]
    root = Path(args.data_dir) / f"huge_{rows}"
    shutil.rmtree(root, ignore_errors=True)
    stage = root / "stage"
    stage.mkdir(parents=True)
    source = str(root / "source")
    say(f"source written: {case.scenario.write_source(source, rows, args.chunk_rows)} files")
    spec = case.spec(source, str(root / "target"))
    target = DeltaTarget(spec.name, str(root / "target"))
    initial = bench.load("initial load", spec, target, initial_request(rows), stage)
    say(f"initial load: {initial.seconds:.1f}s")
    # What a user would otherwise run, on a copy of the same target: the notebook MERGE.
    copy = str(root / "notebook")
    copy_table(target.path, copy)
    cursor = cursor_of(target, spec.watermark.kind)
    increment = case.scenario.increment(rows, args.increment, seed=rows)
    case.scenario.apply(source, increment)
    spark = bench.spark
    notebook = bench.measured(
        "notebook MERGE", [copy], lambda: notebook_merge(spark, case.kind, source, copy, cursor)
    )[0]
    say(f"notebook MERGE: {notebook.seconds:.2f}s, {notebook.rows_written:,} rows written")
    run = bench.load("this project", spec, target, increment_request(increment, "inc"), stage)
    say(
        f"incremental: {run.seconds:.2f}s, {run.rows_written:,} rows written, heap peak "
        f"{run.measure.heap_peak / 2**30:.2f} GiB"
    )
    if not args.keep_data:
        shutil.rmtree(root, ignore_errors=True)
    return Huge(rows, initial.seconds, run, notebook)


# --- command line ---------------------------------------------------------------------


def plan(cases: list[Case], sizes: list[int]) -> list[tuple[int, Scenario, list[Case]]]:
    """(size, scenario, cases) groups, smallest size first: each group shares one source."""
    groups: dict[tuple[int, str], tuple[Scenario, list[Case]]] = {}
    for case in cases:
        for rows in sizes:
            groups.setdefault((rows, case.scenario.name), (case.scenario, []))[1].append(case)
    return [(rows, scenario, group) for (rows, _), (scenario, group) in sorted(groups.items())]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, from {', '.join(CASES)}"
    )
    parser.add_argument(
        "--sizes",
        default="1000000,5000000,20000000",
        help="target sizes in rows, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--increment",
        type=int,
        default=50_000,
        help="changes per increment (default: %(default)s); upsert: half updates, half "
        "inserts; cdc and scd2: 40%% updates, 40%% inserts, 20%% deletes, plus 5%% "
        "duplicate events; append: new events",
    )
    parser.add_argument(
        "--deletion-vectors",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run this project on a copy of each initial target with deletion vectors "
        "turned on (default: on)",
    )
    parser.add_argument("--no-dlt", action="store_true", help="leave dlt out")
    parser.add_argument(
        "--aging-runs",
        type=int,
        default=30,
        help="incremental runs before the full-scan comparison (default: %(default)s; 0 skips it)",
    )
    parser.add_argument(
        "--aging-size",
        type=int,
        default=None,
        help="target size of the repeated runs (default: the middle of --sizes)",
    )
    parser.add_argument(
        "--maintain-every",
        type=int,
        default=10,
        help="the maintenance job runs after every this many of the repeated runs "
        "(default: %(default)s; 0: never)",
    )
    parser.add_argument(
        "--compact-after",
        type=int,
        default=None,
        help="target.compact_after of the repeated runs: a run leaving this many small "
        "files compacts them (default: unset, as a table's spec has it)",
    )
    parser.add_argument(
        "--purge-after",
        type=float,
        default=None,
        help="target.purge_after of the repeated runs: a run after which deletion vectors "
        "mark this share of the rows deleted purges them (default: unset)",
    )
    parser.add_argument(
        "--scan-repeats", type=int, default=7, help="full scans of each table, median"
    )
    parser.add_argument(
        "--huge",
        type=int,
        default=0,
        help="instead of the rest: an upsert target of this many rows (e.g. 200000000) and "
        "one increment (tens of GB of disk, an hour or more)",
    )
    parser.add_argument(
        "--data-dir",
        default=str(Path(__file__).resolve().parent / ".data"),
        help="scratch folder for sources and targets (default: benchmarks/.data)",
    )
    parser.add_argument(
        "--chunk-rows", type=int, default=1_000_000, help="rows per source file (default 1M)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="times each contender applies the increment, to a fresh copy of the target "
        "each time (dlt once); the median run is reported (default: %(default)s)",
    )
    parser.add_argument("--empty-runs", type=int, default=3, help="empty runs, median")
    parser.add_argument(
        "--tombstones",
        type=int,
        default=0,
        help="cdc_hard: tombstones of earlier deletes recorded beside each initial target "
        "(keys the source never holds), as after that many deletes (default: none)",
    )
    parser.add_argument(
        "--warmup-rows",
        type=int,
        default=200_000,
        help="an unreported warm-up round of the chosen cases at this size first; 0 skips it",
    )
    parser.add_argument(
        "--jobs",
        choices=["largest", "all", "none"],
        default="largest",
        help="print the Spark jobs of the incremental run and the engine reload for each case "
        "at the largest size (default), at every size, or not",
    )
    parser.add_argument(
        "--verify", action="store_true", help="also compare targets row by row (slow)"
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
    args.sizes = sorted(int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip())
    if args.increment < 20 or not args.sizes or args.sizes[0] < 1:
        parser.error("--increment must be at least 20 and sizes positive")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.aging_size is None:
        args.aging_size = args.sizes[len(args.sizes) // 2]
    if args.aging_size not in args.sizes:
        parser.error(f"--aging-size {args.aging_size} is not one of --sizes")
    if args.warmup_rows:
        args.warmup_rows = max(args.warmup_rows, args.increment)
    return args


def say_for(rows: int, scenario: str) -> Callable[[str], None]:
    def say(text: str) -> None:
        print(f"[{rows:>11,} {scenario}] {text}", flush=True)

    return say


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    bench = Bench(args)
    if not dlt_installed() and not args.no_dlt:
        print(DLT_MISSING, flush=True)
    results: list[CaseResult] = []
    agings: list[Aging] = []
    big = None
    try:
        if args.huge:
            big = huge(bench, args.huge, say_for(args.huge, "orders"))
        else:
            if args.warmup_rows:
                # One small round first, so JIT and caches do not bill the first size.
                print(f"warm-up round of {args.warmup_rows:,} rows (not reported)", flush=True)
                quiet = argparse.Namespace(**{**vars(args), "aging_runs": 0, "empty_runs": 1})
                warm = Bench.__new__(Bench)
                warm.args, warm.spark, warm.meter = quiet, bench.spark, bench.meter
                for _, scenario, cases in plan(args.cases, [args.warmup_rows]):
                    run_scenario(warm, scenario, cases, args.warmup_rows, lambda _t: None, False)
            for rows, scenario, cases in plan(args.cases, args.sizes):
                found, aged = run_scenario(
                    bench, scenario, cases, rows, say_for(rows, scenario.name),
                    aging=rows == args.aging_size,
                )  # fmt: skip
                results += found
                agings += aged
    finally:
        bench.spark.stop()
    print()
    print(report(results, agings, big, args))
    return 1 if any(r.checks for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
