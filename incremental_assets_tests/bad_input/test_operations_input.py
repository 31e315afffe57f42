"""Operations refuse what they cannot undo: ``rewind --to`` takes only values the next run
can read from (each watermark kind's range, its edges tested by a run), a table left with
such a value by an earlier release can be rewound to a usable one, and text typed into the
CLI is stored as given and printed escaped."""

from __future__ import annotations

import json
from datetime import datetime

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from incremental_assets import cli
from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.errors import CursorRangeError, OperationError
from incremental_assets.engine.operations import rewind
from incremental_assets.engine.watermarks import ID_MAX, ID_MIN
from incremental_assets_tests.builders import (
    ParquetFolder,
    Project,
    at,
    feed,
    load,
    make_spec,
)


def _refused(spec, target, to: str, spark, match: str) -> None:
    version = DeltaTable(target.path).version() if target.exists() else None
    with pytest.raises(OperationError, match=match):
        rewind(spec, target, to, by="me", reason="why", spark=spark)
    assert (DeltaTable(target.path).version() if target.exists() else None) == version


def _id_table(spark, tmp_path, lookback: int = 0):
    folder = ParquetFolder(tmp_path / "feed")
    folder.drop(feed(*[(i, f"v{i}", "I", i, at(1, i)) for i in range(1, 4)]))
    spec = make_spec(
        str(folder.path),
        source={"format": "parquet"},
        keys=["id"],
        watermark={"column": "lsn", "kind": "id", "lookback": lookback},
        partitioning={"column": "changed_at"},
    )
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    load(spark, spec, target, 1)
    return spec, target


def test_an_id_rewind_takes_a_64_bit_integer_above_the_lookback_and_the_run_reads_from_it(
    spark, tmp_path
):
    spec, target = _id_table(spark, tmp_path, lookback=5)
    lowest = ID_MIN + 1 + 5

    for to in ("-9223372036854775809", str(ID_MIN), str(lowest - 1)):
        _refused(spec, target, to, spark, rf"below the lowest.*Fix: give an integer from {lowest}")
    _refused(spec, target, str(ID_MAX + 1), spark, r"above the highest")
    done = rewind(spec, target, str(lowest), by="me", reason="edge", spark=spark)
    again = load(spark, spec, target, 1)

    assert done.cursor_after == lowest
    assert again.rows_extracted == 3 and again.cursor_after == 3
    assert (again.rows_inserted, again.rows_updated) == (0, 0)


def test_a_time_rewind_takes_an_instant_a_day_and_the_lookback_inside_the_calendar(spark, tmp_path):
    """The edge is tested on a zone-less column read in a zone west of UTC with daylight
    saving, whose bounds are shifted and widened the most."""
    folder = ParquetFolder(tmp_path / "events")
    naive = pa.schema([("order_id", pa.int64()), ("updated_at", pa.timestamp("us"))])
    folder.drop(
        pa.Table.from_pylist(
            [{"order_id": i, "updated_at": datetime(2026, 1, 1, i)} for i in range(1, 4)],
            schema=naive,
        )
    )
    spec = make_spec(
        str(folder.path),
        source={"format": "parquet", "timezone": "America/Los_Angeles"},
        watermark={"lookback": "1h"},
    )
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    load(spark, spec, target, 1)
    fix = r"Fix: give an instant from 0001-01-02T01:00:00Z to 9999-12-30T23:59:59.999999Z"

    for to in ("0001-01-01T00:00", "0001-01-02T00:59:59.999999Z", "9999-12-31T00:00"):
        _refused(spec, target, to, spark, rf"(below the lowest|above the highest).*{fix}")
    # An offset that carries the time out of the calendar is refused, not a traceback.
    _refused(spec, target, "0001-01-01T00:00+01:00", spark, rf"outside the instants.*{fix}")
    done = rewind(spec, target, "0001-01-02T01:00:00Z", by="me", reason="edge", spark=spark)
    again = load(spark, spec, target, 1)

    assert done.cursor_after == datetime.fromisoformat("0001-01-02T01:00:00+00:00")
    assert "after 0001-01-02T00:00:00Z" in done.next_run_reads
    assert again.rows_extracted == 3 and again.cursor_after == at(1, 11)


def test_a_hybrid_rewind_takes_a_64_bit_id_part(spark, tmp_path):
    spec = make_spec(
        "unused", watermark={"kind": "hybrid", "tiebreak": "order_id", "lookback": "0s"}
    )
    target = DeltaTarget("orders", str(tmp_path / "orders"))  # refused before it is read

    for to in ("2026-01-01T00:00Z|9223372036854775808", "2026-01-01T00:00Z|-9223372036854775809"):
        _refused(spec, target, to, spark, r"id part .* not a 64-bit integer.*id part from")
    _refused(spec, target, "0001-01-01T12:00Z|5", spark, r"below the lowest.*0001-01-02")


def test_a_table_left_out_of_range_by_an_earlier_release_names_the_fix_and_can_be_rewound(
    spark, tmp_path
):
    spec, target = _id_table(spark, tmp_path)
    # What an earlier release committed for `rewind --to -9223372036854775809`.
    state = target.state("id")
    bad = -(2**63) - 1
    target.record_rewind(
        spark,
        state,
        bad,
        {"cursor_before": "3", "cursor_after": str(bad), "by": "old", "reason": "old"},
    )
    version = DeltaTable(target.path).version()

    with pytest.raises(CursorRangeError, match=r"rewind orders --to VALUE") as refused:
        load(spark, spec, target, 1)

    assert "below the lowest" in str(refused.value)
    assert DeltaTable(target.path).version() == version
    # Measured by the last load's watermark, not by the unusable one; moving past the last
    # load's would skip rows.
    _refused(spec, target, "4", spark, r"after 3, the watermark of the last load")
    done = rewind(spec, target, "1", by="me", reason="repair", spark=spark)
    again = load(spark, spec, target, 1)

    assert done.cursor_before == bad and done.cursor_after == 1
    assert again.committed and again.cursor_after == 3 and again.rows_extracted == 2


def test_text_typed_into_the_cli_is_stored_as_given_and_printed_escaped(
    tmp_path, spark, capsys, monkeypatch
):
    project = Project(tmp_path)
    project.source.upsert([(i, "placed", 1.0, at(1, i)) for i in range(1, 4)])
    load(spark, project.spec.tables[0], project.target, 1)
    monkeypatch.setattr(
        "incremental_assets.engine.spark_session.local_session", lambda *a, **k: spark
    )
    tables = ["--tables", str(tmp_path / "tables.yaml")]
    reason = "restored\n* orders: reset by admin; the next run starts there\x1b[2J\x1b[H"
    by = "eve\x1b]0;pwned\x07\u202e"

    code = cli.main(["rewind", "orders", "--to", "2026-01-01T01:00", "--reason", reason,
                     "--by", by, *tables])  # fmt: skip
    rewound = capsys.readouterr().out
    cli.main(["status", *tables])
    status = capsys.readouterr().out
    cli.main(["status", "--json", *tables])
    as_json = capsys.readouterr().out

    assert code == 0
    for out in (rewound, status, as_json):
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert len(rewound.splitlines()) == 2  # the rewind and the next run's window
    assert len(status.splitlines()) == 3  # header, orders, and one note: no forged line
    note = status.splitlines()[2]
    assert note.startswith("* orders: rewound from 2026-01-01T03:00:00Z to 2026-01-01T01:00")
    assert "by eve\\x1b]0;pwned\\x07\\u202e: restored\\n* orders: reset by admin" in note
    assert note.endswith("\\x1b[2J\\x1b[H; the next run starts there")
    # Stored as given, in the log and in status --json.
    record = delta_commits.parse(DeltaTable(project.target.path).history(1)[0])
    assert (record["reason"], record["by"]) == (reason, by)
    rewind_json = json.loads(as_json)[0]["rewind"]
    assert (rewind_json["reason"], rewind_json["by"]) == (reason, by)
