"""Which exceptions are Spark's failures, on a local session and over Spark Connect.

PySpark raises its own errors (``pyspark.errors``) for what Spark converts, on both kinds
of session. On a local (classic) session a JVM exception it does not convert (a JDBC
driver's, a Hadoop file system's) still arrives as py4j's error: it is told by its class
name here, so the engine imports nothing of py4j (which a Connect client lacks)."""

from __future__ import annotations

from pyspark.errors import PySparkException

_CLASSIC_WRAPPERS = frozenset({"Py4JJavaError", "Py4JError", "Py4JNetworkError"})


def is_spark_failure(exc: BaseException) -> bool:
    """``exc`` is a failure Spark reported (as opposed to a bug in the caller)."""
    if isinstance(exc, PySparkException):
        return True
    return any(cls.__name__ in _CLASSIC_WRAPPERS for cls in type(exc).__mro__)
