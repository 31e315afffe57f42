"""Crash points for exactly-once tests: a real process kill at a named step of a load.

Set ``INCREMENTAL_ASSETS_CRASH_AT`` to a point name (``after_extract``; ``before_commit``,
after the side tables (tombstones, change log) are written; ``after_commit``;
``creating_write_failed``, after a write creating the table failed and before the run
removes the files it wrote: what a kill during that write leaves) and the process kills
itself with SIGKILL there: no ``finally`` block, no clean-up, as with an out-of-memory kill
or a lost machine. ``<point>:interrupt`` sends it SIGINT instead: Python raises
``KeyboardInterrupt`` there, as on Ctrl-C (Dagster's terminate raises its own interrupt, also
not an ``Exception``). Unset (always, outside tests), this is a dictionary look-up.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "INCREMENTAL_ASSETS_CRASH_AT"
POINTS = ("after_extract", "before_commit", "after_commit", "creating_write_failed")


def crash_point(name: str) -> None:
    assert name in POINTS, name
    asked = os.environ.get(CRASH_ENV)
    if asked == name:
        os.kill(os.getpid(), signal.SIGKILL)
    elif asked == f"{name}:interrupt":
        os.kill(os.getpid(), signal.SIGINT)
