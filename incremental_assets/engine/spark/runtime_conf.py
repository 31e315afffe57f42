"""A session's runtime settings, read and written several at a time.

Through Spark Connect (and Databricks Connect) each of PySpark's own calls
(``spark.conf.get``, ``set``, ``unset``) is a round trip to the server, while the
protocol's config request takes many keys at once. A commit's settings (its record, its
idempotent-write transaction, the merge's own), read, set and restored one by one, cost
12 round trips a commit; in batches 3 or 4: on a workspace 30 ms away, a third of a second
a run. A local (classic) session's calls stay in the process: there they are made one by
one, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pyspark.sql import SparkSession

from incremental_assets.engine.spark.remote import is_connect


def get_many(spark: SparkSession, keys: Iterable[str]) -> dict[str, str | None]:
    """Each of ``keys``'s value in ``spark``, None where it is not set (as
    ``spark.conf.get(key, None)``): one round trip through Spark Connect."""
    keys = list(keys)
    if not keys:
        return {}
    if not is_connect(spark):
        return {key: spark.conf.get(key, None) for key in keys}
    from pyspark.sql.connect.proto import ConfigRequest, KeyValue

    # A pair without a value asks for the key's value or None, as a default of None does.
    request = ConfigRequest.GetWithDefault(pairs=[KeyValue(key=key) for key in keys])
    result = spark.client.config(ConfigRequest.Operation(get_with_default=request))
    found = dict(result.pairs)
    return {key: found.get(key) for key in keys}


def set_many(spark: SparkSession, settings: Mapping[str, str]) -> None:
    """Set every one of ``settings`` in ``spark``: one round trip through Spark Connect."""
    if not settings:
        return
    if not is_connect(spark):
        for key, value in settings.items():
            spark.conf.set(key, value)
        return
    from pyspark.sql.connect.proto import ConfigRequest, KeyValue

    pairs = [KeyValue(key=key, value=str(value)) for key, value in settings.items()]
    spark.client.config(ConfigRequest.Operation(set=ConfigRequest.Set(pairs=pairs)))


def unset_many(spark: SparkSession, keys: Iterable[str]) -> None:
    """Unset every one of ``keys`` in ``spark``: one round trip through Spark Connect."""
    keys = list(keys)
    if not keys:
        return
    if not is_connect(spark):
        for key in keys:
            spark.conf.unset(key)
        return
    from pyspark.sql.connect.proto import ConfigRequest

    spark.client.config(ConfigRequest.Operation(unset=ConfigRequest.Unset(keys=keys)))


def modifiable(spark: SparkSession, keys: Iterable[str]) -> list[str]:
    """Those of ``keys`` a running session may change (not static settings): one round
    trip through Spark Connect."""
    keys = list(keys)
    if not keys:
        return []
    if not is_connect(spark):
        return [key for key in keys if spark.conf.isModifiable(key)]
    from pyspark.sql.connect.proto import ConfigRequest

    request = ConfigRequest.IsModifiable(keys=keys)
    found = dict(spark.client.config(ConfigRequest.Operation(is_modifiable=request)).pairs)
    return [key for key in keys if found.get(key) == "true"]


def restore(spark: SparkSession, before: Mapping[str, str | None]) -> None:
    """Put each key of ``before`` back as it was: unset where it was None, else set."""
    unset_many(spark, [key for key, value in before.items() if value is None])
    set_many(spark, {key: value for key, value in before.items() if value is not None})
