"""Small runs interpreted or with code generation: a day of the demo's ``orders`` (an upsert
of ~47 changed rows into a ~1,000-row Delta table, ``warm_runs.py``'s project) loaded

1. **warm**: in one process with Spark started once, ``dg.materialize`` of one day after
   another, alternating a run as the engine decides (small: interpreted,
   engine/load/interpreted.py) with a run kept on code generation (the bound set to 0),
   so both see the same JVM at the same warmth; the step's seconds and the check run in
   the same step;
2. **cold**: ``dagster asset materialize`` in a fresh process (the shipped set-up: a JVM a
   run), alternating as the engine decides with code generation kept by the session
   (``spark.sql.codegen.wholeStage=true`` given to the JVM: a session that sets the key
   keeps its choice).

Prints one table: medians (the first warm run of each kind left out: the JVM's first
runs), the runs one by one, and the ratio. Run from the repository root::

    .venv/bin/python benchmarks/interpreted.py                # about 8 minutes here
    .venv/bin/python benchmarks/interpreted.py --warm 8 --cold 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import warm_runs

CODEGEN_KEPT = {"JAVA_TOOL_OPTIONS": "-Dspark.sql.codegen.wholeStage=true"}


def child(root: Path, runs: int, orders: int) -> dict[str, list]:
    """``runs`` in-process runs, alternating; per kind, (step seconds, interpreted)."""
    import dagster as dg

    from incremental_assets.dagster_layer.build import build_definitions
    from incremental_assets.engine.load import interpreted
    from incremental_assets.engine.spark_session import start_session
    from incremental_assets.specs import load_project

    project = load_project(root / "tables.yaml")
    defs = build_definitions(project)
    start_session(dict(defs.resources["spark"].spark_config))
    asset = defs.get_assets_def("orders")
    bound = interpreted.BELOW
    out: dict[str, list] = {"engine": [], "codegen": []}
    with dg.DagsterInstance.get() as instance:
        for i in range(runs):
            kind = "codegen" if i % 2 else "engine"
            interpreted.BELOW = bound if kind == "engine" else 0
            n = 2 + i
            warm_runs.write_orders(root, n, orders)
            result = dg.materialize(
                [asset],
                partition_key=f"{warm_runs.day(n):%Y-%m-%d}",
                instance=instance,
                resources=defs.resources,
                selection=[asset.key],
                run_config=warm_runs.QUIET,
            )
            assert result.success
            events = {
                e.dagster_event.event_type_value: e.timestamp
                for e in instance.all_logs(result.run_id)
                if e.dagster_event is not None
            }
            (materialized,) = result.asset_materializations_for_node("orders")
            out[kind].append(
                (
                    round(events["STEP_SUCCESS"] - events["STEP_START"], 2),
                    materialized.metadata["spark_interpreted"].value,
                )
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", type=int, default=16, help="warm runs, both kinds (16)")
    parser.add_argument("--cold", type=int, default=4, help="fresh processes of each kind (4)")
    parser.add_argument("--orders", type=int, default=1000, help="rows of day 1 (1000)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(Path(args.child), args.warm, args.orders)))
        return

    root = Path(tempfile.mkdtemp(prefix="interpreted-"))
    try:
        ui_port = warm_runs.free_port()
        (root / "tables.yaml").write_text(warm_runs.tables_yaml(root, 1, ui_port))
        (root / "home").mkdir()
        shutil.copy(warm_runs.REPO / "dagster.yaml", root / "home" / "dagster.yaml")
        warm_runs.write_small_tables(root, 1)
        env = {
            **os.environ,
            "DAGSTER_HOME": str(root / "home"),
            "INCREMENTAL_ASSETS_TABLES": str(root / "tables.yaml"),
        }
        env.pop(warm_runs.REMOTE, None)
        warm_runs.cli_run(root, 1, args.orders, env)  # the table created, not counted
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(root), "--warm", str(args.warm),
             "--orders", str(args.orders)],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if not lines:
            raise SystemExit(f"the warm runs failed:\n{done.stderr[-4000:]}")
        warm = json.loads(lines[-1].removeprefix("RESULT "))
        assert all(flag for _, flag in warm["engine"]), warm  # small: interpreted
        assert not any(flag for _, flag in warm["codegen"]), warm
        cold: dict[str, list[float]] = {"engine": [], "codegen": []}
        n = 2 + args.warm
        for _ in range(args.cold):
            for kind in cold:
                extra = CODEGEN_KEPT if kind == "codegen" else {}
                cold[kind].append(round(warm_runs.cli_run(root, n, args.orders, env | extra), 2))
                n += 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(warm, cold)


def report(warm: dict[str, list], cold: dict[str, list[float]]) -> None:
    steps = {kind: [s for s, _ in runs] for kind, runs in warm.items()}
    rows = [
        ("warm step, in-process (s)", steps["engine"][1:], steps["codegen"][1:]),
        ("cold run, fresh process (s)", cold["engine"], cold["codegen"]),
    ]
    print(f"\n{'':<30} {'interpreted':>12} {'code generation':>16} {'ratio':>7}")
    for name, small, kept in rows:
        a, b = statistics.median(small), statistics.median(kept)
        print(f"{name:<30} {a:>12.2f} {b:>16.2f} {a / b:>7.2f}")
    pairs = list(zip(steps["engine"][1:], steps["codegen"][1:], strict=False))
    faster = sum(1 for a, b in pairs if a < b)
    print(f"\nwarm runs, alternating (interpreted, code generation): {pairs}")
    print(f"interpreted faster in {faster} of {len(pairs)} pairs")
    print(f"cold runs: interpreted {cold['engine']}, code generation {cold['codegen']}")


if __name__ == "__main__":
    main()
