"""A warehouse on an object store that refuses the run: a bucket that does not exist,
credentials the store refuses, an endpoint nothing answers on. Each stops the run with one
line naming the table, the location, the setting and the fix (not a retried HTTP trace or
a stack trace), and nothing is written. Against moto's S3 server (one with its credential
checks on, for the refused credentials)."""

from __future__ import annotations

import uuid

import pytest

from incremental_assets.engine import run_load
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import StoreAccessError
from incremental_assets.engine.store_errors import store_error
from incremental_assets_tests.builders import at, day_request, make_spec
from incremental_assets_tests.object_stores import S3Server, _free_port
from incremental_assets_tests.servers import s3_options


def _refused_run(spark, orders_source, target: DeltaTarget) -> StoreAccessError:
    orders_source.upsert([(1, "new", 1.0, at(1, 1))])
    with pytest.raises(StoreAccessError) as caught:
        run_load(spark, make_spec(orders_source.path), target, day_request(1))
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith("table 'orders': ")
    assert "nothing was written" in message
    return caught.value


def test_a_warehouse_bucket_that_does_not_exist_is_named_and_nothing_is_written(
    spark, s3, orders_source
):
    bucket = f"missing-{uuid.uuid4().hex[:10]}"
    target = DeltaTarget("orders", f"s3://{bucket}/wh/orders", s3_options(s3.endpoint))

    error = _refused_run(spark, orders_source, target)

    assert error.kind == "missing"
    assert f"the bucket '{bucket}' of its target s3://{bucket}/wh/orders does not exist" in str(
        error
    )
    assert "Fix: create it, or correct warehouse.root" in str(error)
    created = [b["Name"] for b in s3.client.list_buckets().get("Buckets", [])]
    assert bucket not in created  # nothing was written, not even the bucket


def test_credentials_the_store_refuses_are_named_with_where_to_set_them(
    spark, orders_source, tmp_path, monkeypatch
):
    # A second moto server that checks credentials (the shared one takes any): it knows
    # none, so the environment's are refused as a real S3 refuses a wrong key.
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")
    strict = S3Server(tmp_path)
    monkeypatch.delenv("INITIAL_NO_AUTH_ACTION_COUNT")
    try:
        target = DeltaTarget("orders", "s3://wh/orders", s3_options(strict.endpoint))
        error = _refused_run(spark, orders_source, target)
    finally:
        strict.stop()

    assert error.kind == "refused"
    message = str(error)
    assert "refused the credentials for its target s3://wh/orders (InvalidAccessKeyId)" in message
    assert "Fix: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in message
    assert "never in the tables file" in message


def test_an_endpoint_nothing_answers_on_is_named(spark, orders_source):
    endpoint = f"http://127.0.0.1:{_free_port()}"
    target = DeltaTarget("orders", "s3://wh/orders", s3_options(endpoint))

    error = _refused_run(spark, orders_source, target)

    assert error.kind == "unreachable"
    assert "the object store of its target s3://wh/orders cannot be reached" in str(error)
    assert "Fix: check 'endpoint' in warehouse.storage_options" in str(error)


def test_a_failure_that_names_no_store_location_is_not_told_as_the_stores():
    stores = {"target": ("s3://wh/orders", "warehouse.root")}
    database = "Connection refused: connect to 127.0.0.1:5432 (the source database)"

    assert store_error("orders", stores, database) is None
    assert store_error("orders", stores, "NoSuchBucket: wh") is not None
