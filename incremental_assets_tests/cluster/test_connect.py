"""A Spark Connect server (the one ``./dev spark-server`` starts) serves Delta Lake's SQL
on S3 to a client without a JVM: MERGE INTO from a temporary view, DESCRIBE HISTORY, reads;
and Delta's transaction ids (``txnAppId`` / ``txnVersion`` session settings) make a MERGE
idempotent over Connect: a replayed version is skipped. This is the exactly-once mechanism
the engine relies on."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def remote(connect_server) -> Iterator:
    # This process also holds the tests' classic session, so the client is made with
    # Connect's own builder (SparkSession.builder.remote refuses a second kind of session).
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    session = RemoteSparkSession.builder.remote(connect_server.url).getOrCreate()
    yield session
    session.stop()


@pytest.fixture
def table(s3) -> str:
    bucket = f"connect-{uuid.uuid4().hex[:10]}"
    s3.create(bucket)
    return f"s3a://{bucket}/orders"


def _create(remote, path: str) -> None:
    remote.createDataFrame([(1, 10), (2, 20)], "id BIGINT, amount BIGINT").write.format(
        "delta"
    ).save(path)


def _merge_adding(remote, path: str, rows: list[tuple[int, int]]) -> None:
    """A MERGE that adds amounts: applied twice, it would count them twice."""
    remote.createDataFrame(rows, "id BIGINT, amount BIGINT").createOrReplaceTempView("changes")
    remote.sql(
        f"MERGE INTO delta.`{path}` t USING changes s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET t.amount = t.amount + s.amount "
        "WHEN NOT MATCHED THEN INSERT *"
    ).collect()


def _amounts(remote, path: str) -> list[tuple[int, int]]:
    rows = remote.read.format("delta").load(path).orderBy("id").collect()
    return [(r.id, r.amount) for r in rows]


def test_merge_into_a_delta_table_on_s3_runs_through_connect(remote, table, s3):
    _create(remote, table)

    _merge_adding(remote, table, [(2, 5), (3, 30)])

    assert _amounts(remote, table) == [(1, 10), (2, 25), (3, 30)]
    history = remote.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()
    assert [r.operation for r in history] == ["WRITE", "MERGE"]
    assert history[-1].operationMetrics["numTargetRowsUpdated"] == "1"
    bucket = table.split("/")[2]
    assert "orders/_delta_log/00000000000000000001.json" in s3.keys(bucket)


def test_a_replayed_transaction_version_is_skipped_over_connect(remote, table):
    _create(remote, table)
    app = f"load-{uuid.uuid4().hex[:8]}"
    try:
        remote.conf.set("spark.databricks.delta.write.txnAppId", app)
        remote.conf.set("spark.databricks.delta.write.txnVersion", "1")
        _merge_adding(remote, table, [(1, 1)])
        # The same version again (a retried run): Delta skips the write.
        remote.conf.set("spark.databricks.delta.write.txnVersion", "1")
        _merge_adding(remote, table, [(1, 1)])
        after_replay = _amounts(remote, table)
        remote.conf.set("spark.databricks.delta.write.txnVersion", "2")
        _merge_adding(remote, table, [(1, 1)])
    finally:
        remote.conf.unset("spark.databricks.delta.write.txnAppId")
        remote.conf.unset("spark.databricks.delta.write.txnVersion")

    assert after_replay == [(1, 11), (2, 20)]
    assert _amounts(remote, table) == [(1, 12), (2, 20)]
    history = remote.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
    assert sorted(r.operation for r in history) == ["MERGE", "MERGE", "WRITE"]
