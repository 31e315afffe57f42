"""The target's Delta snapshot loaded while a run extracts its increment.

A run's MERGE starts by loading the target's snapshot: listing and reading its log and
computing its state (Spark's "Compute snapshot for version" jobs), about 0.3-0.5 s of
mostly driver time on a local disk, more on an object store, where each log read is a
request. Nothing in it depends on the increment, so a run that will merge into an
existing table starts that load in a thread of its own as it begins to extract (a
``DESCRIBE DETAIL`` of the table, which computes the state), and the MERGE finds the
snapshot in Delta's cache of the table's log. If the table changed in between, the
MERGE reads the commits that were added, as it always does: the preload decides
nothing.

The thread is joined before the run commits, so none of its Spark work overlaps the
commit (whose session settings make the MERGE an idempotent write), and it ends with
the run whether the extract succeeds or fails (a failed or interrupted extract waits for
at most that one load). It shares the run's session (through Spark Connect too: it sets
nothing, so the per-thread sessions of engine/spark/remote.py are not needed). A quality
rule's time limit that finds the preload running interrupts it, and cancels the rule's
job a second later. A preload that fails is logged and otherwise ignored: the MERGE
loads the snapshot itself and reports what is wrong.

Example:
    >>> with snapshot_preloaded(spark, target.sql_table, state.exists):  # doctest: +SKIP
    ...     extracted = extract(...)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@contextmanager
def snapshot_preloaded(spark: SparkSession, table: str, exists: bool) -> Iterator[None]:
    """While the block runs, load the snapshot of the Delta table Spark SQL names
    ``table`` (``DeltaTarget.sql_table``) in a thread, joined as the block ends; nothing
    when the table does not exist yet (the run creates it)."""
    if not exists:
        yield
        return
    thread = threading.Thread(
        target=_load, args=(spark, table), name="ia-snapshot-preload", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _load(spark: SparkSession, table: str) -> None:
    try:
        spark.sql(f"DESCRIBE DETAIL {table}").collect()
    except Exception:  # the MERGE loads it again and reports what is wrong
        log.info("preloading the Delta snapshot of %s failed", table, exc_info=True)
