"""Spark Connect sessions that outlive their process: the next Dagster run on this host
takes the session the last one left, as a process takes its own (engine/spark/remote.py).

A Connect server compiles a query's classes once per session (its code cache is keyed by
the session's class loader, SPARK-44795), so every process that opens a session of its own
compiles them all again: a launched Dagster run (``./dev dg launch``, Dagster's default run
launcher) is a new process each time. Measured with a small MERGE and an aggregate in a
fresh process each: 4.2-4.5 s in a new session, 2.6-2.9 s in the session an earlier process
left; launched runs of the demo's ``orders`` 9.2 s against 11.6 s (benchmarks/warm_runs.py).

A slot is a file beside the jar cache (``connect-sessions/<server and settings>-<n>``, only
its owner may read it) holding a session id. A process takes the first slot no process
holds (an exclusive ``flock``, kept until it exits; a slot this process holds is skipped
too, so two threads never share one) and makes its session with that id. What a session
may carry from the last process is undone when it is taken again (remote.py: its runtime
settings reset, plan ids of this process's own). The session is taken again only after a
clean end: a slot is marked in use while held, and marked free at exit only when nothing
went wrong in the process's commits (``taint``) and the session has no operation running on
the server. A process killed, interrupted during a query, or whose commit failed leaves it
marked in use, and the next process starts a new session rather than share one with a
command that may still be running. A server that closed the session (idle past its
timeout, or released) refuses its id; the slot then takes a new one (``renew``). With
every slot held, a process makes a session of its own, as before.

Slots are kept per server and set of settings, so a server on another port, or other
settings, makes new ones. A slot no process holds and none has written for a day
(``STALE_SECONDS``) names a session its server has closed long since (a server closes a
session idle for an hour by default): taking a slot removes such files first, so the
folder does not grow with every server a host has used.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from incremental_assets.engine import jars

SLOTS = 8
# At exit, how long to wait for the server to say whether a session has work running.
EXIT_WAIT_SECONDS = 3.0
# A slot no process holds and none has written for this long is removed.
STALE_SECONDS = 24 * 3600
_SLOT_NAME = re.compile(r"[0-9a-f]{20}-[0-9]+")


def folder() -> Path:
    return jars.cache_dir().parent / "connect-sessions"


@dataclass
class Slot:
    """A slot this process holds (its file open and locked), the session id it gives, and
    whether an earlier process used that session (``reused``: it may carry its state)."""

    handle: IO[str]
    path: Path
    session_id: str
    reused: bool

    def renew(self) -> None:
        """A new session id (the server closed the last one)."""
        self.session_id, self.reused = str(uuid.uuid4()), False
        _write(self.handle, self.session_id, in_use=True)


# Held for the life of the process: closing a file releases its lock.
_HELD: list[tuple[Slot, Callable[[], bool]]] = []
_LOCK = threading.Lock()
_TAINTED = threading.Event()


def take(url: str, conf: Mapping[str, str]) -> Slot | None:
    """A free slot for a session on ``url`` with ``conf``'s settings, taken for the rest of
    this process; None when every slot is held or the slots' folder cannot be used."""
    key = hashlib.sha256(
        json.dumps([socket.gethostname(), url, sorted(conf.items())]).encode()
    ).hexdigest()[:20]
    try:
        base = folder()
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
    except Exception:  # no home, a read-only disk: a session of its own, as before
        return None
    with _LOCK:
        held = {slot.path for slot, _ in _HELD}
        _sweep(base, held)
        for n in range(SLOTS):
            path = base / f"{key}-{n}"
            if path in held:
                continue
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError:
                return None
            handle = os.fdopen(fd, "r+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            found = _read(handle.read())
            session_id = found or str(uuid.uuid4())
            _write(handle, session_id, in_use=True)
            return Slot(handle, path, session_id, reused=found is not None)
    return None


def _sweep(base: Path, held: set[Path]) -> None:
    """Remove the slots in ``base`` that no process holds and none has written for
    ``STALE_SECONDS``. A slot is removed under its own lock, so never one a process holds;
    a process that opened it just before finds it gone at exit, and its session is simply
    not kept."""
    now = time.time()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        path = base / name
        if path in held or not _SLOT_NAME.fullmatch(name):
            continue
        try:
            if now - os.lstat(path).st_mtime < STALE_SECONDS:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Written since it was looked at (taken and left meanwhile): not stale.
            if now - os.fstat(fd).st_mtime >= STALE_SECONDS:
                os.unlink(path)
        except OSError:
            pass
        finally:
            os.close(fd)


def hold(slot: Slot, idle: Callable[[], bool]) -> None:
    """Keep ``slot`` until this process exits; then mark it free if nothing tainted the
    process and ``idle()`` says its session has nothing running."""
    with _LOCK:
        _HELD.append((slot, idle))


def taint() -> None:
    """Something went wrong with a session's work (a commit that failed, a query
    interrupted): no slot this process holds is marked free at exit, so no later process
    shares a session that may still be running it."""
    _TAINTED.set()


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


def _answered_idle(idle: Callable[[], bool]) -> bool:
    """``idle()``, or False when it fails or the server has not answered in time (a
    server that stalls must not hold up the process's exit)."""
    answer: list[bool] = []

    def ask() -> None:
        with contextlib.suppress(Exception):
            answer.append(idle())

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(EXIT_WAIT_SECONDS)
    return bool(answer) and answer[0]


@atexit.register
def _release() -> None:
    with _LOCK:
        for slot, idle in _HELD:
            with contextlib.suppress(Exception):
                if not _TAINTED.is_set() and _answered_idle(idle):
                    _write(slot.handle, slot.session_id, in_use=False)
            with contextlib.suppress(OSError):
                slot.handle.close()
        _HELD.clear()
