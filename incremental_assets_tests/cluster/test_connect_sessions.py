"""Processes one after another on a host take the Spark Connect session the last one left
(engine/spark/session_slots.py), so a launched run does not compile its queries' classes
again: never while another process holds it, never after a process that was killed, and a
session the server closed is replaced. Each process here is a child, as each launched
Dagster run is; their slots are in a cache folder of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from incremental_assets.engine import jars

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Session:
    """A child's session: the id it asked for, the server's own id of it (new whenever the
    server made a session), and Delta's transaction id setting as the child found it."""

    client: str
    server: str
    leaked: str | None


CHILD = """
import os, signal, sys
from incremental_assets.engine.delta_lake import commits
from incremental_assets.engine.spark.remote import connect_session
url, mode = sys.argv[1], sys.argv[2]
session = connect_session(url, {"spark.sql.shuffle.partitions": "3"}, across_processes=True)
leaked = session.conf.get(commits.TXN_APP_ID, None)
# The server's own id of the session: the same only if the server kept the session.
print("SESSION", session.client._session_id, session.client._server_session_id, leaked, flush=True)
if mode == "hold":  # holds its slot until its input ends
    sys.stdin.read()
elif mode == "kill":  # killed: no exit of its own
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "leave-settings":  # a setting of its own left in the session, then a clean exit
    session.conf.set(commits.TXN_APP_ID, "left-by-the-last-process")
elif mode == "columns":  # a Delta table's columns
    print("COLUMNS", ",".join(session.read.format("delta").load(sys.argv[3]).columns))
elif mode == "add-column":
    session.sql(f"ALTER TABLE delta.`{sys.argv[3]}` ADD COLUMNS (added STRING)").collect()
elif mode == "fail-commit":  # a commit that fails, then a clean exit
    try:
        with commits.session_settings(session, {commits.TXN_APP_ID: "failing"}):
            raise RuntimeError("the commit failed")
    except RuntimeError:
        pass
"""

# As a server closes a session that stayed idle past its timeout: released by a client
# that names it.
CLOSE = """
import sys
from pyspark.sql.connect.session import SparkSession
session = SparkSession.builder.remote(f"{sys.argv[1]}/;session_id={sys.argv[2]}").create()
session.client.release_session()
"""


@pytest.fixture
def child(connect_server, tmp_path):
    env = {**os.environ, jars.CACHE_ENV: str(tmp_path / "cache" / "jars")}
    env.pop("INCREMENTAL_ASSETS_SPARK_REMOTE", None)

    def start(mode: str = "exit", *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, connect_server.url, mode, *args],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def session_of(process: subprocess.Popen) -> Session:
        line = process.stdout.readline()
        assert line.startswith("SESSION "), line + process.stderr.read()[-3000:]
        _, client, server, leaked = line.split()
        return Session(client, server, None if leaked == "None" else leaked)

    def run(mode: str = "exit", *args: str) -> Session:
        process = start(mode, *args)
        session = session_of(process)
        out, _ = process.communicate(timeout=120)
        run.printed = out
        return session

    def close(session: Session) -> None:
        subprocess.run(
            [sys.executable, "-c", CLOSE, connect_server.url, session.client],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    run.start, run.session_of, run.close, run.url = start, session_of, close, connect_server.url
    run.printed = ""
    return run


def _create(child, table: str) -> None:
    """A Delta table of one column, written by a process with a session of its own."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from pyspark.sql.connect.session import SparkSession\n"
            "session = SparkSession.builder.remote(sys.argv[1]).create()\n"
            "session.range(3).write.format('delta').save(sys.argv[2])\n",
            child.url,
            table,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def test_the_next_process_takes_the_session_the_last_one_left(child):
    first = child()
    assert child() == first

    holder = child.start("hold")
    assert child.session_of(holder) == first
    # Held by a live process: another at the same time gets a session of its own.
    alongside = child()
    assert alongside != first
    holder.communicate("", timeout=120)
    assert child() == first


def test_a_killed_process_leaves_its_session_to_no_one(child):
    killed = child("kill")
    after = child()
    # Its commands may still be running on the server: the next process starts anew.
    assert after != killed
    assert child() == after


def test_a_session_the_server_closed_is_replaced_by_a_new_one(child):
    first = child()
    child.close(first)

    replaced = child()
    assert replaced != first
    assert child() == replaced


def test_settings_the_last_process_left_are_reset_in_the_session_it_takes(child):
    left = child("leave-settings")
    after = child()
    assert after == Session(left.client, left.server, None)


def test_after_a_commit_that_failed_the_next_process_starts_a_new_session(child):
    failed = child("fail-commit")
    after = child()
    assert after.client != failed.client and after.server != failed.server


def test_a_query_the_last_process_made_is_not_answered_from_its_plan(child, tmp_path):
    # The server caches a session's resolved plans by their messages; the same read in
    # the next process must not get the last one's columns.
    table = str(tmp_path / "table")
    _create(child, table)
    first = child("columns", table)
    # Read by two processes, as runs read a table run after run: with the plan ids of
    # each process from 0, the third read got the first ones' columns (seen; one read
    # before was not enough).
    assert child("columns", table) == first
    assert child.printed.strip() == "COLUMNS id"
    assert child("add-column", table) == first
    assert child("columns", table) == first
    assert child.printed.strip() == "COLUMNS id,added"
