"""Work alongside a run's own (engine/spark/alongside.py): it runs while the caller's block
runs, with the caller's Spark tags, hands back its result or raises its error in the
caller, and is waited for however the block ends. Runs in both passes of ./dev test
(listed in connect_suite.txt)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from incremental_assets.engine.spark.alongside import alongside


def test_the_work_runs_while_the_block_runs_and_hands_back_its_result(spark):
    started, block_done = threading.Event(), threading.Event()

    def work():
        started.set()
        # Waits for the block: only work that runs at the same time can see it end.
        assert block_done.wait(60), "the block never ran while the work waited"
        return spark.range(5).count()

    with alongside(spark, work) as result:
        assert started.wait(60)
        rows = spark.range(3).count()  # a Spark job of the caller's, meanwhile
        block_done.set()
        assert (rows, result()) == (3, 5)


def test_the_work_sees_the_callers_spark_tags(spark):
    tag = f"alongside-{uuid.uuid4().hex[:8]}"
    spark.addTag(tag)
    try:
        with alongside(spark, lambda: set(spark.getTags())) as tags:
            assert tag in tags()
    finally:
        spark.removeTag(tag)


def test_an_error_of_the_work_is_raised_in_the_caller(spark):
    def work():
        spark.sql("SELECT * FROM a_table_no_one_made_alongside").collect()

    with alongside(spark, work) as result, pytest.raises(Exception, match="no_one_made"):
        result()


def test_the_work_is_waited_for_when_the_block_fails(spark):
    finished = threading.Event()

    def work():
        time.sleep(0.5)
        finished.set()

    with pytest.raises(RuntimeError, match="the block failed"), alongside(spark, work):
        raise RuntimeError("the block failed")
    assert finished.is_set()
