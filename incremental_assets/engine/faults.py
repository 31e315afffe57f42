"""Crash points for exactly-once tests: a real process kill at a named step of a load.

Set ``INCREMENTAL_ASSETS_CRASH_AT`` to a point name (``after_extract``; ``before_commit``,
after the side tables (tombstones, change log) are written; ``after_commit``;
``creating_write_failed``, after a write creating the table failed and before the run
removes the files it wrote: what a kill during that write leaves) and the process kills
itself with SIGKILL there: no ``finally`` block, no clean-up, as with an out-of-memory kill
or a lost machine. Unset (always, outside tests), this is a
dictionary look-up.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "INCREMENTAL_ASSETS_CRASH_AT"
POINTS = ("after_extract", "before_commit", "after_commit", "creating_write_failed")


def crash_point(name: str) -> None:
    assert name in POINTS, name
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
