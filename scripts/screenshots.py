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
3. drives headless Chromium over the DevTools protocol (``--remote-debugging-pipe``, so no
   extra Python package is needed): opens each page, waits until the React app has drawn
   what the picture is about (not just until the page loaded), clicks where needed, and
   saves a PNG;
4. stops the server and Chromium and deletes the folder (``--keep`` keeps it).

Needs Chromium (on Debian/Ubuntu: ``apt-get install chromium``; or set CHROMIUM to a
Chrome/Chromium binary) and Java 17+ for the demo's Spark.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
PROJECT_FILES = ("tables.yaml", "dagster.yaml", "workspace.yaml")
WIDTH, HEIGHT = 1600, 1000
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def say(message: str) -> None:
    sys.stderr.write(f"{message}\n")
    sys.stderr.flush()


class ScreenshotError(RuntimeError):
    pass


# --- the demo and the server ---------------------------------------------------------


def run_demo(root: Path, rounds: int, env: dict[str, str], log: Path) -> None:
    for name in PROJECT_FILES:
        shutil.copy(PROJECT / name, root / name)
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
        raise ScreenshotError(f"the demo failed (exit {done.returncode}); log {log}:\n{tail}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def dagster_dev(root: Path, env: dict[str, str], log: Path) -> Iterator[str]:
    """``dagster dev`` on the instance in ``root``; yields its URL once it answers."""
    port = free_port()
    dagster = Path(sys.executable).with_name("dagster")
    command = [str(dagster), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        server = subprocess.Popen(
            command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for_server(url, server, log)
        # The UI greets a new instance with a "Join the Dagster community" dialog; tell
        # this throwaway instance it was seen so it stays out of the pictures.
        graphql(url, "mutation { setNuxSeen }")
        yield url
    finally:
        stop(server)


def wait_for_server(url: str, server: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    """Until the webserver answers and the code location has loaded."""
    query = "{ workspaceOrError { ... on Workspace { locationEntries { loadStatus } } } }"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise ScreenshotError(f"dagster dev exited ({server.returncode}); log {log}")
        try:
            status = graphql(url, query)
            if "LOADED" in status and "LOADING" not in status:
                return
        except OSError:
            pass
        time.sleep(1)
    raise ScreenshotError(f"dagster dev did not answer at {url} within {timeout:.0f}s; log {log}")


def graphql(url: str, query: str) -> str:
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def stop(process: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM to the process group the process leads (dagster dev, its webserver, daemon
    and code server), SIGKILL to whatever is left after ``grace`` seconds."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with suppress(subprocess.TimeoutExpired):
        process.wait(grace)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# --- headless Chromium over the DevTools protocol --------------------------------------


def find_chromium() -> str:
    candidates = [os.environ["CHROMIUM"]] if os.environ.get("CHROMIUM") else []
    candidates += [path for name in BROWSERS if (path := shutil.which(name))]
    for candidate in candidates:
        if Path(candidate).exists():
            return candidate
    raise ScreenshotError(
        "no Chromium found: install it (Debian/Ubuntu: `sudo apt-get install chromium`; "
        "macOS: install Google Chrome) or set CHROMIUM=/path/to/chrome"
    )


class Browser:
    """Headless Chromium driven over ``--remote-debugging-pipe`` (JSON messages ended by
    NUL on file descriptors 3 and 4): only the few DevTools commands the pictures need."""

    def __init__(self, executable: str, profile: Path, log: Path) -> None:
        to_browser_read, self._write = os.pipe()
        self._read, from_browser_write = os.pipe()
        command = [
            executable,
            "--headless",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            f"--window-size={WIDTH},{HEIGHT}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--mute-audio",
            "about:blank",
        ]
        if os.geteuid() == 0:
            command.insert(1, "--no-sandbox")  # Chromium refuses to run as root otherwise

        # Chromium reads commands on fd 3 and answers on fd 4. A tiny Python trampoline
        # moves the pipe's ends there (subprocess closes what a preexec_fn dup2 made, and
        # dash cannot redirect from descriptors above 9).
        trampoline = (
            "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
            "os.execvp(sys.argv[3], sys.argv[3:])"
        )
        read_end, write_end = to_browser_read, from_browser_write
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-c", trampoline, str(read_end), str(write_end), *command],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(read_end, write_end),
                start_new_session=True,
            )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self.session = ""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.send("Page.enable")
        self.viewport(WIDTH, HEIGHT)

    def viewport(self, width: int, height: int) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise ScreenshotError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _receive(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise ScreenshotError("Chromium closed the DevTools pipe (see its log)")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise ScreenshotError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def wait_for(self, expression: str, what: str, timeout: float = 60) -> Any:
        """Poll a JavaScript expression until it is truthy."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.5)
        raise ScreenshotError(f"timed out after {timeout:.0f}s waiting for {what}")

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with suppress(ScreenshotError, OSError):
            self.send("Browser.close")
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            stop(self.process)
        for fd in (self._read, self._write):
            with suppress(OSError):
                os.close(fd)


# --- the pictures -----------------------------------------------------------------------

DEMO_ASSETS = ("orders", "events", "customers", "customers_history", "products")
PLOTTED_ASSET = "orders"
# The metadata plots are in alphabetical order; the picture starts at this one's row
# (files_removed, lag_seconds, then rows_deleted/rows_extracted, rows_inserted/...).
FIRST_PLOT = "lag_seconds"

CLICK_BUTTON = """(label => {
  const button = [...document.querySelectorAll('button')].find(b => b.innerText.trim() === label);
  if (button) button.click();
  return !!button;
})"""

PLOT_TITLES = """[...document.querySelectorAll('canvas')].map(canvas => {
  let cell = canvas;
  for (let i = 0; i < 4 && cell.parentElement; i++) cell = cell.parentElement;
  return cell.innerText.split('\\n')[0];
})"""

SCROLL_TO_PLOT = """(title => {
  const canvas = [...document.querySelectorAll('canvas')].find(canvas => {
    let cell = canvas;
    for (let i = 0; i < 4 && cell.parentElement; i++) cell = cell.parentElement;
    return cell.innerText.split('\\n')[0] === title;
  });
  if (!canvas) return false;
  let cell = canvas;
  for (let i = 0; i < 4 && cell.parentElement; i++) cell = cell.parentElement;
  cell.scrollIntoView({block: 'start'});
  return true;
})"""


def settle(seconds: float = 2.0) -> None:
    """Let animations (the graph's centring, the charts' drawing) finish."""
    time.sleep(seconds)


def dismiss_popups(browser: Browser) -> None:
    """The "Join the Dagster community" dialog (the server was told it was seen; this is a
    fallback should it still show)."""
    browser.evaluate(f"{CLICK_BUTTON}('Skip')")


def take_pictures(browser: Browser, url: str, out: Path) -> list[Path]:
    graph, plot = out / "asset-graph.png", out / "asset-plot.png"

    # (a) The global asset lineage: the demo's five tables, each with its latest
    # materialization and checks. A taller window so that all five fit unzoomed.
    browser.viewport(WIDTH, 1250)
    browser.open(f"{url}/asset-groups")
    browser.wait_for(
        "(() => { const text = document.body ? document.body.innerText : '';"
        f" return {json.dumps(DEMO_ASSETS)}.every(name => text.includes(name))"
        " && text.split('Asset checks').length - 1 >= "
        f"{len(DEMO_ASSETS)} && text.split('Latest event').length - 1 >= {len(DEMO_ASSETS)}"
        " && !text.includes('Loading'); })()",
        "the asset graph with every demo asset's node",
    )
    settle()
    dismiss_popups(browser)
    settle(0.5)
    browser.screenshot(graph)
    say(f"  wrote {graph}")

    # (b) One asset's numeric metadata, plotted over its materializations: the Overview
    # tab's Metadata section, switched from Table to Plots and from Partitions to Events.
    browser.viewport(WIDTH, HEIGHT)
    browser.open(f"{url}/assets/{PLOTTED_ASSET}?view=overview")
    browser.wait_for(f"{CLICK_BUTTON}('Plots')", "the asset page's Plots toggle")
    browser.wait_for(f"{CLICK_BUTTON}('Events')", "the plots' Events toggle")
    titles = browser.wait_for(
        f"(titles => titles.includes({FIRST_PLOT!r}) && titles.includes('rows_inserted')"
        f" && titles)({PLOT_TITLES})",
        f"the plots of {PLOTTED_ASSET}'s metadata",
    )
    settle()
    dismiss_popups(browser)
    if not browser.evaluate(f"{SCROLL_TO_PLOT}({FIRST_PLOT!r})"):
        raise ScreenshotError(f"no plot of {FIRST_PLOT} (plots: {titles})")
    settle(1)
    browser.screenshot(plot)
    say(f"  wrote {plot} (plots: {', '.join(titles)})")
    return [graph, plot]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="demo rounds (default 2)")
    parser.add_argument(
        "--out", type=Path, default=PROJECT / "docs" / "images", help="default docs/images"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    try:
        chromium = find_chromium()
    except ScreenshotError as error:
        say(f"error: {error}")
        return 2

    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="incremental-assets-screenshots-"))
    env = {
        **os.environ,
        "DAGSTER_HOME": str(root),
        "INCREMENTAL_ASSETS_TABLES": str(root / "tables.yaml"),
    }
    try:
        say(f"Running the demo ({args.rounds} rounds) in {root} ...")
        run_demo(root, args.rounds, env, root / "demo.log")
        say(f"  done in {time.monotonic() - started:.0f}s; starting dagster dev ...")
        with dagster_dev(root, env, root / "dagster-dev.log") as url:
            say(f"  {url} answers; taking screenshots with {chromium} ...")
            browser = Browser(chromium, root / "chromium-profile", root / "chromium.log")
            try:
                take_pictures(browser, url, args.out)
            finally:
                browser.close()
    except ScreenshotError as error:
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
