"""Spark work under a time limit: past it, the work's Spark jobs are cancelled and the
caller's error is raised instead of whatever the cancelled action raised.

The work runs in the calling thread with a session tag (``SparkSession.addTag``); a
watcher thread waits out the limit, then interrupts the tagged operations, again every
second until the work ends, so an action the work starts after the first interrupt is
stopped too. Spark Connect interrupts by tag from any thread. Classic Spark keeps a tag's
real name per thread, so the watcher's ``interruptTag`` finds nothing there; it then
interrupts the session's operations (``interruptAll``), and when those miss the job too
(a job may carry no session tag), every job of the Spark context (``cancelAllJobs``).
Both are the run's own: a process runs one load at a time.

A cancelled task whose thread is stuck inside one row (a regular expression that
backtracks without end) keeps its core until that row is done: Spark can stop a task only
between rows. The action fails at once all the same, so the run ends and frees what it
holds; the Spark process of a Dagster run ends with the run.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

from pyspark.sql import SparkSession

from incremental_assets.engine.spark import session_slots

# How often a watcher repeats its interrupt once the limit has passed.
_REPEAT_SECONDS = 1.0


@contextmanager
def time_limited(
    spark: SparkSession, limit: timedelta, expired: Callable[[], Exception]
) -> Iterator[None]:
    """Run the body's Spark work for at most ``limit``; past it, raise ``expired()``.

    A body that completes (its last action finished as the limit passed) is not failed.
    """
    tag = f"incremental-assets-limit-{uuid.uuid4().hex}"
    watch = _Watch(spark, tag, limit.total_seconds())
    spark.addTag(tag)
    watch.start()
    try:
        yield
    except Exception:
        if watch.stop():
            # One clear message: the cancelled action's own error is Spark's stack trace.
            raise expired() from None
        raise
    else:
        watch.stop()
    finally:
        spark.removeTag(tag)


class _Watch:
    """A thread that interrupts the tagged work once the limit has passed."""

    def __init__(self, spark: SparkSession, tag: str, seconds: float) -> None:
        self._spark, self._tag, self._seconds = spark, tag, seconds
        self._done = threading.Event()
        self._expired = threading.Event()
        # Held while interrupting: once stop() returns, no interrupt can land on work the
        # caller does after the limited body.
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"{tag}-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> bool:
        """End the watch; True when the limit had passed."""
        with self._lock:
            self._done.set()
        self._thread.join()
        return self._expired.is_set()

    def _run(self) -> None:
        if self._done.wait(self._seconds):
            return
        while True:
            with self._lock:
                if self._done.is_set():
                    return
                self._expired.set()
                # An interrupted command may go on a while on a Connect server: no later
                # process takes this session (engine/spark/session_slots.py).
                session_slots.taint()
                # A failed interrupt is tried again a second later.
                with contextlib.suppress(Exception):
                    _interrupt(self._spark, self._tag)
            if self._done.wait(_REPEAT_SECONDS):
                return


def _interrupt(spark: SparkSession, tag: str) -> None:
    """Interrupt the work tagged ``tag``: by its tag (Spark Connect), else the session's
    operations, else (classic Spark) every job of the Spark context."""
    if spark.interruptTag(tag) or spark.interruptAll():
        return
    # Classic Spark sometimes submits a job without the session's tags (seen: the rules'
    # Parquet write of a Delta read, whose job carried only its SQL execution's tag), and
    # interruptAll misses it. The context's jobs are the run's own (a process runs one load
    # at a time). Spark Connect has no context here; its operations carry their tags.
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect
        return
    context.cancelAllJobs()
