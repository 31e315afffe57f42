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
from dataclasses import replace

import pytest
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget, staging
from incremental_assets.engine.delta_lake.folders import held
from incremental_assets.engine.delta_lake.store import LEFTOVERS_REMOVED
from incremental_assets.engine.errors import FirstLoadUnfinishedError, TargetOwnedError
from incremental_assets.engine.faults import CRASH_ENV
from incremental_assets.engine.processes import Identity, this_identity
from incremental_assets.engine.staging import Claim
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


def gone_process() -> Identity:
    """A process of this host that has ended."""
    child = subprocess.Popen(["true"])
    child.wait()
    here = this_identity()
    return replace(here, process=f"{here.process.rpartition(':')[0]}:{child.pid}", started=0)


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
    child = subprocess.Popen(
        [*command, *conf], env=env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _, stderr = child.communicate(timeout=300)

    if how == "killed":
        assert child.returncode == -signal.SIGKILL, stderr[-3000:]
    else:
        assert child.returncode != 0 and "KeyboardInterrupt" in stderr, stderr[-3000:]
    # What a kill or an interrupt during the write leaves: its files, no log, and the
    # run's claim, naming the child's process (gone now) and no Connect server.
    left = held(target.path)
    assert left and not target.exists()
    assert any(name.startswith("status=") for name in left)
    staged = f"{staging.root_of('orders', target.path)}/next/increment"
    (found,) = staging.claims(spark, staged, target.spark_path)
    assert found.process.process.endswith(f":{child.pid}") and found.process.started
    assert (found.run_id, found.remote, found.unfinished()) == ("manual", False, None)

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
    says why: its process still runs, is on another host or in another container (pid
    namespace), is not named, or wrote through a Spark Connect server that may go on with
    the write after its client is gone. The refused run leaves that claim for the runs
    after it. Once its process is gone (a pid now held by a process started at another
    time is gone), the next run removes the files and creates the table."""
    source = DeltaSourceTable(tmp_path / "source" / "orders")
    source.upsert(orders())
    target = DeltaTarget("orders", str(tmp_path / "warehouse" / "orders"))
    folder = tmp_path / "warehouse" / "orders"
    (folder / "status=paid").mkdir(parents=True)
    (folder / "status=paid" / "part-00000-left.snappy.parquet").write_bytes(b"PAR1")
    run_folder = tmp_path / "warehouse" / "orders__staging" / "0123456789ab"
    here, location = this_identity(), target.spark_path
    cases = [
        (Claim(location, "r-live", here), r"r-live .* is still running"),
        (Claim(location, "r-far", Identity("elsewhere.example:41")), r"on another host"),
        (Claim(location, "r-box", replace(here, pid_space="pid:[1]")), r"on another host"),
        (Claim(location), r"names no process"),
        (Claim(location, "r-con", gone_process(), remote=True), r"Spark Connect server"),
    ]
    for claimed, why in cases:
        claim(spark, run_folder, claimed)
        for _ in range(2):  # the refused run leaves the claim: refused the same way again
            with pytest.raises(FirstLoadUnfinishedError, match=why) as refused:
                load(spark, spec_of(source), target, 1)
            assert "status=paid" in str(refused.value)
            assert (folder / "status=paid" / "part-00000-left.snappy.parquet").exists()

    reused = replace(here, started=here.started + 1)  # this pid, once another process's
    claim(spark, run_folder, Claim(location, "r-old", reused))
    result = load(spark, spec_of(source), target, 1)

    assert result.rows_inserted == len(orders())
    assert target_rows(target) == sorted(orders())
    (created,) = commit_records(target.path)
    assert "status=paid" in created[LEFTOVERS_REMOVED]


def test_a_claim_is_read_back_as_written_and_a_line_it_cannot_read_names_no_process():
    here = this_identity()
    claimed = Claim("s3a://bucket/wh/orders", "r1", here, remote=False)
    assert Claim.parse(claimed.line()) == claimed
    assert Claim.parse("s3a://bucket/wh/orders") == Claim("s3a://bucket/wh/orders")
    odd = claimed.line().replace(f'"started": {here.started}', '"started": "soon"')
    assert odd != claimed.line() and Claim.parse(odd).process is None
    unsure = Claim.parse(claimed.line().replace('"remote": false', '"remote": "false"'))
    assert unsure.remote is True  # not a boolean: read the careful way
