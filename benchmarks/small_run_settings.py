"""Spark and Delta settings on a small run: tens of rows upserted into a table of tens,
the size of a test's run and of a quiet day of a small table, where a run's time is the
driver's planning, not its tasks.

In one warm local session (the engine's defaults), each round loads a fresh table twice
(a first load, then an incremental run that updates half its rows and inserts as many)
once per variant, the variants' order turning each round; a variant's settings are set
for its two runs and the session's own values restored after. The first rounds are not
counted (the JVM's warm-up). Printed: each variant's median seconds and Spark jobs, and
its ratio to the engine's defaults. Run from the repository root::

    .venv/bin/python benchmarks/small_run_settings.py              # about 6 minutes here
    .venv/bin/python benchmarks/small_run_settings.py --rounds 12 --rows 200
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from incremental_assets.engine import DeltaTarget, LoadRequest, run_load
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import TableSpec

VARIANTS: dict[str, dict[str, str]] = {
    "engine defaults": {},
    "adaptive execution off": {"spark.sql.adaptive.enabled": "false"},
    "Delta data skipping off": {"spark.databricks.delta.stats.skipping": "false"},
    # The plan's text each SQL execution's start event carries (the UI's SQL tab), even
    # with the UI off: Spark's default layout, where the engine's local session asks for
    # the plain tree (spark_session.LOCAL_DEFAULTS).
    "plan text formatted": {"spark.sql.ui.explainMode": "formatted"},
    # Delta caches a snapshot's state (its files and their statistics) serialized
    # (MEMORY_AND_DISK_SER): deserialized, or not cached at all.
    "snapshot cache MEMORY_ONLY": {
        "spark.databricks.delta.snapshotCache.storageLevel": "MEMORY_ONLY"
    },
    "snapshot cache NONE": {"spark.databricks.delta.snapshotCache.storageLevel": "NONE"},
    # Tasks that rebuild a snapshot's state from the log: a local master's cores, at most
    # 8 (spark_session.spark_conf), against 8 whatever the cores (the default until
    # 2026-12-04).
    "snapshot partitions 8": {"spark.databricks.delta.snapshotPartitions": "8"},
}
SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("status", pa.string()),
        ("amount", pa.float64()),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)


def orders(ids: range, status: str, day: int) -> pa.Table:
    stamp = datetime(2026, 1, day, 1, tzinfo=UTC)
    return pa.table(
        {
            "order_id": list(ids),
            "status": [status] * len(ids),
            "amount": [float(i) for i in ids],
            "updated_at": [stamp] * len(ids),
        },
        schema=SCHEMA,
    )


def spec(source: Path) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": "orders",
            "source": {"format": "delta", "path": str(source)},
            "keys": ["order_id"],
            "watermark": {"column": "updated_at", "kind": "timestamp", "lookback": "0s"},
            "strategy": "upsert",
            "partitioning": {"granularity": "daily", "start": "2026-01-01"},
        }
    )


def day(n: int) -> LoadRequest:
    return LoadRequest(datetime(2026, 1, n, tzinfo=UTC), datetime(2026, 1, n + 1, tzinfo=UTC))


def timed(spark, group: str, action) -> tuple[float, int]:
    """``action``'s seconds and its Spark jobs (counted once Spark's listener, which runs
    apart, has caught up: the same count twice, none running)."""
    context = spark.sparkContext
    context.setJobGroup(group, group)
    started = time.perf_counter()
    try:
        action()
    finally:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            context.setLocalProperty(key, None)
    seconds = time.perf_counter() - started
    tracker, before = context.statusTracker(), None
    for _ in range(50):
        jobs = tracker.getJobIdsForGroup(group)
        if len(jobs) == before and not tracker.getActiveJobsIds():
            break
        before = len(jobs)
        time.sleep(0.1)
    return seconds, len(jobs)


def one_table(spark, folder: Path, rows: int, tag: str) -> tuple[float, int, float, int]:
    source, table = folder / "source", spec(folder / "source")
    target = DeltaTarget("orders", str(folder / "warehouse" / "orders"))
    write_deltalake(str(source), orders(range(1, rows + 1), "placed", 1))
    first = timed(spark, f"{tag}-first", lambda: run_load(spark, table, target, day(1)))
    changed = orders(range(rows // 2 + 1, rows + rows // 2 + 1), "shipped", 2)
    write_deltalake(str(source), changed, mode="append")
    second = timed(spark, f"{tag}-second", lambda: run_load(spark, table, target, day(2)))
    return (*first, *second)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="counted rounds")
    parser.add_argument("--warmup", type=int, default=3, help="rounds not counted")
    parser.add_argument("--rows", type=int, default=20, help="rows of the first load")
    args = parser.parse_args()
    spark = local_session("small-run-settings")
    measured: dict[str, list[tuple[float, int, float, int]]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    root = Path(tempfile.mkdtemp(prefix="small-run-settings-"))
    try:
        for n in range(args.warmup + args.rounds):
            turn = names[n % len(names) :] + names[: n % len(names)]
            for name in turn:
                # The session's own values come back after (unset would fall back to
                # Spark's defaults, not the engine's).
                kept = {key: spark.conf.get(key, None) for key in VARIANTS[name]}
                for key, value in VARIANTS[name].items():
                    spark.conf.set(key, value)
                try:
                    tag = f"{n}-{names.index(name)}"
                    found = one_table(spark, root / tag, args.rows, tag)
                finally:
                    for key, value in kept.items():
                        if value is None:
                            spark.conf.unset(key)
                        else:
                            spark.conf.set(key, value)
                if n >= args.warmup:
                    measured[name].append(found)
            print(f"round {n + 1} of {args.warmup + args.rounds}", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    report(measured, args)


def report(measured: dict[str, list[tuple[float, int, float, int]]], args) -> None:
    def median(name: str, i: int) -> float:
        # Job counts: one of the rounds' own counts, not a half between two.
        take = statistics.median if i in (0, 2) else statistics.median_low
        return take([m[i] for m in measured[name]])

    base = next(iter(measured))
    base_first, base_second = median(base, 0), median(base, 2)
    updated, inserted = args.rows - args.rows // 2, args.rows // 2
    print(
        f"\n{args.rows} rows loaded, then {updated} updated and {inserted} "
        f"inserted; medians of {args.rounds} rounds (after {args.warmup} not counted), "
        "variants interleaved in one warm session\n"
    )
    wide = max(len(name) for name in measured)
    header = (
        f"{'variant':<{wide}} | {'first load s':>12} | {'jobs':>4} | {'x':>5} | "
        f"{'incremental s':>13} | {'jobs':>4} | {'x':>5}"
    )
    print(header)
    print("-" * len(header))
    for name in measured:
        first, second = median(name, 0), median(name, 2)
        print(
            f"{name:<{wide}} | {first:>12.2f} | {median(name, 1):>4.0f} | "
            f"{first / base_first:>4.2f}x | {second:>13.2f} | {median(name, 3):>4.0f} | "
            f"{second / base_second:>4.2f}x"
        )


if __name__ == "__main__":
    main()
