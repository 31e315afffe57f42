"""Where a small run's seconds go, by the line of the engine that asked Spark for them.

On a small increment a run's time is the sum of its Spark actions (each a job or a few,
~0.1-0.2 s apiece on 2 cores even for a handful of rows), not the data. This prints every
action one warm run issues (``collect``/``count``/``first``/``toArrow``, each write, each
``spark.sql``: a MERGE), with its milliseconds and the engine frames that called it, then
one line per strategy: actions, seconds in them, and the run's seconds. Use it before and
after a change to the load path: the actions listed are what a cut removes.

1. for each strategy (upsert, CDC with hard and with soft deletes, SCD2 over a CDC feed) a
   folder of Parquet change files (``--keys`` keys, ``--events`` events over ``--days``
   days, a file a day, now and then one held back and delivered with the next day's, so
   some runs read a late file, as in the test suite's histories);
2. the days loaded one run each into a fresh Delta target, in one Spark session (warm:
   Spark's start is not in any run); ``--rounds`` such passes, the last measured;
3. the listed run is the last day's of the last pass (its cursor and side tables as a
   daily run finds them).

Run from the repository root::

    .venv/bin/python benchmarks/run_actions.py                 # ~3 minutes here
    .venv/bin/python benchmarks/run_actions.py --cases hard --list
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrameWriter
from pyspark.sql.classic.dataframe import DataFrame
from pyspark.sql.session import SparkSession

from incremental_assets.engine import DeltaTarget, LoadRequest, run_load
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import TableSpec

START = datetime(2026, 1, 1, tzinfo=UTC)
FEED = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("op", pa.string()),
        ("lsn", pa.int64()),
        ("changed_at", pa.timestamp("us", tz="UTC")),
    ]
)
STRATEGIES = {
    "upsert": "upsert",
    "hard": {"kind": "cdc", "deletes": "hard"},
    "soft": {"kind": "cdc", "deletes": "soft"},
    "scd2": {"kind": "scd2", "changes": "cdc"},
}
# What counts as an action: the DataFrame calls that run a Spark job and return to the
# driver, every write, and SQL (a MERGE); nested calls (first -> head -> take -> collect)
# are counted once, at the outermost.
_ACTIONS = {
    DataFrame: ("count", "collect", "first", "isEmpty", "toArrow", "toPandas", "take", "head"),
    DataFrameWriter: ("parquet", "save", "text", "saveAsTable", "insertInto"),
    SparkSession: ("sql",),
}


@dataclass
class Recorder:
    """Each action's milliseconds and the engine frames that called it, while ``on``."""

    on: bool = False
    depth: int = 0
    actions: list[tuple[float, str, str]] = field(default_factory=list)

    def install(self) -> None:
        for cls, names in _ACTIONS.items():
            for name in names:
                setattr(cls, name, self._timed(cls, name, getattr(cls, name)))

    def _timed(self, cls, name, method):
        recorder = self

        def timed(self, *args, **kwargs):
            if not recorder.on or recorder.depth:
                return method(self, *args, **kwargs)
            frames = [
                f for f in traceback.extract_stack()[:-1] if "incremental_assets/" in f.filename
            ]
            where = " < ".join(
                f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}"
                for f in reversed(frames[-3:])
            )
            recorder.depth += 1
            began = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                recorder.depth -= 1
                recorder.actions.append((time.perf_counter() - began, f"{name}", where))

        return timed


def history(rng: random.Random, keys: int, events: int, days: int) -> list[list[tuple]]:
    """Change events by day: inserts first, then updates and deletes of live keys."""
    live: set[int] = set()
    by_day: list[list[tuple]] = [[] for _ in range(days)]
    for lsn in range(1, events + 1):
        day = min((lsn - 1) * days // events, days - 1)
        key = rng.randrange(keys)
        op = "I" if key not in live else rng.choice("UUUD")
        (live.discard if op == "D" else live.add)(key)
        when = START + timedelta(days=day, seconds=rng.randrange(86_400))
        by_day[day].append((key, f"n{rng.randrange(5)}", op, lsn, when))
    return by_day


def spec_for(kind: str, folder: Path) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": f"bench_{kind}",
            "source": {"format": "parquet", "path": str(folder)},
            "keys": ["id"],
            "watermark": {"column": "lsn", "kind": "id", "lookback": 0},
            "strategy": STRATEGIES[kind],
            "partitioning": {"granularity": "daily", "start": "2026-01-01", "column": "changed_at"},
        }
    )


def one_pass(spark, kind: str, root: Path, days: list[list[tuple]], seed: int, recorder, last):
    """Load ``days`` a run each (now and then a day's file held back and delivered late,
    with the next day's); with ``last``, record the last run's actions. Returns the last
    run's seconds."""
    rng = random.Random(seed)
    folder, target = root / f"{kind}-feed-{seed}", root / f"{kind}-target-{seed}"
    folder.mkdir(parents=True)
    spec = spec_for(kind, folder)
    delta = DeltaTarget(spec.name, str(target))
    held: list[tuple] = []
    seconds = 0.0
    for day, events in enumerate(days):
        files = [events]
        if held:
            files.append(held)  # yesterday's file arrives a day late
            held = []
        if 0 < day < len(days) - 1 and rng.random() < 0.3:
            held, files = files[0], files[1:]
        for i, rows in enumerate(files):
            if rows:
                named = [dict(zip(FEED.names, r, strict=True)) for r in rows]
                table = pa.Table.from_pylist(named, FEED)
                pq.write_table(table, folder / f"day-{day:03d}-{i}.parquet")
        end = START + timedelta(days=day + 1)
        recorder.on = last and day == len(days) - 1
        began = time.perf_counter()
        run_load(spark, spec, delta, LoadRequest(START + timedelta(days=day), end))
        seconds = time.perf_counter() - began
        recorder.on = False
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(STRATEGIES), help="comma-separated")
    parser.add_argument("--keys", type=int, default=120)
    parser.add_argument("--events", type=int, default=600)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="passes per case, last measured")
    parser.add_argument("--list", action="store_true", help="print every action of the run")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(STRATEGIES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}: choose among {', '.join(STRATEGIES)}")
    recorder = Recorder()
    recorder.install()
    spark = local_session("run-actions", **{"spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    days = history(random.Random(7), args.keys, args.events, args.days)
    summary = []
    with tempfile.TemporaryDirectory(prefix="run-actions-") as tmp:
        for kind in cases:
            for r in range(args.rounds):
                recorder.actions = []
                last = r == args.rounds - 1
                run_s = one_pass(spark, kind, Path(tmp), days, r, recorder, last)
            actions = recorder.actions
            if args.list:
                print(f"\n{kind}: the last day's run")
                for seconds, name, where in actions:
                    print(f"  {seconds * 1000:6.0f} ms  {name:<9} {where}")
            summary.append((kind, len(actions), sum(s for s, _, _ in actions), run_s))
    print(f"\n{'case':<8} {'actions':>7} {'s in actions':>12} {'run s':>6}")
    for kind, n, in_actions, run_s in summary:
        print(f"{kind:<8} {n:>7} {in_actions:>12.2f} {run_s:>6.2f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
