"""The Dagster UI in a real browser: the demo's instance in a throwaway folder, ``dagster
dev`` on it, and headless Chromium driven over the DevTools protocol.

Shared by the browser test (``test_browser.py``) and ``scripts/screenshots.py`` (the
README's pictures). Chromium is driven over ``--remote-debugging-pipe``, so no Python
package beyond the project's is needed; any Chromium or Chrome binary will do (Debian:
``apt-get install chromium``; or set CHROMIUM to the binary).
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[2]
# What the demo's folder needs from the project: its tables, its instance, its workspace.
PROJECT_FILES = ("tables.yaml", "dagster.yaml", "workspace.yaml")
WIDTH, HEIGHT = 1600, 1000
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class UIError(RuntimeError):
    """The server or the browser did not do what was asked (the message says what, and
    which log to read)."""


# --- the demo's folder and the server --------------------------------------------------


def demo_folder(root: Path) -> dict[str, str]:
    """Copy the project's files into ``root``; the environment in which the demo and
    ``dagster dev`` use ``root`` as their instance and tables."""
    for name in PROJECT_FILES:
        shutil.copy(PROJECT / name, root / name)
    return {
        **os.environ,
        "DAGSTER_HOME": str(root),
        "INCREMENTAL_ASSETS_TABLES": str(root / "tables.yaml"),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def dagster_dev(root: Path, env: dict[str, str], log: Path) -> Iterator[str]:
    """``dagster dev`` (webserver and daemon) on the instance in ``root``; yields its URL
    once it answers, stops its whole process group afterwards, also on failure."""
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
        # this throwaway instance it was seen so it stays out of the way.
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
            raise UIError(f"dagster dev exited ({server.returncode}); log {log}")
        try:
            status = json.dumps(graphql(url, query))
            if "LOADED" in status and "LOADING" not in status:
                return
        except OSError:
            pass
        time.sleep(1)
    raise UIError(f"dagster dev did not answer at {url} within {timeout:.0f}s; log {log}")


def graphql(url: str, query: str, **variables: Any) -> dict[str, Any]:
    """The ``data`` of a GraphQL answer from the webserver."""
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query, "variables": variables}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.loads(response.read())
    if answer.get("errors"):
        raise UIError(f"GraphQL: {answer['errors']}")
    return answer["data"]


def stop(process: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM to the process group the process leads (dagster dev's webserver, daemon and
    code server; Chromium's helpers), SIGKILL to whatever is left after ``grace`` s."""
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


def find_chromium() -> str | None:
    """CHROMIUM, else the first Chromium or Chrome on PATH; None when there is none."""
    candidates = [os.environ["CHROMIUM"]] if os.environ.get("CHROMIUM") else []
    candidates += [path for name in BROWSERS if (path := shutil.which(name))]
    return next((c for c in candidates if Path(c).exists()), None)


NO_CHROMIUM = (
    "no Chromium found: install it (Debian/Ubuntu: `sudo apt-get install chromium`; "
    "macOS: install Google Chrome) or set CHROMIUM=/path/to/chrome"
)


class Browser:
    """Headless Chromium driven over ``--remote-debugging-pipe`` (JSON messages ended by
    NUL on file descriptors 3 and 4): only the few DevTools commands the pictures and the
    test need. Use it as a context manager, so Chromium is stopped also on failure."""

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
        try:
            target = self.send("Target.createTarget", url="about:blank")["targetId"]
            attached = self.send("Target.attachToTarget", targetId=target, flatten=True)
            self.session = attached["sessionId"]
            self.send("Page.enable")
            self.viewport(WIDTH, HEIGHT)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

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
                    raise UIError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _receive(self, timeout: float = 60) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if not select.select([self._read], [], [], timeout)[0]:
                raise UIError(f"Chromium did not answer within {timeout:.0f}s (see its log)")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise UIError("Chromium closed the DevTools pipe (see its log)")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise UIError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def wait_for(self, expression: str, what: str, timeout: float = 60) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.5)
        raise UIError(f"timed out after {timeout:.0f}s waiting for {what}")

    def type(self, text: str) -> None:
        """Type into the focused element, as a keyboard would."""
        self.send("Input.insertText", text=text)

    def press_enter(self) -> None:
        for kind in ("keyDown", "keyUp"):
            self.send(
                "Input.dispatchKeyEvent",
                type=kind,
                key="Enter",
                code="Enter",
                windowsVirtualKeyCode=13,
                **({"text": "\r"} if kind == "keyDown" else {}),
            )

    def click_button(self, label: str) -> bool:
        """Click the button whose text is ``label``; False when there is none."""
        return self.evaluate(f"{_CLICK_BUTTON}({json.dumps(label)})")

    def text(self) -> str:
        """What the page shows as text."""
        return self.evaluate("document.body ? document.body.innerText : ''")

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with suppress(UIError, OSError):
            self.send("Browser.close")
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            stop(self.process)
        for fd in (self._read, self._write):
            with suppress(OSError):
                os.close(fd)


# --- the pages ----------------------------------------------------------------------------

_CLICK_BUTTON = """(label => {
  const button = [...document.querySelectorAll('button')].find(b => b.innerText.trim() === label);
  if (button) button.click();
  return !!button;
})"""

# The asset graph's nodes (SVG foreignObjects): name -> what the node shows.
_GRAPH_NODES = """Object.fromEntries([...document.querySelectorAll('svg foreignObject')]
  .map(node => (node.firstElementChild ? node.firstElementChild.innerText : '').trim())
  .filter(text => text).map(text => [text.split('\\n')[0], text]))"""

# The metadata plots (canvases, each under a cell that starts with its title): title ->
# how many of its pixels are drawn.
_PLOTS = """(() => {
  const cell = canvas => {
    let cell = canvas;
    for (let i = 0; i < 4 && cell.parentElement; i++) cell = cell.parentElement;
    return cell;
  };
  return Object.fromEntries([...document.querySelectorAll('canvas')].map(canvas => {
    const pixels = canvas.width && canvas.height
      ? canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data : [];
    let drawn = 0;
    for (let i = 3; i < pixels.length; i += 4) drawn += pixels[i] > 0;
    return [cell(canvas).innerText.split('\\n')[0], drawn];
  }));
})()"""

_SCROLL_TO_PLOT = """(title => {
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


def dismiss_popups(browser: Browser) -> None:
    """The "Join the Dagster community" dialog (the server was told it was seen; this is a
    fallback should it still show)."""
    browser.click_button("Skip")


def asset_graph(browser: Browser, url: str, assets: list[str]) -> dict[str, str]:
    """Open the global asset lineage and wait until every one of ``assets`` has a node
    that shows its latest event and its checks; what each node shows, by name."""
    browser.open(f"{url}/asset-groups")
    wanted = json.dumps(sorted(assets))
    return browser.wait_for(
        f"(nodes => {wanted}.every(name => nodes[name] && nodes[name].includes('Latest event')"
        " && nodes[name].includes('Asset checks') && !nodes[name].includes('Loading'))"
        f" && nodes)({_GRAPH_NODES})",
        f"the asset graph with a node for each of {', '.join(sorted(assets))}",
    )


def metadata_plots(browser: Browser, url: str, asset: str, titles: list[str]) -> dict[str, int]:
    """Open an asset's Overview, switch its Metadata to Plots over Events, and wait until
    the plots named ``titles`` are drawn; every plot's drawn pixels, by title."""
    browser.open(f"{url}/assets/{asset}?view=overview")
    browser.wait_for(f"{_CLICK_BUTTON}('Plots')", f"{asset}'s Plots toggle")
    browser.wait_for(f"{_CLICK_BUTTON}('Events')", "the plots' Events toggle")
    wanted = json.dumps(titles)
    return browser.wait_for(
        f"(plots => {wanted}.every(title => plots[title] > 0) && plots)({_PLOTS})",
        f"{asset}'s plots of {', '.join(titles)}",
    )


def scroll_to_plot(browser: Browser, title: str) -> bool:
    return browser.evaluate(f"{_SCROLL_TO_PLOT}({json.dumps(title)})")
