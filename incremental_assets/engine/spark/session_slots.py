"""Spark Connect sessions that outlive their process: the next process on this host takes
the session of the last one again, as a process takes its own (engine/spark/remote.py).

A Connect server compiles a query's classes once per session (its code cache is keyed by
the session's class loader, SPARK-44795), so every process that opens a session of its own
compiles them all again: a launched Dagster run (``./dev dg launch``, Dagster's default run
launcher) is a new process each time. Measured with a small MERGE and an aggregate in a
fresh process each: 4.2-4.5 s in a new session, 2.6-2.9 s in the session an earlier process
left.

A slot is a file beside the jar cache (``connect-sessions/<server and settings>-<n>``)
holding a session id. A process takes the first slot no other process holds (an exclusive
``flock``, kept until it exits, so two processes never share a session) and makes its
session with that id (``session_id`` in the ``sc://`` URL). The session is taken again
only after a clean end: a slot is marked in use while held, and marked free at exit only
when the session has no operation still running on the server (``interruptAll`` found
none). A process killed, or interrupted during a query, leaves it marked in use, and the
next process starts a new session (a new id) rather than share one with a command that may
still be running. A server that closed the session (idle past its timeout, or released)
refuses its id; the slot then takes a new one (``renew``). With every slot held, a process
makes a session of its own, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from incremental_assets.engine import jars

SLOTS = 8
SESSION_PARAM = "session_id"


def folder() -> Path:
    return jars.cache_dir().parent / "connect-sessions"


@dataclass
class Slot:
    """A slot this process holds (its file open and locked) and the session id it gives."""

    handle: IO[str]
    session_id: str

    def url(self, url: str) -> str:
        """``url`` naming this slot's session (Connect's ``session_id`` parameter)."""
        joined = ";" if "/;" in url else ("/;" if not url.endswith("/") else ";")
        return f"{url}{joined}{SESSION_PARAM}={self.session_id}"

    def renew(self) -> None:
        """A new session id (the server closed the last one)."""
        self.session_id = str(uuid.uuid4())
        _write(self.handle, self.session_id, in_use=True)


# Held for the life of the process: closing a file releases its lock.
_HELD: list[tuple[Slot, Callable[[], bool]]] = []


def take(url: str, conf: Mapping[str, str]) -> Slot | None:
    """A free slot for a session on ``url`` with ``conf``'s settings, taken for the rest of
    this process; None when the URL names its own session or every slot is held."""
    if f"{SESSION_PARAM}=" in url:
        return None
    settings = "\n".join(f"{k}={v}" for k, v in sorted(conf.items()))
    key = hashlib.sha256(f"{socket.gethostname()}\n{url}\n{settings}".encode()).hexdigest()
    try:
        folder().mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    for n in range(SLOTS):
        try:
            handle = (folder() / f"{key[:20]}-{n}").open("a+")
        except OSError:
            return None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        handle.seek(0)
        found = _read(handle.read())
        session_id = found if found is not None else str(uuid.uuid4())
        _write(handle, session_id, in_use=True)
        return Slot(handle, session_id)
    return None


def hold(slot: Slot, idle: Callable[[], bool]) -> None:
    """Keep ``slot`` until this process exits; then mark it free if ``idle()`` says its
    session has nothing running (it may also fail: the slot then stays in use)."""
    _HELD.append((slot, idle))


def _read(text: str) -> str | None:
    """The session id of a slot left free; None for a slot new, unreadable or left in use."""
    try:
        found = json.loads(text)
        if not found["in_use"] and isinstance(found["session_id"], str):
            return str(uuid.UUID(found["session_id"], version=4))
    except (ValueError, KeyError, TypeError):
        pass
    return None


def _write(handle: IO[str], session_id: str, in_use: bool) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"session_id": session_id, "in_use": in_use}))
    handle.flush()


@atexit.register
def _release() -> None:
    for slot, idle in _HELD:
        with contextlib.suppress(Exception):
            if idle():
                _write(slot.handle, slot.session_id, in_use=False)
        with contextlib.suppress(OSError):
            slot.handle.close()
    _HELD.clear()
