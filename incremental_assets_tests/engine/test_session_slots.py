"""The Spark Connect session slots' folder (engine/spark/session_slots.py) does not grow
with every server a host has used: taking a slot removes the slots no process holds and
none has written for a day, and only those. No server is needed: a slot is a file."""

from __future__ import annotations

import fcntl
import os
import time

import pytest

from incremental_assets.engine import jars
from incremental_assets.engine.spark import session_slots

DAY = 24 * 3600


@pytest.fixture
def slots(monkeypatch, tmp_path):
    monkeypatch.setenv(jars.CACHE_ENV, str(tmp_path / "cache" / "jars"))
    folder = session_slots.folder()
    folder.mkdir(parents=True)
    return folder


def _slot(folder, name: str, age: float, in_use: bool = False):
    path = folder / name
    session = f"{'0' * 8}-0000-4000-8000-{'0' * 12}"
    path.write_text(f'{{"session_id": "{session}", "in_use": {str(in_use).lower()}}}')
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_taking_a_slot_removes_the_slots_no_one_holds_or_wrote_for_a_day(slots):
    stale = _slot(slots, "a" * 20 + "-0", 2 * DAY)
    stale_in_use = _slot(slots, "b" * 20 + "-3", 3 * DAY, in_use=True)  # left by a kill
    recent = _slot(slots, "c" * 20 + "-0", DAY - 600)
    held = _slot(slots, "d" * 20 + "-1", 5 * DAY, in_use=True)
    other = _slot(slots, "notes.txt", 9 * DAY)
    with open(held) as holder:  # another process's lock (flock is per open file)
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)

        slot = session_slots.take("sc://127.0.0.1:15002", {"spark.sql.shuffle.partitions": "2"})

    assert slot is not None
    try:
        assert not stale.exists() and not stale_in_use.exists()
        assert recent.exists() and held.exists() and other.exists()
        assert slot.path.exists()
    finally:
        slot.handle.close()


def test_a_slot_taken_is_not_removed_however_old_its_file(slots):
    url, conf = "sc://127.0.0.1:15002", {}
    first = session_slots.take(url, conf)  # its file stays locked while open
    assert first is not None
    try:
        old = time.time() - 2 * DAY
        os.utime(first.path, (old, old))

        second = session_slots.take(url, conf)

        assert second is not None and second.path != first.path
        second.handle.close()
        assert first.path.exists()
    finally:
        first.handle.close()
