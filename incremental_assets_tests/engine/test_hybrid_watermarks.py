"""Hybrid watermarks: (timestamp, tie-breaking id) cursors for sources where thousands of
rows share one timestamp."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake.store import app_id
from incremental_assets.engine.errors import NullValuesError
from incremental_assets.engine.sources import source_class
from incremental_assets_tests.builders import ParquetFolder, at, load, make_spec

ROWS = pa.schema([("id", pa.int64()), ("v", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])


def batch(ids, stamp) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "v": f"v{i}", "ts": stamp} for i in ids], ROWS)


def hybrid_spec(path, **watermark):
    return make_spec(
        str(path),
        source={"format": "parquet"},
        keys=["id"],
        watermark={"column": "ts", "kind": "hybrid", "tiebreak": "id", **watermark},
    )


def loaded_ids(target: DeltaTarget) -> list[int]:
    return sorted(DeltaTable(target.path).to_pyarrow_table(columns=["id"]).column(0).to_pylist())


def test_runs_that_stop_inside_a_burst_lose_and_duplicate_nothing(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "src")
    folder.drop(batch(range(1, 1001), at(1, 12)))  # 1000 rows share one timestamp
    folder.drop(batch(range(1001, 1201), at(1, 13)))
    spec = hybrid_spec(folder.path, max_rows=300)
    target = DeltaTarget("t", str(tmp_path / "target"))

    runs = [load(spark, spec, target, 1) for _ in range(3)]
    # Rows of the same instant arrive after the run stopped at (12:00, 900): still loaded.
    folder.drop(batch(range(5001, 5051), at(1, 12)))
    runs += [load(spark, spec, target, 1) for _ in range(3)]

    # Run 4 takes ids 901-1000 and 5001-5050 at 12:00, then 1001-1150 at 13:00.
    assert [r.rows_inserted for r in runs] == [300, 300, 300, 300, 50, 0]
    assert [r.cursor_after for r in runs[:3]] == [
        (at(1, 12), 300),
        (at(1, 12), 600),
        (at(1, 12), 900),
    ]
    assert runs[-1].cursor_after == (at(1, 13), 1200)
    assert loaded_ids(target) == [*range(1, 1201), *range(5001, 5051)]


def test_boundary_rows_committed_late_are_kept_by_hybrid_and_by_the_file_ledger(spark, tmp_path):
    """Rows stamped with the cursor's own instant, committed after it was loaded: a hybrid
    watermark reads them by (time, id); a plain timestamp watermark without lookback reads
    them only because they came in a new file (a database source would lose them)."""
    folder = ParquetFolder(tmp_path / "src")
    folder.drop(batch(range(1, 101), at(1, 12)))
    plain = make_spec(
        str(folder.path),
        source={"format": "parquet"},
        keys=["id"],
        watermark={"column": "ts", "kind": "timestamp", "lookback": "0s"},
    )
    plain_target = DeltaTarget("t", str(tmp_path / "plain"))
    hybrid_target = DeltaTarget("t", str(tmp_path / "hybrid"))
    load(spark, plain, plain_target, 1)
    load(spark, hybrid_spec(folder.path), hybrid_target, 1)
    # More rows of the same batch import commit late, stamped with the same instant.
    folder.drop(batch(range(101, 151), at(1, 12)))

    late = load(spark, plain, plain_target, 1)
    hybrid = load(spark, hybrid_spec(folder.path), hybrid_target, 1)

    assert (late.files_late, late.rows_late) == (1, 50)  # at the cursor, in a new file
    assert hybrid.rows_late == 0  # above its (time, id) cursor: the window reads them
    assert loaded_ids(plain_target) == list(range(1, 151))
    assert loaded_ids(hybrid_target) == list(range(1, 151))


def test_hybrid_cursor_is_committed_with_both_parts_in_one_commit(spark, tmp_path):
    folder = ParquetFolder(tmp_path / "src")
    folder.drop(batch(range(1, 11), at(1, 12)))
    target = DeltaTarget("t", str(tmp_path / "target"))

    result = load(spark, hybrid_spec(folder.path), target, 1)

    table = DeltaTable(target.path)
    assert table.version() == result.delta_version
    assert table.transaction_version(app_id("t")) == 0  # the first commit of the sequence
    record = delta_commits.parse(table.history(1)[0])
    assert record["cursor_after"] == "2026-01-01T12:00:00Z|10"
    assert target.state("hybrid").cursor == result.cursor_after == (at(1, 12), 10)


def test_the_out_of_range_scan_counts_a_folders_null_watermarks_and_the_run_refuses_them(
    spark, tmp_path, monkeypatch
):
    # A folder's null watermarks and null tie-breaks are known only from a scan: a hybrid
    # watermark's run counts them in the scan that counts its rows out of range, not in a
    # Spark job of their own each.
    folder = ParquetFolder(tmp_path / "src")
    folder.drop(batch(range(1, 4), at(1, 12)))
    folder.drop(batch([4], datetime(2025, 12, 1, tzinfo=timezone.utc)))  # before the start
    spec = hybrid_spec(folder.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    counted: list[str] = []
    source = source_class("t", spec.source)
    count_nulls = source.count_nulls
    monkeypatch.setattr(
        source,
        "count_nulls",
        lambda self, column: counted.append(column) or count_nulls(self, column),
    )

    first = load(spark, spec, target, 1)

    assert first.out_of_range is not None and first.out_of_range.before_start == 1
    assert first.rows_inserted == 3 and counted == []
    version = DeltaTable(target.path).version()
    folder.drop(batch([5, 6], None))

    with pytest.raises(NullValuesError) as refused:
        load(spark, spec, target, 1)

    assert refused.value.counts == {"ts": 2}
    assert DeltaTable(target.path).version() == version
    assert loaded_ids(target) == [1, 2, 3]
    other = ParquetFolder(tmp_path / "other")
    other.drop(batch(range(1, 4), at(1, 12)))
    other.drop(batch([None, None], at(1, 13)))  # rows without a tie-break
    other_target = DeltaTarget("t", str(tmp_path / "other_target"))

    with pytest.raises(NullValuesError) as refused:
        load(spark, hybrid_spec(other.path), other_target, 1)

    assert refused.value.counts == {"id": 2}
    assert not DeltaTable.is_deltatable(other_target.path)  # nothing committed
    assert counted == []  # every count came from the probe's scan
