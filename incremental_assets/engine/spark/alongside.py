"""Two pieces of one run's work at once, where neither needs the other's result.

A run's small Spark jobs spend most of their time on the driver (planning, scheduling,
reading a log) rather than on the cores, so two of them started together take little
longer than the longer one. The second runs in a thread of its own that keeps the calling
thread's Spark properties and tags (pyspark's ``InheritableThread``, classic or Spark
Connect), and is always joined before the caller's block ends: nothing of it outlives the
run, and its error is raised in the caller.

Example:
    >>> with alongside(spark, lambda: plan_late_files()) as late:  # doctest: +SKIP
    ...     window = plan_window()
    ...     ledger = late()
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from pyspark.sql import SparkSession
from pyspark.util import InheritableThread

T = TypeVar("T")


@contextmanager
def alongside(spark: SparkSession, work: Callable[[], T]) -> Iterator[Callable[[], T]]:
    """Start ``work`` while the block runs; the block calls what it is given for
    ``work``'s result (waiting for it), which raises ``work``'s error if it failed. When
    the block itself fails, ``work`` is still waited for, and the block's error is the
    one raised."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = InheritableThread(run, session=spark, name="incremental-assets-alongside")
    thread.start()

    def result() -> T:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome["value"]  # type: ignore[return-value]

    try:
        yield result
    finally:
        thread.join()
