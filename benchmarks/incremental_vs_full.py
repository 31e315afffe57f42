"""Incremental load vs full reload, on one machine, for targets of growing size.

For each size N:

1. write an operational ``orders`` source of N rows as a Delta table, in chunks (one file
   per chunk, ``updated_at`` rising with ``order_id``), with pyarrow and delta-rs;
2. build the target with the engine's own first load (``run_load`` on an empty target over
   all history): timed and reported as the initial load; it also records the cursor;
3. change the source the way a database table changes: a delta-rs merge of an increment
   that updates rows among the most recent ones and inserts new orders, all stamped later
   than anything loaded;
4. time one incremental ``run_load`` (the increment only), then an empty run (nothing new
   since: the fixed per-run overhead), then a full reload of the same source into a fresh
   target, done the way a user of the tool does it: ``run_load`` on an empty target with
   one partition range covering all history.

Run from the repository root::

    .venv/bin/python benchmarks/incremental_vs_full.py
    .venv/bin/python benchmarks/incremental_vs_full.py --sizes 100000,200000 --increment 5000
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from incremental_assets.engine import DeltaTarget, LoadRequest, LoadResult, run_load
from incremental_assets.engine.delta_store import row_count
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import TableSpec

T = TypeVar("T")
UTC = timezone.utc
HISTORY_START = datetime(2024, 1, 1, tzinfo=UTC)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ORDERS_PER_DAY = 200_000  # 20M rows span 100 days of history
STEP_US = 86_400_000_000 // ORDERS_PER_DAY  # created_at spacing between consecutive orders
MAX_UPDATE_LAG_US = 2 * 3_600_000_000  # a row's updated_at trails its created_at by < 2h
RECENT_ROWS = 200_000  # updates hit orders among the last this many
INCREMENT_SPAN_US = 10 * 60_000_000  # the increment is stamped within 10 minutes
STATUSES = pa.array(["placed", "paid", "packed", "shipped", "delivered", "cancelled"])
SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("customer_id", pa.int64()),
        ("status", pa.string()),
        ("amount", pa.float64()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
HISTORY_START_US = (HISTORY_START - _EPOCH) // timedelta(microseconds=1)


# --- data -----------------------------------------------------------------------------


def _random(n: int, seed: int) -> pa.Array:
    return pc.random(n, initializer=seed)


def _scaled_int(n: int, seed: int, high: int) -> pa.Array:
    """n pseudo-random integers in [0, high)."""
    return pc.floor(pc.multiply(_random(n, seed), float(high))).cast(pa.int64())


def _timestamps(micros: pa.Array) -> pa.Array:
    return micros.cast(pa.timestamp("us", tz="UTC"))


def _created_us(order_ids: pa.Array) -> pa.Array:
    return pc.add(pc.multiply(pc.subtract(order_ids, 1), STEP_US), HISTORY_START_US)


def orders_chunk(first_id: int, n: int, seed: int, updated_us: pa.Array | None = None) -> pa.Table:
    """Orders ``first_id .. first_id + n - 1``; all columns built with Arrow compute."""
    ids = pa.array(range(first_id, first_id + n), pa.int64())
    created = _created_us(ids)
    if updated_us is None:
        updated_us = pc.add(created, _scaled_int(n, seed + 1, MAX_UPDATE_LAG_US))
    return pa.table(
        [
            ids,
            _scaled_int(n, seed + 2, 100_000),
            STATUSES.take(_scaled_int(n, seed + 3, len(STATUSES))),
            pc.round(pc.add(5.0, pc.multiply(_random(n, seed + 4), 495.0)), 2),
            _timestamps(created),
            _timestamps(updated_us),
        ],
        schema=SCHEMA,
    )


def last_existing_update_us(rows: int) -> int:
    """An upper bound of every ``updated_at`` in the initial source."""
    return HISTORY_START_US + (rows - 1) * STEP_US + MAX_UPDATE_LAG_US


def write_source(path: str, rows: int, chunk_rows: int) -> int:
    """The initial source, one Delta commit (and one file) per chunk. Returns its files."""
    for i, first in enumerate(range(1, rows + 1, chunk_rows)):
        chunk = orders_chunk(first, min(chunk_rows, rows + 1 - first), seed=1000 + 10 * i)
        write_deltalake(path, chunk, mode="append")
        del chunk
    return len(DeltaTable(path).file_uris())


def increment_rows(rows: int, increment: int, seed: int) -> tuple[pa.Table, int, int]:
    """Half updates to recent orders, half new orders, stamped after everything loaded.

    Returns the rows, and the increment's first and last ``updated_at`` (microseconds).
    """
    updates = increment // 2
    inserts = increment - updates
    recent = min(RECENT_ROWS, rows)
    if updates > recent:
        raise SystemExit(f"--increment {increment}: more updates than the {recent} recent rows")
    rng = random.Random(seed)
    start_us = last_existing_update_us(rows) + 3_600_000_000
    updated_ids = sorted(rng.sample(range(rows - recent + 1, rows + 1), updates))

    def stamps(n: int, seed: int) -> pa.Array:
        return pc.add(_scaled_int(n, seed, INCREMENT_SPAN_US), start_us)

    changed = orders_chunk(1, updates, seed + 10, updated_us=stamps(updates, seed + 11))
    ids = pa.array(updated_ids, pa.int64())
    changed = changed.set_column(0, "order_id", ids).set_column(
        4, "created_at", _timestamps(_created_us(ids))
    )
    # New orders are created at the moment they are first stamped.
    new_stamps = stamps(inserts, seed + 12)
    new = orders_chunk(rows + 1, inserts, seed + 20, updated_us=new_stamps)
    new = new.set_column(4, "created_at", _timestamps(new_stamps))
    both = pa.concat_tables([changed, new])
    return both, start_us, start_us + INCREMENT_SPAN_US


def apply_to_source(path: str, rows: pa.Table) -> dict:
    """Update and insert in place, as an operational table changes (a delta-rs merge)."""
    return (
        DeltaTable(path)
        .merge(
            rows,
            "t.order_id = s.order_id",
            source_alias="s",
            target_alias="t",
            # Not streamed: delta-rs then prunes the source's files by the increment's keys.
            streamed_exec=False,
        )
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )


# --- engine runs ----------------------------------------------------------------------


def table_spec(source: str, target: str) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": "orders",
            "source": {"format": "delta", "path": source},
            "keys": ["order_id"],
            "watermark": {"column": "updated_at", "kind": "timestamp", "lookback": "0s"},
            "strategy": "upsert",
            "partitioning": {"granularity": "daily", "start": HISTORY_START.date().isoformat()},
            "target": {"path": target},
        }
    )


def instant(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def day_floor(value: datetime) -> datetime:
    return value.replace(hour=0, minute=0, second=0, microsecond=0)


def day_after(value: datetime) -> datetime:
    return day_floor(value) + timedelta(days=1)


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


def last_operation_metrics(path: str) -> dict:
    return DeltaTable(path).history(1)[0].get("operationMetrics") or {}


@dataclass
class SizeResult:
    rows: int
    source_files: int
    generate_s: float
    initial_s: float
    initial: LoadResult
    target_files: int
    source_update_s: float
    incremental_s: float
    files_overlapping: int
    rows_copied: int
    incremental: LoadResult
    empty_s: float
    empty: LoadResult
    full_s: float
    full: LoadResult
    rows_incremental_target: int
    rows_full_target: int
    mismatch: str = ""

    @property
    def ratio(self) -> float:
        return self.full_s / self.incremental_s if self.incremental_s else float("nan")


def run_size(spark, rows: int, args: argparse.Namespace, verbose: bool = True) -> SizeResult:
    root = Path(args.data_dir) / f"rows_{rows}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    stage = root / "stage"
    stage.mkdir()
    source, target_path, full_path = (str(root / n) for n in ("source", "target", "full"))
    spec = table_spec(source, target_path)
    target = DeltaTarget(spec.name, target_path)
    say = _say(rows) if verbose else (lambda _text: None)

    source_files, generate_s = timed(lambda: write_source(source, rows, args.chunk_rows))
    say(f"source written: {source_files} files in {generate_s:.1f}s")

    initial_request = LoadRequest(
        HISTORY_START, day_after(instant(last_existing_update_us(rows))), run_id="initial"
    )
    initial, initial_s = timed(
        lambda: run_load(spark, spec, target, initial_request, staging_dir=str(stage))
    )
    target_files = live_files(target_path)
    say(
        f"initial load: {initial.rows_inserted} rows, {target_files} files in {initial_s:.1f}s "
        f"{initial.phase_seconds}"
    )

    increment, first_us, last_us = increment_rows(rows, args.increment, seed=rows)
    metrics, source_update_s = timed(lambda: apply_to_source(source, increment))
    say(
        f"source changed: {metrics.get('num_target_rows_updated')} updated, "
        f"{metrics.get('num_target_rows_inserted')} inserted in {source_update_s:.1f}s"
    )

    # The daily partitions an orchestrator would run next: through the increment's day.
    run_request = LoadRequest(
        day_floor(instant(first_us)), day_after(instant(last_us)), run_id="incremental"
    )
    ids = increment.column("order_id")
    overlapping = files_overlapping(target_path, pc.min(ids).as_py(), pc.max(ids).as_py())
    incremental, incremental_s = timed(
        lambda: run_load(spark, spec, target, run_request, staging_dir=str(stage))
    )
    say(
        f"incremental: {incremental_s:.1f}s {incremental.phase_seconds} "
        f"+{incremental.rows_inserted} ~{incremental.rows_updated} rows; files "
        f"overlapping the increment's keys {overlapping} of {target_files}, "
        f"removed {incremental.files_removed} added {incremental.files_added}"
    )
    merge_metrics = last_operation_metrics(target_path)

    empties = []
    for i in range(args.empty_runs):
        request = LoadRequest(
            run_request.partition_start, run_request.partition_end, run_id=f"e{i}"
        )
        empties.append(timed(lambda r=request: run_load(spark, spec, target, r)))
    empty, empty_s = sorted(empties, key=lambda e: e[1])[len(empties) // 2]
    say(f"empty run: {empty_s:.2f}s (median of {len(empties)}), mode {empty.window}")

    full_spec = table_spec(source, full_path)
    full_target = DeltaTarget(full_spec.name, full_path)
    full_request = LoadRequest(HISTORY_START, day_after(instant(last_us)), run_id="full")
    full, full_s = timed(
        lambda: run_load(spark, full_spec, full_target, full_request, staging_dir=str(stage))
    )
    say(
        f"full reload: {full.rows_inserted} rows, {live_files(full_path)} files in "
        f"{full_s:.1f}s {full.phase_seconds}"
    )

    result = SizeResult(
        rows=rows,
        source_files=source_files,
        generate_s=generate_s,
        initial_s=initial_s,
        initial=initial,
        target_files=target_files,
        source_update_s=source_update_s,
        incremental_s=incremental_s,
        incremental=incremental,
        files_overlapping=overlapping,
        rows_copied=int(merge_metrics.get("num_target_rows_copied", 0)),
        empty_s=empty_s,
        empty=empty,
        full_s=full_s,
        full=full,
        rows_incremental_target=row_count(target.open()),
        rows_full_target=row_count(full_target.open()),
    )
    result.mismatch = check(result, args, spark, spec, target)
    if result.mismatch:
        say(f"WARNING: {result.mismatch}")
    if not args.keep_data:
        shutil.rmtree(root, ignore_errors=True)
    return result


def check(result: SizeResult, args, spark, spec, target) -> str:
    """The incremental run did what the increment asks, and matches the full reload."""
    updates = args.increment // 2
    problems = []
    inc = result.incremental
    if result.initial.rows_inserted != result.rows:
        problems.append(f"initial load wrote {result.initial.rows_inserted} rows")
    if inc.mode != "incremental":
        problems.append(f"the timed run was a {inc.mode} run")
    if (inc.rows_inserted, inc.rows_updated) != (args.increment - updates, updates):
        problems.append(f"incremental wrote +{inc.rows_inserted} ~{inc.rows_updated}")
    if result.empty.committed:
        problems.append("the empty run committed")
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


def _say(rows: int) -> Callable[[str], None]:
    def say(text: str) -> None:
        print(f"[{rows:>11,}] {text}", flush=True)

    return say


# --- report ---------------------------------------------------------------------------


def table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *[line(r) for r in body]])


def report(results: list[SizeResult], startup: tuple[float, float], increment: int) -> str:
    main = table(
        [
            "size",
            "target files",
            "incremental s",
            "full reload s",
            "ratio full/incr",
            "files rewritten by the merge",
        ],
        [
            [
                f"{r.rows:,}",
                str(r.target_files),
                f"{r.incremental_s:.2f}",
                f"{r.full_s:.2f}",
                f"{r.ratio:.1f}x",
                f"{r.incremental.files_removed} of {r.target_files}",
            ]
            for r in results
        ],
    )

    def phases(res: LoadResult) -> str:
        p = res.phase_seconds
        return "/".join(f"{p.get(k, 0):.1f}" for k in ("probe", "extract", "commit"))

    details = table(
        [
            "size",
            "source files",
            "initial load s",
            "incr probe/extract/commit s",
            "files overlapping incr keys",
            "rows copied by merge",
            "empty run s",
            "full probe/extract/commit s",
            "check",
        ],
        [
            [
                f"{r.rows:,}",
                str(r.source_files),
                f"{r.initial_s:.2f}",
                phases(r.incremental),
                f"{r.files_overlapping} of {r.target_files}",
                f"{r.rows_copied:,}",
                f"{r.empty_s:.2f}",
                phases(r.full),
                r.mismatch or "ok",
            ]
            for r in results
        ],
    )
    session_s, first_job_s = startup
    overhead = statistics.median(r.empty_s for r in results) if results else float("nan")
    return "\n".join(
        [
            f"Incremental run of {increment:,} rows ({increment // 2:,} updates to recent "
            f"rows, {increment - increment // 2:,} inserts) vs full reload",
            "",
            main,
            "",
            details,
            "",
            f"spark start-up: {session_s + first_job_s:.2f} s (session {session_s:.2f} s + "
            f"first job {first_job_s:.2f} s)",
            f"empty-run overhead: {overhead:.2f} s (median over sizes of an incremental run "
            "with nothing new)",
        ]
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default="1000000,5000000,20000000",
        help="target sizes in rows, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--increment", type=int, default=50_000, help="rows per increment (default: %(default)s)"
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
        "--empty-runs", type=int, default=3, help="empty runs per size, median reported"
    )
    parser.add_argument(
        "--warmup-rows",
        type=int,
        default=200_000,
        help="size of an unreported warm-up round before the first size; 0 skips it "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also compare the incremental target with a full reload row by row (slow)",
    )
    parser.add_argument(
        "--keep-data", action="store_true", help="keep each size's tables after measuring it"
    )
    args = parser.parse_args(argv)
    args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    if args.increment < 2 or any(s < 1 for s in args.sizes):
        parser.error("--increment must be at least 2 and sizes positive")
    if args.warmup_rows:
        args.warmup_rows = max(args.warmup_rows, args.increment)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    spark, session_s = timed(lambda: local_session("incremental-vs-full"))
    _, first_job_s = timed(lambda: spark.range(1).collect())
    print(f"spark start-up: session {session_s:.2f}s, first job {first_job_s:.2f}s", flush=True)
    try:
        if args.warmup_rows:
            # One untimed small round first, so JIT and caches do not bill the first size.
            print(f"warm-up round of {args.warmup_rows:,} rows (not reported)", flush=True)
            run_size(spark, args.warmup_rows, args, verbose=False)
        results = [run_size(spark, rows, args) for rows in args.sizes]
    finally:
        spark.stop()
    print()
    print(report(results, (session_s, first_job_s), args.increment))
    return 1 if any(r.mismatch for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
