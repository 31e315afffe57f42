"""The Dagster UI on a finished demo, in a real browser: what a person looks at is there,
and a backfill launched by clicking in the UI completes and leaves the table equal to a
full reload.

The demo runs once per test session (conftest.py ``finished_demo``, two rounds, shared
with the demo test); ``dagster dev`` (webserver and daemon, so that the daemon executes
the backfill) serves its folder and instance; headless Chromium reads the pages.
Everything asserted is what the pages show, except that the wait for the backfill's end
polls GraphQL (the page then shows the outcome) and the full reload is compared on the
Delta table by the project's own :func:`differences`.
"""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta

import pytest

from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.engine.reload import differences
from incremental_assets.specs import load_project
from incremental_assets_tests.servers import QUICK_JIT
from incremental_assets_tests.ui.browser import (
    NO_CHROMIUM,
    Browser,
    UIError,
    asset_graph,
    dagster_dev,
    find_chromium,
    graphql,
    metadata_plots,
)

pytestmark = pytest.mark.slow

CHROMIUM = find_chromium()
ASSET = "orders"
# Numeric metadata every load reports, each plotted over the asset's materializations.
PLOTTED = ["rows_extracted", "rows_inserted", "rows_updated", "rows_deleted", "lag_seconds"]


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_the_ui_shows_the_demo_and_backfills_from_it(finished_demo, tmp_path, monkeypatch, spark):
    assert finished_demo.code == 0, finished_demo.out
    root, rounds = finished_demo.root, finished_demo.rounds
    env = finished_demo.environment()
    monkeypatch.setenv("INCREMENTAL_ASSETS_TABLES", env["INCREMENTAL_ASSETS_TABLES"])
    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
    monkeypatch.chdir(root)

    project = load_project(root / "tables.yaml")
    defs = build_definitions(project)
    assets = [key.to_user_string() for key in defs.resolve_all_asset_keys()]
    start = project.table(ASSET).partitioning.start
    demo_days = [f"{start + timedelta(days=n):%Y-%m-%d}" for n in range(rounds)]
    # The backfill: the demo's last day (rows already loaded, read again) and the next.
    backfilled = [demo_days[-1], f"{start + timedelta(days=rounds):%Y-%m-%d}"]

    # The backfill's run starts a Spark of its own for a few small loads: the quick JIT
    # compiler, as the tests' other child runs have (servers.QUICK_JIT).
    env["JAVA_TOOL_OPTIONS"] = QUICK_JIT
    log = tmp_path / "dagster-dev.log"
    with (
        dagster_dev(root, env, log) as url,
        Browser(CHROMIUM, tmp_path / "chromium-profile", tmp_path / "chromium.log") as browser,
    ):
        # The asset graph lists every table (and the invoices' silver and gold), each node
        # with its latest event; a table's node shows the demo's days as its part filled.
        nodes = asset_graph(browser, url, assets)
        for spec in project.tables:
            partitions = int(re.search(r"(\d+) partitions", nodes[spec.name])[1])
            filled = f"{100 * rounds // partitions}% filled"
            assert filled in nodes[spec.name], (spec.name, nodes[spec.name])

        # An asset's partitions: the demo's days materialized, the others missing.
        assert materialized_partitions(browser, url, ASSET) == demo_days

        # An asset's metadata plots: drawn, one point a materialization.
        plots = metadata_plots(browser, url, ASSET, PLOTTED)
        assert set(PLOTTED) <= set(plots), plots

        # A backfill of two partitions, launched by clicking: the daemon runs it.
        backfill = launch_backfill(browser, url, ASSET, *backfilled)
        status = wait_for_backfill(url, backfill)
        assert status == "COMPLETED_SUCCESS", f"backfill {backfill} ended {status}; log {log}"
        browser.open(f"{url}/runs/b/{backfill}")
        # Right after the navigation the new document may have no body yet.
        page = browser.wait_for(
            "(text => text.includes('Succeeded') && text.includes('100% completed') && text)"
            "(document.body ? document.body.innerText : '')",
            f"backfill {backfill}'s page to show it succeeded",
        )
        assert f"{backfilled[0]}...{backfilled[1]}" in page
        assert materialized_partitions(browser, url, ASSET) == sorted({*demo_days, *backfilled})

    spec = project.table(ASSET)
    target = defs.resources["warehouse"].target(project, spec)
    assert differences(spark, spec, target) == (0, 0)


# --- the pages the test reads -----------------------------------------------------------

# A status filter's label on the Partitions tab ("Materialized (1)"): its count.
_STATUS_COUNT = """(status => {
  const label = [...document.querySelectorAll('label')]
    .find(label => label.innerText.trim().startsWith(status + ' ('));
  return label ? label.innerText.trim().slice(status.length + 2, -1) : null;
})"""

_UNCHECK_STATUS = """(status => {
  const label = [...document.querySelectorAll('label')]
    .find(label => label.innerText.trim().startsWith(status + ' ('));
  if (label && label.querySelector('input').checked) label.click();
  return !!label && !label.querySelector('input').checked;
})"""

# The partition keys the Partitions tab lists.
_LISTED_PARTITIONS = """[...document.querySelectorAll('[data-tooltip]')]
  .map(e => e.getAttribute('data-tooltip')).filter(key => /^\\d{4}-\\d{2}-\\d{2}$/.test(key))"""


def materialized_partitions(browser: Browser, url: str, asset: str) -> list[str]:
    """The Partitions tab's list, filtered to the materialized partitions (the other
    statuses unticked); checked against the count its Materialized filter shows."""
    browser.open(f"{url}/assets/{asset}?view=partitions")
    count = int(
        browser.wait_for(f"{_STATUS_COUNT}('Materialized')", f"{asset}'s partition statuses")
    )
    for status in ("Failed", "Materializing", "Missing"):
        assert browser.evaluate(f"{_UNCHECK_STATUS}({json.dumps(status)})"), status
    return sorted(
        browser.wait_for(
            f"(keys => keys.length === {count} && keys)({_LISTED_PARTITIONS})",
            f"{asset}'s list of {count} materialized partitions",
        )
    )


def launch_backfill(browser: Browser, url: str, asset: str, first: str, last: str) -> str:
    """Materialize… on the asset's page, the partition range typed into the dialog,
    Launch backfill; the backfill's id, from the page's "Created backfill" toast."""
    browser.open(f"{url}/assets/{asset}?view=partitions")
    browser.wait_for(f"{_STATUS_COUNT}('Materialized')", f"{asset}'s partitions")
    assert browser.click_button("Materialize…")
    browser.wait_for(
        "(input => input && (input.focus(), input.select(), true))"
        "(document.querySelector('[role=dialog] input[type=text]'))",
        "the launch dialog's partition selection",
    )
    browser.type(f"[{first}...{last}]")
    browser.press_enter()
    browser.wait_for(
        "(dialog => dialog && dialog.innerText.includes('2 partitions') && [...dialog"
        ".querySelectorAll('button')].some(b => b.innerText.trim() === 'Launch backfill'"
        " && !b.disabled))(document.querySelector('[role=dialog]'))",
        "the dialog to select 2 partitions and offer Launch backfill",
    )
    assert browser.click_button("Launch backfill")
    toast = browser.wait_for(
        "(document.body.innerText.match(/Created backfill (\\w+)/) || [])[1]",
        "the page to say the backfill was created",
    )
    return toast


def wait_for_backfill(url: str, backfill: str, timeout: float = 300) -> str:
    """Poll the backfill's status until it has ended; its status."""
    query = """query ($id: String!) {
      partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill { status } }
    }"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = graphql(url, query, id=backfill)["partitionBackfillOrError"]["status"]
        if status not in ("REQUESTED", "CANCELING", "FAILING"):
            return status
        time.sleep(2)
    raise UIError(f"backfill {backfill} did not end within {timeout:.0f}s")
