"""Wide rows: files bounded by a file's bytes as well as its rows, against rows alone.

A table's files hold at most ``ROWS_PER_FILE`` rows (1M) and about ``BYTES_PER_FILE``
bytes (128 MiB): where rows are wide, fewer rows to a file (``store.rows_per_file``). An
increment rewrites (without deletion vectors) every file its keys fall in, so the file's
size is what one change costs. This builds the same table both ways and applies the same
increment to each, in one process:

1. a source of ``--rows`` orders, each with a ``note`` of ``--note-bytes`` random bytes as
   hex text (about twice that many bytes a row in Parquet: it does not compress): a Delta
   table (the rows' size from its log), a folder of Parquet files (``--source parquet``:
   from their footers) or of JSON lines with a quality rule (``--source json``: its first
   load stages the increment, whose Parquet files give the size) or without one
   (``--source json-once``: its first load writes the increment once, as the table; a
   sample of its rows written as Parquet gives the size);
2. the engine's first load of it each way (twice, taking turns; the second counts):
   files bounded by rows only (``BYTES_PER_FILE`` set out of reach, the bound before it
   existed) and by rows and bytes (the default);
3. an increment of ``--changes`` updates to the newest orders and as many new ones, loaded
   into each target, ``--rounds`` times on fresh copies, taking turns.

It prints, for each way: the first load's files and seconds, the largest file, then the
increment's rows written, files rewritten and seconds (median of the rounds).

Run from the repository root (about 4 minutes here, 4 GB of disk)::

    .venv/bin/python benchmarks/wide_rows.py
    .venv/bin/python benchmarks/wide_rows.py --rows 200000 --rounds 1   # smoke run
    .venv/bin/python benchmarks/wide_rows.py --source parquet
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from incremental_assets.engine import DeltaTarget, LoadRequest, run_load
from incremental_assets.engine.delta_lake import store
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import TableSpec

START = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
CHUNK = 100_000
# The bound on a file's bytes, by way: out of reach (rows alone), and the engine's.
WAYS = {"rows only": 2**62, "rows and bytes": store.BYTES_PER_FILE}


JSON_SCHEMA = "order_id BIGINT, status STRING, amount DOUBLE, note STRING, updated_at TIMESTAMP"


def spec(source: str, kind: str = "delta") -> TableSpec:
    extra: dict = {}
    fmt = kind.removesuffix("-once")
    if kind == "json":
        extra = {"quality": {"rules": [{"name": "amount_known", "check": "amount IS NOT NULL"}]}}
    return TableSpec.model_validate(
        {
            "name": "orders",
            "source": {
                "format": fmt,
                "path": source,
                **({"schema": JSON_SCHEMA} if fmt == "json" else {}),
            },
            "keys": ["order_id"],
            "watermark": {"column": "updated_at", "kind": "timestamp", "lookback": "0s"},
            "strategy": "upsert",
            "partitioning": {"granularity": "daily", "start": f"{START:%Y-%m-%d}"},
            **extra,
        }
    )


def deliver(source: str, kind: str, rows: pa.Table) -> None:
    """``rows`` into the source: a Delta append, or a new Parquet or JSON-lines file."""
    if kind == "delta":
        write_deltalake(source, rows, mode="append")
        return
    folder = Path(source)
    folder.mkdir(parents=True, exist_ok=True)
    name = folder / f"part-{len(list(folder.iterdir())):05d}.{kind.removesuffix('-once')}"
    if kind == "parquet":
        pq.write_table(rows, name)
        return
    frame = rows.to_pandas()
    frame["updated_at"] = frame["updated_at"].map(lambda t: t.isoformat())
    frame.to_json(name, orient="records", lines=True)


def orders(first: int, n: int, day: int, note_bytes: int) -> pa.Table:
    ids = range(first, first + n)
    stamp = START + (day - 1) * DAY + timedelta(hours=1)
    return pa.table(
        {
            "order_id": pa.array(list(ids), pa.int64()),
            "status": [f"s{i % 7}" for i in ids],
            "amount": pa.array([float(i % 997) for i in ids]),
            "note": [os.urandom(note_bytes).hex() for _ in ids],
            "updated_at": pa.array([stamp] * n, pa.timestamp("us", tz="UTC")),
        }
    )


def files_of(path: str) -> list[tuple[int, int]]:
    """Each live file's rows and bytes."""
    actions = DeltaTable(path).get_add_actions(flatten=True)
    return list(
        zip(
            actions.column("num_records").to_pylist(),
            actions.column("size_bytes").to_pylist(),
            strict=True,
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_500_000, help="source rows")
    parser.add_argument("--note-bytes", type=int, default=500, help="random bytes a row")
    parser.add_argument("--changes", type=int, default=20_000, help="updates (and inserts)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", help="where the temporary folder goes")
    parser.add_argument(
        "--source", choices=["delta", "parquet", "json", "json-once"], default="delta"
    )
    args = parser.parse_args(argv)
    spark = local_session("wide-rows")
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        root = Path(tmp)
        source = str(root / "source")
        kind = args.source
        for first in range(0, args.rows, CHUNK):
            n = min(CHUNK, args.rows - first)
            deliver(source, kind, orders(first, n, 1, args.note_bytes))
        size = sum(f.stat().st_size for f in Path(source).rglob("*") if f.is_file())
        print(
            f"{kind} source: {args.rows:,} rows, {size / 2**20:,.0f} MiB, "
            f"{size / args.rows:,.0f} bytes a row; increment: {args.changes:,} updates to "
            f"the newest orders and {args.changes:,} new ones",
            flush=True,
        )
        # Each way's first load twice, taking turns; the second counts (the first of all
        # runs on a cold JVM).
        loaded: dict[str, tuple[float, list[tuple[int, int]]]] = {}
        for way, bound in [*WAYS.items(), *WAYS.items()]:
            store.BYTES_PER_FILE = bound
            path = root / way.replace(" ", "_")
            shutil.rmtree(path, ignore_errors=True)
            began = time.perf_counter()
            target = DeltaTarget("orders", str(path))
            run_load(spark, spec(source, kind), target, LoadRequest(START, START + DAY))
            loaded[way] = (time.perf_counter() - began, files_of(str(path)))
        newest = args.rows - args.changes
        deliver(source, kind, orders(newest, 2 * args.changes, 2, args.note_bytes))
        seconds: dict[str, list[float]] = {way: [] for way in WAYS}
        written: dict[str, tuple[int, int]] = {}
        for r in range(args.rounds):
            for way, bound in WAYS.items():
                store.BYTES_PER_FILE = bound
                copy = root / f"run-{r}-{way.replace(' ', '_')}"
                shutil.copytree(root / way.replace(" ", "_"), copy)
                began = time.perf_counter()
                result = run_load(
                    spark,
                    spec(source, kind),
                    DeltaTarget("orders", str(copy)),
                    LoadRequest(START + DAY, START + 2 * DAY),
                )
                seconds[way].append(time.perf_counter() - began)
                metrics = DeltaTable(str(copy)).history(1)[0]["operationMetrics"]
                written[way] = (int(metrics["numOutputRows"]), result.files_removed)
                shutil.rmtree(copy)
        print(
            f"{'files bounded by':>16} {'first load s':>12} {'files':>5} {'largest file':>20} "
            f"{'rows written':>12} {'files rewritten':>15} {'increment s':>11}  each run (s)"
        )
        for way in WAYS:
            load_s, files = loaded[way]
            rows, size = max(files, key=lambda f: f[1])
            largest = f"{rows:,} rows, {size / 2**20:,.0f} MiB"
            out, removed = written[way]
            runs = " ".join(f"{s:.2f}" for s in seconds[way])
            print(
                f"{way:>16} {load_s:12.1f} {len(files):>5} {largest:>20} {out:>12,} "
                f"{removed:>15} {statistics.median(seconds[way]):11.2f}  {runs}",
                flush=True,
            )
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
