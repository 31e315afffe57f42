"""Processes one after another on a host take the Spark Connect session the last one left
(engine/spark/session_slots.py), so a launched run does not compile its queries' classes
again: never while another process holds it, never after a process that was killed, and a
session the server closed is replaced. Each process here is a child, as each launched
Dagster run is; their slots are in a cache folder of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from incremental_assets.engine import jars

pytestmark = pytest.mark.slow

CHILD = """
import os, signal, sys
from incremental_assets.engine.spark.remote import connect_session
url, mode = sys.argv[1], sys.argv[2]
session = connect_session(url, {"spark.sql.shuffle.partitions": "3"})
assert session.range(3).count() == 3
print("SESSION", session.client._session_id, flush=True)
if mode == "hold":  # holds its slot until its input ends
    sys.stdin.read()
elif mode == "kill":  # killed: no exit of its own
    os.kill(os.getpid(), signal.SIGKILL)
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

    def start(mode: str = "exit") -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, connect_server.url, mode],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def session_of(process: subprocess.Popen) -> str:
        line = process.stdout.readline()
        assert line.startswith("SESSION "), line + process.stderr.read()[-3000:]
        return line.split()[1]

    def run(mode: str = "exit") -> str:
        process = start(mode)
        session = session_of(process)
        process.communicate(timeout=120)
        return session

    def close(session: str) -> None:
        subprocess.run(
            [sys.executable, "-c", CLOSE, connect_server.url, session],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    run.start, run.session_of, run.close = start, session_of, close
    return run


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
