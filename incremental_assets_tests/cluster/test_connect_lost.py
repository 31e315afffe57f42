"""A Spark Connect server killed (SIGKILL) in the middle of a load: the run fails with one
line naming the setting, nothing of it is committed, and the next run, on a server that is
up, loads exactly what the killed one did not. Runs in the Connect pass of ./dev test (a
process holds Connect sessions or a local one, not both)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from deltalake import DeltaTable

from incremental_assets.engine.errors import SparkRemoteError
from incremental_assets.engine.spark.remote import REMOTE_ENV, SETTING
from incremental_assets.engine.spark_session import start_session
from incremental_assets_tests.builders import at, load, make_spec, target_rows
from incremental_assets_tests.servers import start_connect_server

pytestmark = [pytest.mark.slow, pytest.mark.connect_only]


def test_a_connect_server_killed_mid_load_fails_the_run_and_the_next_run_is_exact(
    spark, orders_source, target, s3_endpoint, tmp_path_factory
):
    orders_source.upsert([(1, "placed", 10.0, at(1, 1))])
    spec = make_spec(orders_source.path)
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()
    orders_source.upsert([(2, "placed", 20.0, at(1, 2)), (1, "paid", 11.0, at(1, 3))])
    doomed = start_connect_server(tmp_path_factory.mktemp("doomed"), s3_endpoint)
    try:
        session = start_session({"spark.remote": doomed.url})

        def kill_the_server(phase: str) -> None:
            if phase == "staged":  # extracted and staged; the commit comes next
                doomed.process.kill()
                doomed.process.wait()

        started = time.monotonic()
        with pytest.raises(SparkRemoteError) as info:
            load(session, spec, target, 1, hook=kill_the_server)
        failed_in = time.monotonic() - started
    finally:
        doomed.stop()

    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"the Spark Connect server {doomed.url} ({SETTING}) went away during the run; "
        "nothing of the run was committed"
    )
    assert "Fix: restart the server and run again" in message
    assert failed_in < 120  # bounded retries, not Connect's ten minutes
    assert DeltaTable(target.path).version() == version
    # The next run, on a server that is up (the shared one), is exact.
    load(spark, spec, target, 1)
    assert target_rows(target) == [(1, "paid", 11.0, at(1, 3)), (2, "placed", 20.0, at(1, 2))]
    load(spark, spec, target, 1)  # and a re-run changes nothing
    assert target_rows(target) == [(1, "paid", 11.0, at(1, 3)), (2, "placed", 20.0, at(1, 2))]


def test_a_thread_keeps_its_connect_session_while_the_server_knows_it(spark):
    """Runs in one process with the same settings take the session of the last one again
    (the server compiles a query's classes once per session); a thread of its own, or other
    settings, get their own; and a session its server no longer knows is replaced."""
    url = os.environ[REMOTE_ENV]
    conf = {"spark.remote": url, "spark.sql.shuffle.partitions": "3"}
    with ThreadPoolExecutor(1) as pool:  # one thread, of its own: not the suite's session

        def session(settings: dict[str, str]):
            return pool.submit(start_session, settings).result()

        first = session(conf)
        assert first is not spark
        assert session(conf) is first
        other = session({**conf, "spark.sql.shuffle.partitions": "4"})
        assert other is not first
        assert first.conf.get("spark.sql.shuffle.partitions") == "3"

        first.client.release_session()  # as a restarted server: it no longer knows it
        after = session(conf)
        assert after is not first
        assert after.range(3).count() == 3
