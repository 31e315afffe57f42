"""A commit's session settings (engine/delta_lake/commits.py ``session_settings``) are set
within the block and put back after it as they were, set or not, however the block ends;
through Spark Connect in batches (engine/spark/runtime_conf.py): 4 keys read, set and
restored in 4 round trips, where one call a key made 12. Runs in both passes of ./dev test
(listed in connect_suite.txt)."""

from __future__ import annotations

import logging
import uuid

import pytest

from incremental_assets.engine.delta_lake import commits
from incremental_assets.engine.delta_lake.commits import session_settings
from incremental_assets.engine.spark import runtime_conf
from incremental_assets.engine.spark.remote import is_connect


@pytest.fixture
def keys(spark):
    """Four settings of a test's own: the first two set before the block, the others not."""
    names = [f"incremental_assets.test.{uuid.uuid4().hex[:8]}.{n}" for n in range(4)]
    spark.conf.set(names[0], "before-0")
    spark.conf.set(names[1], "before-1")
    yield names
    for name in names:
        spark.conf.unset(name)


@pytest.fixture
def round_trips(spark, monkeypatch):
    """The config round trips ``spark`` makes from now on (a Spark Connect session's)."""
    calls = []
    if is_connect(spark):
        client = spark.client
        config = client.config

        def counted(operation):
            calls.append(operation.WhichOneof("op_type"))
            return config(operation)

        monkeypatch.setattr(client, "config", counted)
    return calls


def _values(spark, names):
    return [spark.conf.get(name, None) for name in names]


def test_settings_are_set_in_the_block_and_put_back_as_they_were_after_it(spark, keys, round_trips):
    inside = {keys[0]: "new-0", keys[2]: "new-2", keys[3]: "new-3"}
    before = _values(spark, keys)
    round_trips.clear()

    with session_settings(spark, {**inside, keys[1]: "before-1"}):
        entering = list(round_trips)
        seen = _values(spark, keys)
        del round_trips[:]
    leaving = list(round_trips)

    assert seen == ["new-0", "before-1", "new-2", "new-3"]
    assert _values(spark, keys) == before == ["before-0", "before-1", None, None]
    if is_connect(spark):  # one round trip each: read, set; unset, set back
        assert (entering, leaving) == (["get_with_default", "set"], ["unset", "set"])


def test_settings_are_put_back_when_the_block_fails(spark, keys):
    with (
        pytest.raises(RuntimeError, match="the block failed"),
        session_settings(spark, {keys[0]: "new-0", keys[2]: "new-2"}),
    ):
        raise RuntimeError("the block failed")

    assert _values(spark, keys) == ["before-0", "before-1", None, None]


def test_reading_keys_none_of_which_is_set_gives_none_for_each(spark):
    names = [f"incremental_assets.test.{uuid.uuid4().hex[:8]}.{n}" for n in range(3)]
    assert runtime_conf.get_many(spark, names) == dict.fromkeys(names)
    assert runtime_conf.get_many(spark, []) == {}


def test_which_settings_may_be_changed_is_asked_once_for_all(spark, round_trips):
    asked = ["spark.sql.shuffle.partitions", "spark.sql.extensions", "spark.sql.ansi.enabled"]
    round_trips.clear()

    found = runtime_conf.modifiable(spark, asked)

    assert found == ["spark.sql.shuffle.partitions", "spark.sql.ansi.enabled"]  # not static
    if is_connect(spark):
        assert round_trips == ["is_modifiable"]


@pytest.fixture
def refusing(spark):
    """Forgets, after the test, that ``spark`` refused a block's optional settings."""
    yield
    commits._REFUSING.discard(spark)


def test_optional_settings_a_session_refuses_are_left_out_all_together_and_said_once(
    spark, keys, caplog, refusing, round_trips
):
    # spark.sql.extensions is static: no running session takes it, as a serverless
    # workspace refuses settings it does not offer (CONFIG_NOT_AVAILABLE).
    static = "spark.sql.extensions"
    extensions = spark.conf.get(static, None)
    optional = {keys[2]: "new-2", static: "com.example.Nothing", keys[1]: "optional-1"}

    with caplog.at_level(logging.WARNING, logger=commits.__name__):
        with session_settings(spark, {keys[0]: "new-0"}, optional):
            first = _values(spark, keys)
            assert spark.conf.get(static, None) == extensions
        round_trips.clear()
        with session_settings(spark, {keys[0]: "again-0"}, optional):
            entering = list(round_trips)
            again = _values(spark, keys)
            del round_trips[:]
        leaving = list(round_trips)

    # None of them, the one set before the refused one in a batch put back too.
    assert first == ["new-0", "before-1", None, None]
    assert again == ["again-0", "before-1", None, None]
    assert _values(spark, keys) == ["before-0", "before-1", None, None]
    assert caplog.text.count(f"refuses one of {keys[2]}=new-2, {static}=") == 1
    if is_connect(spark):  # the session's later blocks do not ask again: read, set; set back
        assert (entering, leaving) == (["get_with_default", "set"], ["set"])


def test_a_required_setting_the_session_refuses_fails_the_block_before_it_runs(
    spark, keys, refusing
):
    ran = []
    with (
        pytest.raises(Exception, match="CANNOT_MODIFY_STATIC_CONFIG") as raised,
        session_settings(spark, {"spark.sql.extensions": "com.example.Nothing"}, {keys[2]: "x"}),
    ):
        ran.append(True)

    assert not ran
    # Not hidden by putting the settings back (a refusal of its own, the first its context).
    assert type(raised.value.__context__) is not type(raised.value)
    assert _values(spark, keys) == ["before-0", "before-1", None, None]
    assert spark not in commits._REFUSING  # the optional ones were not refused


def test_an_optional_setting_failing_otherwise_fails_the_block(spark, keys):
    with (
        pytest.raises(Exception, match=r"spark\.sql\.shuffle\.partitions"),
        session_settings(spark, {keys[0]: "new-0"}, {"spark.sql.shuffle.partitions": "many"}),
    ):
        pass

    assert _values(spark, keys) == ["before-0", "before-1", None, None]
