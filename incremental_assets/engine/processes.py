"""Which process does a piece of work, as ``host:pid``, and whether it is still running.

Used where a run leaves a mark for the runs after it (a Dagster run's worker tag, a run's
claim to create its table): a later run tells a dead run's mark from a live one's by it.
A process on another host cannot be checked from here (``None``); a pid the system gave
to a new process since reads as running, which errs on the side of leaving things be.
"""

from __future__ import annotations

import os
import socket


def this_process() -> str:
    """This process: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def process_alive(process: str | None) -> bool | None:
    """Whether the process ``host:pid`` runs: None when it cannot be told from here (none
    given, or on another host)."""
    if not process or ":" not in process:
        return None
    host, _, pid = process.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
