"""What each lever of the commit path buys, measured on the same increment: one initial
target per case and size, copied for every variant, each variant's incremental run timed
in turn (rounds interleaved, median reported), in one Spark session.

Variants (``--variants``, default all):

- ``plain``: a target without deletion vectors (the default): the rows that act, joined
  with the target and written beside the increment, then merged (two passes), unless the
  merge only inserts or the run's rows are all above the cursor (the benchmark's
  increments are: no lookback), then one pass;
- ``dv``: the target with deletion vectors (the documented migration), one pass: the
  MERGE reads the staged rows and its clauses alone decide;
- ``dv: two passes``: deletion vectors, but the two-pass commit (what one pass buys);
- ``plain: two passes``: no deletion vectors and the two-pass commit whatever the clauses
  (what ``plain``'s one pass buys: an insert-only merge, ``append``, or an upsert or CDC
  run above the cursor);
- ``plain: one pass``: no deletion vectors and the one-pass commit whatever the run (the
  same as ``plain`` on the benchmark's increments; measured before ``plain`` took it);
- ``plain: key range by a job``: as ``plain``, but the touched keys' range found by a
  Spark job of its own, as before the increment's write counted it
  (``delta_io.range_counters``);
- ``dv: optimized writes``: ``spark.databricks.delta.optimizeWrite.enabled``;
- ``plain: 8 files``, ``dv: 8 files``: the copy rewritten in key order into 8 files, as
  the first write made them before it bounded its files (``ROWS_PER_FILE``, 1M rows);
- ``plain: files of 250k rows``, ``dv: files of 250k rows``: smaller files than that;
- ``dv: no repartition``: ``spark.databricks.delta.merge.repartitionBeforeWrite.enabled``
  off (Delta's merge shuffles its output before writing by default);
- ``dv: materialized source``: ``spark.databricks.delta.merge.materializeSource`` back to
  Delta's default ``auto`` (the engine sets ``none``: its source is staged Parquet);
- ``plain: optimized writes``, ``plain: no repartition``, ``plain: materialized source``:
  the same three Delta settings on the default target, without deletion vectors;
- ``plain: liquid clustered``: the copy given Delta's liquid clustering by the first key
  (``ALTER TABLE ... CLUSTER BY``, then ``OPTIMIZE ... FULL``) instead of the first
  write's key-ordered files; ``plain: liquid clustered in bounded files``: the same, its
  files bounded as ``maintain`` bounds a compaction's (about ``ROWS_PER_FILE`` rows).

    .venv/bin/python benchmarks/levers.py --cases upsert,cdc_hard --sizes 5000000
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

from bench_cases import CASES
from bench_report import table
from incremental_vs_full import (
    Bench,
    copy_table,
    enable_deletion_vectors,
    increment_request,
    initial_request,
    remove_with_side_tables,
    side_tables,
)

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.commits import session_settings
from incremental_assets.engine.delta_lake.maintenance import target_file_bytes

# Delta's merge settings tried on either target (``dv: ...``, ``plain: ...``).
DELTA_SETTINGS = {
    "optimized writes": {"spark.databricks.delta.optimizeWrite.enabled": "true"},
    "no repartition": {"spark.databricks.delta.merge.repartitionBeforeWrite.enabled": "false"},
    "materialized source": {"spark.databricks.delta.merge.materializeSource": "auto"},
}

VARIANTS = {
    "plain": {"dv": False},
    "dv": {"dv": True},
    "dv: two passes": {"dv": True, "two_pass": True},
    "plain: two passes": {"dv": False, "two_pass": True},
    "plain: one pass": {"dv": False, "one_pass": True},
    "plain: key range by a job": {"dv": False, "range_job": True},
    "plain: 8 files": {"dv": False, "files": 8},
    "plain: files of 250k rows": {"dv": False, "file_rows": 250_000},
    "dv: 8 files": {"dv": True, "files": 8},
    "dv: files of 250k rows": {"dv": True, "file_rows": 250_000},
    **{
        f"{'dv' if dv else 'plain'}: {name}": {"dv": dv, "conf": conf}
        for dv in (True, False)
        for name, conf in DELTA_SETTINGS.items()
    },
    "plain: liquid clustered": {"dv": False, "liquid": True},
    "plain: liquid clustered in bounded files": {"dv": False, "liquid": True, "bounded": True},
}


class OnePassTarget(DeltaTarget):
    """The one-pass commit on any table: the MERGE reads the staged rows and its clauses
    alone decide (without deletion vectors, a matched row that does not act still has its
    file rewritten)."""

    def merges_in_one_pass(self, state, plan, *args) -> bool:
        return True


class TwoPassTarget(DeltaTarget):
    """The commit as on a table without deletion vectors, whatever the table: the staged
    rows that act, joined with the target and written beside the increment, then merged."""

    def merges_in_one_pass(self, state, plan, *args) -> bool:
        return False


class RangeJobTarget(DeltaTarget):
    """The commit without the key range the increment's write counted: the touched keys'
    range is found by a Spark job of its own."""

    def commit(self, *args, **kwargs):
        return super().commit(*args, **{**kwargs, "staged_keys": None})


def layout_of(settings: dict, rows: int) -> int | str | None:
    """Rows per file of the variant's target, when it rewrites the first write's files
    ("liquid": clustered by Delta instead)."""
    if settings.get("liquid"):
        return "liquid_bounded" if settings.get("bounded") else "liquid"
    if "files" in settings:
        return -(-rows // settings["files"])
    return settings.get("file_rows")


def rewrite_in_files(spark, path: str, rows_per_file: int, key: str) -> None:
    """The table's rows rewritten in key order, in files of at most ``rows_per_file``."""
    rows = spark.read.format("delta").load(path)
    n = max(1, -(-rows.count() // rows_per_file))
    (
        rows.repartitionByRange(n, key)
        .sortWithinPartitions(key)
        .write.format("delta")
        .mode("overwrite")
        .option("maxRecordsPerFile", rows_per_file)
        .save(path)
    )


def cluster_by_key(spark, path: str, key: str, bounded: bool) -> None:
    """The table given liquid clustering by ``key``, its files clustered by it (at most
    ``maintain``'s compaction size when ``bounded``, else Delta's default)."""
    spark.sql(f"ALTER TABLE delta.`{path}` CLUSTER BY ({key})")
    size = target_file_bytes(DeltaTarget("levers", path).open()) if bounded else None
    conf = {"spark.databricks.delta.optimize.maxFileSize": str(size)} if size else {}
    with session_settings(spark, conf):
        spark.sql(f"OPTIMIZE delta.`{path}` FULL")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="upsert,cdc_hard")
    parser.add_argument("--sizes", default="5000000,20000000")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--increment", type=int, default=50_000)
    parser.add_argument("--chunk-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parent / ".data" / "levers")
    )
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; use {', '.join(VARIANTS)}")
    bench = Bench(args)
    spark = bench.spark
    body = []
    try:
        for rows in [int(s) for s in args.sizes.split(",")]:
            for name in args.cases.split(","):
                case = CASES[name]
                body += measure_case(bench, case, rows, variants, args)
                print(table(HEADER, body, left=3), flush=True)
    finally:
        spark.stop()
    print()
    print(table(HEADER, body, left=3))
    return 0


HEADER = [
    "case",
    "size",
    "variant",
    "median s",
    "runs s",
    "task CPU s (median)",
    "commit s",
    "rows written",
    "files -removed +added",
    "MB read",
    "Spark jobs",
]


def measure_case(bench: Bench, case, rows: int, variants: list[str], args) -> list[list[str]]:
    spark = bench.spark
    root = Path(args.data_dir) / f"{case.name}_{rows}"
    shutil.rmtree(root, ignore_errors=True)
    stage = root / "stage"
    stage.mkdir(parents=True)
    source = str(root / "source")
    case.scenario.write_source(source, rows, args.chunk_rows)
    base = str(root / "initial")
    spec = case.spec(source, base)
    bench.load("initial", spec, DeltaTarget(spec.name, base), initial_request(rows), stage)
    layouts = {}
    for variant in variants:
        layout = layout_of(VARIANTS[variant], rows)
        if layout and layout not in layouts:
            path = str(root / f"layout_{layout}")
            copy_table(base, path)
            key = case.spec(source, path).keys[0]
            if isinstance(layout, str):
                cluster_by_key(spark, path, key, bounded=layout.endswith("bounded"))
            else:
                rewrite_in_files(spark, path, layout, key)
            layouts[layout] = path
    increment = case.scenario.increment(rows, args.increment, seed=rows)
    case.scenario.apply(source, increment)
    request = increment_request(increment, "incremental")
    runs: dict[str, list] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants if round_ % 2 == 0 else list(reversed(variants)):
            settings = VARIANTS[variant]
            origin = layouts.get(layout_of(settings, rows), base)
            path = str(root / "run")
            copy_table(origin, path)
            for side in side_tables(base):
                copy_table(side, path + side.removeprefix(base))
            if settings["dv"]:
                enable_deletion_vectors(spark, path)
            kind = (
                TwoPassTarget
                if settings.get("two_pass")
                else OnePassTarget
                if settings.get("one_pass")
                else RangeJobTarget
                if settings.get("range_job")
                else DeltaTarget
            )
            target = kind(spec.name, path)
            conf = settings.get("conf", {})
            before = {k: spark.conf.get(k, None) for k in conf}
            for k, v in conf.items():
                spark.conf.set(k, v)
            try:
                run = bench.load(variant, case.spec(source, path), target, request, stage)
            finally:
                for k, v in before.items():
                    spark.conf.unset(k) if v is None else spark.conf.set(k, v)
            assert delta_io.writes_deletion_vectors(target.open()) == settings["dv"]
            runs[variant].append(run)
            print(
                f"[{rows:,} {case.name}] {variant}: {run.seconds:.2f}s "
                f"{run.result.phase_seconds} {run.rows_written:,} rows written",
                flush=True,
            )
            remove_with_side_tables(path)
    shutil.rmtree(root, ignore_errors=True)
    out = []
    for variant in variants:
        found = sorted(runs[variant], key=lambda r: r.seconds)
        mid = found[len(found) // 2]
        out.append(
            [
                case.name,
                f"{rows:,}",
                variant,
                f"{mid.seconds:.2f}",
                " ".join(f"{r.seconds:.1f}" for r in runs[variant]),
                f"{statistics.median(r.measure.cpu_seconds for r in found):.1f}",
                f"{statistics.median(r.result.phase_seconds.get('commit', 0) for r in found):.2f}",
                f"{mid.rows_written:,}",
                f"-{mid.files_removed} +{mid.files_added}",
                f"{mid.measure.bytes_read / 1e6:,.0f}",
                str(len(mid.measure.jobs)),
            ]
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
