"""Regenerate the README's pictures of the Dagster UI: docs/images/asset-graph.png (the
global asset lineage) and docs/images/asset-plot.png (the orders asset's metadata plotted
over its materializations).

    .venv/bin/python scripts/screenshots.py [--rounds 2] [--out docs/images] [--keep]

What it does, all in a throwaway folder (the project's own data/ and Dagster instance are
never touched):

1. copies tables.yaml, dagster.yaml and workspace.yaml into a temporary folder and runs the
   demo there (``incremental_assets.demo.run.main(rounds=..., root=<folder>)``, in a
   subprocess, with DAGSTER_HOME and INCREMENTAL_ASSETS_TABLES pointing at the folder);
2. starts ``dagster dev`` on that instance on a free port and waits until it answers;
3. drives headless Chromium over the DevTools protocol: opens each page, waits until the
   React app has drawn what the picture is about (not just until the page loaded), clicks
   where needed, and saves a PNG;
4. stops the server and Chromium and deletes the folder (``--keep`` keeps it).

The server and browser driver is the browser test's
(``incremental_assets_tests/ui/browser.py``). Needs Chromium (on Debian/Ubuntu:
``apt-get install chromium``; or set CHROMIUM to a Chrome/Chromium binary) and Java 17+
for the demo's Spark.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from incremental_assets_tests.ui.browser import (
    HEIGHT,
    NO_CHROMIUM,
    PROJECT,
    WIDTH,
    Browser,
    UIError,
    asset_graph,
    dagster_dev,
    demo_folder,
    dismiss_popups,
    find_chromium,
    metadata_plots,
    scroll_to_plot,
)

DEMO_ASSETS = ["orders", "events", "customers", "customers_history", "products"]
PLOTTED_ASSET = "orders"
# The metadata plots are in alphabetical order, two a row; the picture starts at this
# one's row (files_removed and lag_seconds, then rows_before_start and rows_deleted, ...).
FIRST_PLOT = "lag_seconds"


def say(message: str) -> None:
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()


def run_demo(root: Path, rounds: int, env: dict[str, str], log: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from incremental_assets.demo.run import main; "
        f"sys.exit(main(rounds={rounds}, root=Path({str(root)!r})))"
    )
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise UIError(f"the demo failed (exit {done.returncode}); log {log}:\n{tail}")


def settle(seconds: float = 2.0) -> None:
    """Let animations (the graph's centring, the charts' drawing) finish."""
    time.sleep(seconds)


def take_pictures(browser: Browser, url: str, out: Path) -> list[Path]:
    graph, plot = out / "asset-graph.png", out / "asset-plot.png"

    # (a) The global asset lineage: the demo's tables, each with its latest
    # materialization and checks. A taller window so that all of them fit unzoomed.
    browser.viewport(WIDTH, 1250)
    asset_graph(browser, url, DEMO_ASSETS)
    settle()
    dismiss_popups(browser)
    settle(0.5)
    browser.screenshot(graph)
    say(f"  wrote {graph}")

    # (b) One asset's numeric metadata, plotted over its materializations: the Overview
    # tab's Metadata section, switched from Table to Plots and from Partitions to Events.
    browser.viewport(WIDTH, HEIGHT)
    plots = metadata_plots(browser, url, PLOTTED_ASSET, [FIRST_PLOT, "rows_inserted"])
    settle()
    dismiss_popups(browser)
    if not scroll_to_plot(browser, FIRST_PLOT):
        raise UIError(f"no plot of {FIRST_PLOT} (plots: {', '.join(plots)})")
    settle(1)
    browser.screenshot(plot)
    say(f"  wrote {plot} (plots: {', '.join(plots)})")
    return [graph, plot]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="demo rounds (default 2)")
    parser.add_argument(
        "--out", type=Path, default=PROJECT / "docs" / "images", help="default docs/images"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        say(f"error: {NO_CHROMIUM}")
        return 2

    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="incremental-assets-screenshots-"))
    env = demo_folder(root)
    try:
        say(f"Running the demo ({args.rounds} rounds) in {root} ...")
        run_demo(root, args.rounds, env, root / "demo.log")
        say(f"  done in {time.monotonic() - started:.0f}s; starting dagster dev ...")
        with dagster_dev(root, env, root / "dagster-dev.log") as url:
            say(f"  {url} answers; taking screenshots with {chromium} ...")
            with Browser(chromium, root / "chromium-profile", root / "chromium.log") as browser:
                take_pictures(browser, url, args.out)
    except UIError as error:
        say(f"error: {error}")
        return 1
    finally:
        if args.keep:
            say(f"Kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    say(f"Done in {time.monotonic() - started:.0f}s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
