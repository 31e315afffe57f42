"""A session on a Spark Connect server (``spark.remote: sc://host:port`` in the tables
file, or ``INCREMENTAL_ASSETS_SPARK_REMOTE``) instead of a JVM in this process.

The client has no JVM: Delta Lake's jars, the object-store connectors, their credentials
and the master are the server's business (``./dev spark-server`` starts one with the
project's). Only runtime SQL settings are set on the session, and the ones the engine
needs are set and read back (engine/spark_session.py ``ensure_required_conf``).

A server that cannot be reached, or that goes away during a run, is one error naming the
setting (:class:`~incremental_assets.engine.errors.SparkRemoteError`). The client's retries
are bounded, so a run fails within seconds instead of Connect's default ten minutes; the
run's Delta commit is atomic on the server, so nothing of it is half-committed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import secrets
import socket
import threading
import uuid
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from incremental_assets.engine.errors import SparkRemoteError
from incremental_assets.engine.spark import session_slots

REMOTE_ENV = "INCREMENTAL_ASSETS_SPARK_REMOTE"
REMOTE_KEY = "spark.remote"
SETTING = f"{REMOTE_KEY} (tables file) / {REMOTE_ENV}"
DEFAULT_PORT = 15002  # Spark Connect's own default
SESSION_ID = "session_id"  # the URL's parameter naming a session
# Plan ids of a process whose session another process may use: from a random point in
# [2**61, 2**62), far apart (a process makes some thousands), within the message's int64.
_PLAN_IDS = 2**61
# A setting every session has, read to tell whether the server still knows a kept session.
REQUIRED_PROBE = "spark.sql.session.timeZone"

# Connect's default policy retries an unreachable server for ten minutes: here a few
# seconds (about 8), enough for a short network blip, not for a server that is gone.
_RETRIES = {"max_retries": 5, "max_backoff": 4000}

# The server of each session this module made (a session does not say it publicly). The
# sessions are held here for the life of the process, never left to the garbage
# collector: PySpark 4.1's Connect session closes its client in ``__del__``, which shuts a
# thread pool shared by every session, and a collection that fires while that pool takes
# a task (a query's result being released) waits on the pool's own lock forever (seen:
# a test process hung after a command-line call's session was dropped; SPARK-55406).
_URLS: dict[SparkSession, str] = {}

# The session last made on each server, for each thread of the process and each set of
# settings: the next run of the same process, thread and settings takes it again while its
# server still knows it. The server keeps the classes it generates for a query per session
# (its code cache is keyed by the session's class loader, SPARK-44795): a small run in a
# new session compiled some 115 classes again and took 2.2 s longer (7.7 s against 5.4 s
# a step). A thread has sessions of its own: the engine's commits set session settings
# (Delta's idempotent-write pair) that two runs at once must not share. (A run's own
# helper thread, which sets nothing and ends before its commit, uses the run's session:
# engine/delta_lake/preload.py.) Other settings (another project's, the tests' own
# session) get a session of their own, so neither changes the other's.
_KEPT: dict[tuple[str, int, frozenset[tuple[str, str]]], SparkSession] = {}
# The slot (a session id an earlier process may have used) each kept session was made in.
_SLOTS: dict[tuple[str, int, frozenset[tuple[str, str]]], session_slots.Slot] = {}
# Set when this process's servers are stopped before it exits (``give_up_on_servers``).
_GAVE_UP = False

# gRPC codes (by name) and texts that mean the server is not there (any more), or is
# another server than the one the session was made on (a restarted one).
_GONE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
_GONE_TEXT = (
    "failed to connect",
    "connection refused",
    "socket closed",
    "connection reset",
    "session_changed",
    "retries_exceeded",
    "ipv4:",  # gRPC's "failed to connect to all addresses; last error: ... ipv4:..."
)


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (Databricks Connect's too)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def shown(url: str) -> str:
    """``sc://host:port`` of a remote URL, without its parameters (a token may be one)."""
    parsed = urlparse(url)
    return f"{parsed.scheme}://{parsed.netloc}"


def address(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    if parsed.scheme != "sc" or not parsed.hostname:
        raise SparkRemoteError(
            shown(url), SETTING, "is not a Spark Connect URL", "write it as sc://HOST:PORT"
        )
    return parsed.hostname, parsed.port or DEFAULT_PORT


def connect_session(
    url: str, conf: Mapping[str, str], across_processes: bool = False
) -> SparkSession:
    """A Connect session on the server at ``url`` with ``conf``'s runtime settings (static
    ones, such as jars and the master, are the server's and are left out): the one this
    thread last made there with the same settings while the server still knows it, else
    (``across_processes``: a Dagster run's) the one an earlier process on this host left
    (engine/spark/session_slots.py), else a new one.

    Raises:
        SparkRemoteError: the server cannot be reached; nothing was run.
    """
    from pyspark.sql.connect.client.retries import DefaultPolicy

    try:
        _probe(url, timeout=5)
    except OSError as exc:
        raise unreachable(url, exc) from None
    key = (url, threading.get_ident(), frozenset(conf.items()))
    session = _KEPT.pop(key, None)
    if session is not None and _known(session):
        # Kept with these settings applied (``key``): each would be a round trip again.
        _KEPT[key] = session
        return session
    slot = _SLOTS.get(key) or (_slot(url, conf) if across_processes else None)
    for attempt in range(2):
        # Not a cached one of PySpark's: a server restarted since would not know it. As
        # PySpark does, this marks the process as a Connect client (its functions build
        # Connect columns from then on): a process holds Connect sessions or a local one.
        named = _naming(url, slot.session_id) if slot is not None else url
        session = SparkSession.builder.remote(named).create()
        session.client.set_retry_policies([DefaultPolicy(**_RETRIES)])
        _URLS[session] = url
        try:
            if slot is not None and slot.reused:
                # What the last process left in the session: its runtime settings (a
                # commit's transaction pair, a user's own) back to the server's.
                session.sql("RESET")
            _configure(session, conf)
            break
        except Exception as exc:
            if server_gone(exc):
                raise unreachable(url, exc) from None
            if slot is None or attempt or not _closed(exc):
                raise
            slot.renew()  # the server closed that session: a new one, under a new id
    if slot is not None and key not in _SLOTS:
        _SLOTS[key] = slot
        session_slots.hold(slot, lambda: _idle(_KEPT.get(key)))
    _KEPT[key] = session
    return session


def _probe(url: str, timeout: float) -> None:
    """Open and close a connection to the server at ``url`` (OSError: none answers)."""
    socket.create_connection(address(url), timeout=timeout).close()


def _slot(url: str, conf: Mapping[str, str]) -> session_slots.Slot | None:
    """A slot for a session kept across processes (engine/spark/session_slots.py); None
    when the URL names a session of its own or none is free."""
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.plan import LogicalPlan

    trial = str(uuid.uuid4())
    try:
        if DefaultChannelBuilder(url).session_id is not None:
            return None  # the URL names a session of its own
        if DefaultChannelBuilder(_naming(url, trial)).session_id != trial:
            return None  # a form of URL not foreseen
    except Exception:
        return None
    slot = session_slots.take(url, conf)
    if slot is not None:
        # The server caches a session's resolved plans by their messages, which hold
        # PySpark's plan ids, counted from 0 in each process: another process's same
        # query would find this one's plan (its columns as they were then). Each
        # process's ids start at a random point of their own.
        with LogicalPlan._lock:
            if LogicalPlan._nextPlanId < _PLAN_IDS:
                LogicalPlan._nextPlanId += _PLAN_IDS + secrets.randbelow(_PLAN_IDS)
    return slot


def _naming(url: str, session_id: str) -> str:
    """``url`` with Connect's ``session_id`` parameter (``sc://host:port/;name=value;...``)."""
    if "/;" in url:
        return f"{url.rstrip(';')};{SESSION_ID}={session_id}"
    return f"{url.rstrip('/')}/;{SESSION_ID}={session_id}"


def _configure(session: SparkSession, conf: Mapping[str, str]) -> None:
    """Set ``conf``'s runtime settings on a new ``session`` (which of them may be set asked
    in one round trip, then set in one: two where one a setting took two); with none, one
    round trip all the same, so a session id the server refuses is known here."""
    from incremental_assets.engine.spark import runtime_conf  # it imports this module

    names = runtime_conf.modifiable(session, [n for n in conf if n != REMOTE_KEY])
    runtime_conf.set_many(session, {name: conf[name] for name in names})
    if not names:
        session.conf.get(REQUIRED_PROBE)


def _closed(exc: BaseException) -> bool:
    """``exc`` says the server closed the session it names (idle past its timeout, or
    released): its id cannot be used again."""
    condition = getattr(exc, "getCondition", lambda: None)() or ""
    return condition.startswith("INVALID_HANDLE.SESSION_CLOSED") or ("SESSION_CLOSED" in str(exc))


def _idle(session: SparkSession | None) -> bool:
    """At exit: whether ``session`` has no operation running on its server (any found is
    interrupted), asked once, without retries."""
    if session is None or session.is_stopped or _GAVE_UP:
        return False
    try:
        _probe(_URLS[session], timeout=1)
    except OSError:
        return False
    # Asked once (session_slots waits a few seconds at most for the answer).
    session.client.set_retry_policies([])
    # A failure is logged by PySpark, at exit perhaps to an output already closed.
    quiet = logging.getLogger("pyspark.sql.connect.logging")
    was, quiet.disabled = quiet.disabled, True
    try:
        return not session.interruptAll()
    finally:
        quiet.disabled = was


def give_up_on_servers() -> None:
    """Make every session this module made fail at once, without retries, from now on: for
    a process whose servers are stopped before it exits (a test session). PySpark clears
    each client's ML cache on the server at the process's exit (an ``atexit`` hook per
    client); against a server that is gone, each client would first wait out its retries
    (about 8 s a session), then log the failure to whatever stderr was when PySpark was
    imported (under pytest, a capture already closed: a "Logging error" traceback). The
    hooks are dropped: a stopped server holds no cache."""
    global _GAVE_UP
    _GAVE_UP = True  # nor is anything asked of them at exit (``_idle``)
    for session in list(_URLS):
        with contextlib.suppress(Exception):
            session.client.set_retry_policies([])
        cleanup = getattr(session.client, "_cleanup_ml_cache", None)
        if cleanup is not None:
            atexit.unregister(cleanup)


def _known(session: SparkSession) -> bool:
    """``session`` is open and its server still knows it (one round trip, no retries)."""
    if session.is_stopped:
        return False
    policies = session.client.get_retry_policies()
    session.client.set_retry_policies([])
    try:
        with warnings.catch_warnings():  # Connect warns that its (zero) retries ran out
            warnings.simplefilter("ignore")
            session.conf.get(REQUIRED_PROBE)
    except Exception:
        # Left open and held in _URLS, as every session is (see there), not stopped:
        # closing a client shuts the thread pool the process's sessions share.
        return False
    finally:
        session.client.set_retry_policies(policies)
    return True


def unreachable(url: str, exc: BaseException) -> SparkRemoteError:
    return SparkRemoteError(
        shown(url),
        SETTING,
        f"cannot be reached ({_first_line(exc)}); nothing was run",
        f"start the server (./dev spark-server prints its URL) or correct {SETTING}",
    )


def server_gone(exc: BaseException) -> bool:
    """``exc`` (or one of its causes) says the Connect server is not there any more."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "getGrpcStatusCode", None)
        if code is not None and getattr(code(), "name", "") in _GONE_CODES:
            return True
        condition = getattr(current, "getCondition", lambda: None)() or ""
        if condition.startswith(("RETRIES_EXCEEDED", "INVALID_HANDLE.SESSION_CHANGED")):
            return True
        text = str(current).lower()
        if type(current).__module__.startswith(("grpc", "pyspark.errors")) and any(
            t in text for t in _GONE_TEXT
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


def lost(url: str | None, exc: BaseException) -> SparkRemoteError | None:
    """The error to raise for ``exc`` when it says the Connect server at ``url`` went away
    during a run (None otherwise, and for a local session: ``url`` None)."""
    if not url or not server_gone(exc):
        return None
    return SparkRemoteError(
        shown(url),
        SETTING,
        "went away during the run; nothing of the run was committed (a Delta commit is "
        "all or nothing)",
        "restart the server and run again: the next run loads exactly what this one did not",
    )


@contextmanager
def naming_lost_server(spark: SparkSession) -> Iterator[None]:
    """Around a run on ``spark``: its Connect server going away becomes one
    :class:`SparkRemoteError` naming the setting; other failures pass unchanged."""
    try:
        yield
    except SparkRemoteError:
        raise
    except Exception as exc:
        gone = lost(_URLS.get(spark), exc)
        if gone is None:
            raise
        raise gone from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
