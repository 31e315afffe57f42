"""A first load whose write fails, or is killed, part way: Delta leaves the files that write
had written in the new table's folder, with no log. The run that failed removes them; a run
killed first leaves its claim in the staging root, and the next run removes them (only
those: anything else in the folder, or no claim for it, is refused as before). Either way
the next run creates the table, exactly, rather than refusing a folder that is not empty.

The write is made to fail by a row whose partition value is longer than a file name may
be: the writer of each task writes the other values' files first (its rows are sorted by
partition value), then fails on that one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget, staging
from incremental_assets.engine.delta_lake.folders import held
from incremental_assets.engine.delta_lake.store import LEFTOVERS_REMOVED
from incremental_assets.engine.errors import TargetOwnedError
from incremental_assets.engine.faults import CRASH_ENV
from incremental_assets.engine.processes import this_process
from incremental_assets.engine.staging import REMOTE_SETTLE_SECONDS, Claim
from incremental_assets_tests.builders import (
    CHILD_SPARK_CONF,
    PROJECT_ROOT,
    DeltaSourceTable,
    at,
    load,
    make_spec,
    staging_left,
    target_rows,
)

TOO_LONG = "z" * 300  # a partition folder's name longer than the file system allows


def orders(n: int = 60) -> list[tuple]:
    return [(i, "placed" if i % 2 else "paid", float(i), at(1, 1, i % 60)) for i in range(1, n)]


def spec_of(source: DeltaSourceTable):
    return make_spec(source.path, target={"partition_by": ["status"]})


def commit_records(path: str) -> list[dict]:
    return [
        json.loads(c["userMetadata"])["incremental_assets"]
        for c in DeltaTable(path).history()
        if c.get("userMetadata")
    ]


def claim(spark, run_folder, claimed: Claim) -> None:
    staging.claim(spark, f"{run_folder}/increment", claimed)


def gone_process() -> str:
    """``host:pid`` of a process of this host that has ended."""
    child = subprocess.Popen(["true"])
    child.wait()
    return f"{this_process().rpartition(':')[0]}:{child.pid}"


def test_a_failed_first_write_leaves_an_empty_folder_and_the_next_run_creates_the_table(
    spark, tmp_path
):
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    source.upsert([*orders(), (100, TOO_LONG, 1.0, at(1, 2))])
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))

    with pytest.raises(Exception, match=r"(?i)name too long|FAILED_WRITE|Task failed"):
        load(spark, spec_of(source), target, 1)

    assert not target.exists()
    assert held(target.path) == []
    assert staging_left(tmp_path / "warehouse" / "orders__staging") == []

    source.upsert([(100, "paid", 1.0, at(1, 2))])
    result = load(spark, spec_of(source), target, 1)

    expected = sorted([*orders(), (100, "paid", 1.0, at(1, 2))])
    assert result.rows_inserted == len(expected)
    assert target_rows(target) == expected
    assert LEFTOVERS_REMOVED not in commit_records(target.path)[0]


_CHILD = """
import sys
from incremental_assets.engine import DeltaTarget, run_load
from incremental_assets.engine.spark_session import local_session
from incremental_assets.engine.windows import LoadRequest
from incremental_assets.specs import TableSpec
from incremental_assets_tests.builders import at
spec = TableSpec.model_validate_json(sys.argv[1])
spark = local_session(**dict(arg.split("=", 1) for arg in sys.argv[3:]))
run_load(spark, spec, DeltaTarget("orders", sys.argv[2]), LoadRequest(at(1), at(2)))
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "interrupted"])
def test_a_first_load_killed_in_its_write_is_cleared_and_created_by_the_next_run(
    spark, tmp_path, how
):
    """Killed (SIGKILL) or interrupted (SIGINT: Ctrl-C; Dagster's terminate raises its own
    interrupt, which is not an Exception either), the run leaves its files and its claim."""
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    source.upsert([*orders(), (100, TOO_LONG, 1.0, at(1, 2))])
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
    conf = [f"{k}={v}" for k, v in CHILD_SPARK_CONF.items()]
    point = "creating_write_failed" + (":interrupt" if how == "interrupted" else "")
    env = {**os.environ, CRASH_ENV: point, "INCREMENTAL_ASSETS_DRIVER_MEMORY": "1g"}
    command = [sys.executable, "-c", _CHILD, spec_of(source).model_dump_json(), target.path]
    ended = subprocess.run(
        [*command, *conf], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300
    )

    if how == "killed":
        assert ended.returncode == -signal.SIGKILL, ended.stderr[-3000:]
    else:
        assert ended.returncode != 0 and "KeyboardInterrupt" in ended.stderr, ended.stderr[-3000:]
    # What a kill or an interrupt during the write leaves: its files, no log, and the
    # run's claim.
    left = held(target.path)
    assert left and not target.exists()
    assert any(name.startswith("status=") for name in left)
    assert list((tmp_path / "warehouse" / "orders__staging").glob("*/creates"))

    source.upsert([(100, "paid", 1.0, at(1, 2))])
    result = load(spark, spec_of(source), target, 1)

    expected = sorted([*orders(), (100, "paid", 1.0, at(1, 2))])
    assert result.rows_inserted == len(expected)
    assert target_rows(target) == expected
    (created,) = commit_records(target.path)
    assert "status=" in created[LEFTOVERS_REMOVED]
    assert staging_left(tmp_path / "warehouse" / "orders__staging") == []


def test_leftovers_are_removed_only_with_a_claim_for_this_folder_and_nothing_else_there(
    spark, tmp_path
):
    """A killed run's claim vouches for Delta's unlogged files only: without a claim for
    this very folder, or with any other file beside them (at the top or in a partition
    folder), the folder is refused as before and everything in it kept."""
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    source.upsert(orders())
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
    folder = tmp_path / "warehouse" / "orders"
    (folder / "status=paid").mkdir(parents=True)
    (folder / "status=paid" / "part-00000-left.snappy.parquet").write_bytes(b"PAR1")
    dead_run = tmp_path / "warehouse" / "orders__staging" / "0123456789ab"

    def refused(*extra: str) -> None:
        with pytest.raises(TargetOwnedError, match=r"status=paid"):
            load(spark, spec_of(source), target, 1)
        assert held(target.path) == sorted(["status=paid", *extra])
        assert (folder / "status=paid" / "part-00000-left.snappy.parquet").exists()

    refused()  # no claim at all
    claim(spark, dead_run, Claim(target.spark_path + "_elsewhere", "r1", gone_process()))
    refused()  # a claim for another folder
    for foreign in (folder / "important.txt", folder / "status=paid" / "notes.txt"):
        claim(spark, dead_run, Claim(target.spark_path, "r1", gone_process()))
        foreign.write_text("keep me")
        refused(*([foreign.name] if foreign.parent == folder else []))
        assert foreign.read_text() == "keep me"
        foreign.unlink()


def test_leftovers_of_a_run_that_may_still_be_writing_are_kept(spark, tmp_path):
    """A claim whose run may not be over keeps the files it vouches for, and the refusal
    says why: its process still runs, is on another host, or is gone but wrote through a
    Spark Connect server that may still be running its write. Once that is over (the
    process gone and, through Connect, the server's time to drop the write passed), the
    next run removes them and creates the table."""
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    source.upsert(orders())
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
    folder = tmp_path / "warehouse" / "orders"
    (folder / "status=paid").mkdir(parents=True)
    (folder / "status=paid" / "part-00000-left.snappy.parquet").write_bytes(b"PAR1")
    run_folder = tmp_path / "warehouse" / "orders__staging" / "0123456789ab"
    now = time.time()
    gone = gone_process()
    cases = [
        (Claim(target.spark_path, "r-live", this_process()), r"r-live .* is still running"),
        (Claim(target.spark_path, "r-far", "elsewhere.example:41"), r"cannot be checked"),
        (Claim(target.spark_path), r"\(not recorded\)"),  # a claim of a location only
        (Claim(target.spark_path, "r-con", gone, True, now), r"Spark Connect server"),
    ]
    for claimed, why in cases:
        claim(spark, run_folder, claimed)
        with pytest.raises(TargetOwnedError, match=why) as refused:
            load(spark, spec_of(source), target, 1)
        assert "status=paid" in str(refused.value)
        assert (folder / "status=paid" / "part-00000-left.snappy.parquet").exists()

    settled = now - REMOTE_SETTLE_SECONDS - 1
    claim(spark, run_folder, Claim(target.spark_path, "r-con", gone, True, settled))
    result = load(spark, spec_of(source), target, 1)

    assert result.rows_inserted == len(orders())
    assert target_rows(target) == sorted(orders())
    (created,) = commit_records(target.path)
    assert "status=paid" in created[LEFTOVERS_REMOVED]
