"""Aggregates over a whole DataFrame (no grouping) in one Spark job.

``rows.agg(...).collect()`` plans a partial aggregation, an exchange to one partition
and the final aggregation: under adaptive execution the stage before the exchange runs
as a Spark job of its own, then the result stage as another. Observed as the rows are
written to nowhere (Spark's ``noop`` format), the same aggregates are merged on the
driver from each task's partial results, in the one job that scans the rows; only the
columns they read are scanned.

Only in a classic (local JVM) session. Through Spark Connect the server hands a command
its observed metrics only if its listener delivered them within 100 ms (Spark 4.1), and
the client then finds none: there ``agg`` is used, as it is wherever the observation
comes back without its values (Spark drops the metrics of a plan it optimized away).
"""

from __future__ import annotations

import uuid
from typing import Any

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame


def aggregated(rows: DataFrame, *aggregates: Column, one_job: bool = True) -> dict[str, Any]:
    """The values of ``aggregates`` (each named with ``alias``) over ``rows``, by name; a
    count of no rows is 0 and a minimum or maximum of none is None, as ``agg`` gives.

    ``one_job=False``: by ``agg`` (two jobs), for rows read from a Delta table with
    deletion vectors: Spark's Delta applies them to a scan only once it has pinned the
    scan's snapshot, which a query under a write command is not given (the noop write
    fails "Cannot work with a non-pinned table snapshot")."""
    if one_job and isinstance(rows, ClassicDataFrame):
        observation = Observation(f"aggregated_{uuid.uuid4().hex}")
        (
            rows.observe(observation, *aggregates)
            .select(F.lit(1).alias("_"))
            .write.format("noop")
            .mode("overwrite")
            .save()
        )
        found = dict(observation.get)
        if len(found) == len(aggregates):
            return found
    return rows.agg(*aggregates).collect()[0].asDict()
