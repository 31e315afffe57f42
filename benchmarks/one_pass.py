"""A run that re-reads rows (a lookback) merged in one pass or in two, by table size.

Without deletion vectors the engine merges a run that re-reads rows in two passes (the
staged rows joined with the target to keep those that act, then merged), so Delta does
not rewrite a file only for rows that change nothing; when the files the staged keys may
fall in total at most ``target.one_pass_below`` (16 MiB by default) it takes one pass and
Delta rewrites those files whole (docs/runs.md, "Commit"). This measures both ways on the
same run, at table sizes around that default, to show where the setting stands:

1. a Delta source of ``rows`` orders stamped over day 1, loaded into a target (upsert by
   ``order_id`` on ``updated_at``, a 2-hour lookback, daily partitions);
2. day 2: 500 orders updated and 500 new, stamped in day 2; day 2's run also re-reads the
   last 2 hours of day 1 (about 1/12 of the table, unchanged), spread over every file.
   The updated orders are random ones (``--changes spread``: they fall in every file too)
   or the 500 highest ids (``clustered``: the last file alone, in the table's key order),
   where one pass rewrites files only for the re-read rows;
3. that run, on a copy of the target each time, with ``one_pass_below: 0`` (two passes)
   and with it above the table's size (one pass), alternated ``--rounds`` times.

Run from the repository root (~3 minutes here)::

    .venv/bin/python benchmarks/one_pass.py
    .venv/bin/python benchmarks/one_pass.py --changes clustered
    .venv/bin/python benchmarks/one_pass.py --sizes 100000 --rounds 1   # smoke run
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from incremental_assets.engine import DeltaTarget, LoadRequest, run_load
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import TableSpec

START = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
VARIANTS = {"two passes": 0, "one pass": 2**40}


def spec(source: str, one_pass_below: int) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": "orders",
            "source": {"format": "delta", "path": source},
            "keys": ["order_id"],
            "watermark": {"column": "updated_at", "kind": "timestamp", "lookback": "2h"},
            "strategy": "upsert",
            "partitioning": {"granularity": "daily", "start": f"{START:%Y-%m-%d}"},
            "target": {"one_pass_below": one_pass_below},
        }
    )


def orders(ids: list[int], day: int, rng: random.Random) -> pa.Table:
    stamps = [START + (day - 1) * DAY + timedelta(seconds=rng.randrange(86_000)) for _ in ids]
    return pa.table(
        {
            "order_id": pa.array(ids, pa.int64()),
            "status": [f"s{i % 7}" for i in ids],
            "amount": pa.array([float(i % 997) for i in ids]),
            "note": [f"note {i} " * 3 for i in ids],
            "updated_at": pa.array(stamps, pa.timestamp("us", tz="UTC")),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,600000,2000000", help="table rows")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--changes", choices=["spread", "clustered"], default="spread")
    parser.add_argument("--data-dir", help="where the temporary folder goes")
    args = parser.parse_args(argv)
    spark = local_session("one-pass", **{"spark.sql.shuffle.partitions": "8"})
    spark.sparkContext.setLogLevel("ERROR")
    print(f"changes {args.changes}")
    print(
        f"{'rows':>9} {'table MiB':>9} {'files':>5} {'variant':>10} {'rewritten':>9} "
        f"{'median s':>9}  each run (s)"
    )
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        for rows in (int(s) for s in args.sizes.split(",")):
            rng = random.Random(rows)
            root = Path(tmp) / str(rows)
            source = str(root / "source")
            write_deltalake(source, orders(list(range(rows)), 1, rng))
            base = DeltaTarget("orders", str(root / "target"))
            run_load(spark, spec(source, 0), base, LoadRequest(START, START + DAY))
            sizes = DeltaTable(base.path).get_add_actions(flatten=True).column("size_bytes")
            mib, files = sum(sizes.to_pylist()) / 2**20, len(sizes)
            if args.changes == "spread":
                updated = rng.sample(range(rows), 500)
            else:
                updated = list(range(rows - 500, rows))
            changed = updated + list(range(rows, rows + 500))
            (
                DeltaTable(source)
                .merge(orders(changed, 2, rng), "t.order_id = s.order_id", "s", "t")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
            seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
            rewritten: dict[str, int] = {}
            for r in range(args.rounds):
                for variant, below in VARIANTS.items():
                    copy = root / f"run-{r}-{below}"
                    shutil.copytree(base.path, copy)
                    began = time.perf_counter()
                    result = run_load(
                        spark,
                        spec(source, below),
                        DeltaTarget("orders", str(copy)),
                        LoadRequest(START + DAY, START + 2 * DAY),
                    )
                    seconds[variant].append(time.perf_counter() - began)
                    rewritten[variant] = result.files_removed
                    shutil.rmtree(copy)
            for variant, each in seconds.items():
                runs = " ".join(f"{s:.2f}" for s in each)
                print(
                    f"{rows:>9} {mib:9.1f} {files:>5} {variant:>10} {rewritten[variant]:>9} "
                    f"{statistics.median(each):9.2f}  {runs}",
                    flush=True,
                )
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
