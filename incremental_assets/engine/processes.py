"""Which process does a piece of work, and whether it is still running.

Used where a run leaves a mark for the runs after it (a Dagster run's worker tag, a run's
claim to create its table): a later run tells a dead run's mark from a live one's by it.

A process is named ``host:pid``. Where Linux's ``/proc`` is there, a claim adds what makes
that name unique on the host (``Identity``): the boot, the pid namespace (a container's
processes share the host's name but not its process ids) and the process's start time (a
pid is given again to a new process after a while). A process that cannot be checked from
here (another host, another boot or pid namespace) is ``None``: never taken for gone.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path


def this_process() -> str:
    """This process: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Identity:
    """A process as ``host:pid`` (``process``) with what tells it apart on its host: the
    boot (``boot``), the pid namespace (``pid_space``) and its start time in clock ticks
    since boot (``started``); each '' or 0 where ``/proc`` does not tell."""

    process: str
    boot: str = ""
    pid_space: str = ""
    started: int = 0


def this_identity() -> Identity:
    """This process's ``Identity``."""
    return Identity(this_process(), _boot(), _pid_space(), _started(os.getpid()) or 0)


def process_alive(process: str | None) -> bool | None:
    """Whether the process ``host:pid`` runs: None when it cannot be told from here (none
    given, or on another host). A zombie (killed, not yet reaped) is gone."""
    pid = _local_pid(process)
    if pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return _state(pid) != "Z"


def identity_alive(identity: Identity) -> bool | None:
    """Whether the process ``identity`` names runs: None when it cannot be told from here
    (another host, boot or pid namespace); a pid now held by a process started at another
    time is gone."""
    if _local_pid(identity.process) is None:
        return None
    if (identity.boot or _boot()) != _boot() or (identity.pid_space or _pid_space()) != (
        _pid_space()
    ):
        return None
    alive = process_alive(identity.process)
    if alive and identity.started:
        started = _started(int(identity.process.rpartition(":")[2]))
        return started is None or started == identity.started
    return alive


def _local_pid(process: str | None) -> int | None:
    """The pid of ``host:pid`` when the host is this one."""
    if not process or ":" not in process:
        return None
    host, _, pid = process.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return int(pid)


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _boot() -> str:
    return _read("/proc/sys/kernel/random/boot_id")


def _pid_space() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _stat(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` from its state on (the name before it may hold spaces)."""
    text = _read(f"/proc/{pid}/stat")
    return text.rpartition(")")[2].split() if text else []


def _state(pid: int) -> str:
    fields = _stat(pid)
    return fields[0] if fields else ""


def _started(pid: int) -> int | None:
    """Clock ticks after boot at which ``pid`` started (``/proc/<pid>/stat`` field 22)."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None
