"""Aggregates over a whole DataFrame (no grouping) in one Spark job.

``rows.agg(...).collect()`` plans a partial aggregation, an exchange to one partition
and the final aggregation: under adaptive execution the stage before the exchange runs
as a Spark job of its own, then the result stage as another. Observed as the rows are
written to nowhere (Spark's ``noop`` format), the same aggregates are merged on the
driver from each task's partial results, in the one job that scans the rows; only the
columns they read are scanned. Works the same through Spark Connect.
"""

from __future__ import annotations

import uuid
from typing import Any

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F


def aggregated(rows: DataFrame, *aggregates: Column, one_job: bool = True) -> dict[str, Any]:
    """The values of ``aggregates`` (each named with ``alias``) over ``rows``, by name; a
    count of no rows is 0 and a minimum or maximum of none is None, as ``agg`` gives.

    ``one_job=False``: by ``agg`` (two jobs), for rows read from a Delta table with
    deletion vectors: Spark's Delta applies them to a scan only once it has pinned the
    scan's snapshot, which a query under a write command is not given (the noop write
    fails "Cannot work with a non-pinned table snapshot")."""
    if not one_job:
        return rows.agg(*aggregates).collect()[0].asDict()
    observation = Observation(f"aggregated_{uuid.uuid4().hex}")
    (
        rows.observe(observation, *aggregates)
        .select(F.lit(1).alias("_"))
        .write.format("noop")
        .mode("overwrite")
        .save()
    )
    return dict(observation.get)
