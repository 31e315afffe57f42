"""Reading only the Delta files that may hold a run's keys (history tables' log and target)."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.io import KeySet


def _table_of_files(path, batches: list[list]) -> DeltaTable:
    """One Delta file per batch of keys (ints or strings)."""
    for keys in batches:
        write_deltalake(str(path), pa.table({"k": keys, "v": [1] * len(keys)}), mode="append")
    return DeltaTable(str(path))


def _file_keys(files: list[dict]) -> list[tuple]:
    return sorted((f["min.k"], f["max.k"]) for f in files)


def test_only_files_whose_key_range_brackets_a_touched_key_are_kept(tmp_path):
    table = _table_of_files(tmp_path / "t", [[1, 50, 100], [101, 200], [201, 300], [150, 160]])
    actions = delta_io.live_files(table)

    # 120 lies in 101..200 only; 155 in 101..200 and 150..160; 400 in none.
    kept = delta_io.files_holding(actions, KeySet("k", [120, 155, 400]))
    assert _file_keys(kept) == [(101, 200), (150, 160)]
    # A key between two files' ranges (but inside none) keeps nothing.
    assert delta_io.files_holding(actions, KeySet("k", [301])) == []
    assert len(delta_io.files_holding(actions, KeySet("k", [1, 300]))) == 2
    # Keys too many to list are pruned by their range: every file overlapping 120..205.
    spans = KeySet("k", [120, 205], spans=True)
    assert _file_keys(delta_io.files_holding(actions, spans)) == [
        (101, 200),
        (150, 160),
        (201, 300),
    ]
    assert delta_io.may_hold_sql(spans) == "`k` BETWEEN 120 AND 205"


def test_string_keys_prune_by_statistics_even_when_truncated(tmp_path):
    long = "m" + "z" * 100  # delta-rs keeps 64 characters of it, its maximum rounded up
    table = _table_of_files(tmp_path / "t", [["a1", "a9"], ["m1", long], ["y1", "y9"]])
    actions = delta_io.live_files(table)
    assert max(len(m) for m in actions.column("max.k").to_pylist()) < len(long)

    kept = delta_io.files_holding(actions, KeySet("k", ["b", long]))
    assert [f["min.k"] for f in kept] == ["m1"]


def test_touched_keys_are_distinct_sorted_and_refused_over_the_limit(spark):
    rows = spark.createDataFrame([(3, "a"), (1, "b"), (3, "c"), (None, "d")], "k bigint, v string")
    assert delta_io.touched_keys(rows, ["k"]) == KeySet("k", [1, 3])
    assert delta_io.touched_keys(rows, ["k"], limit=1) is None
    # A known count of at most the listed keys: collected in one job, the same keys.
    assert delta_io.touched_keys(rows, ["k"], at_most=4) == KeySet("k", [1, 3])
    assert delta_io.touched_keys(rows, ["k"], limit=1, at_most=4) is None
    assert delta_io.touched_keys(rows.limit(0), ["k"], at_most=0) == KeySet("k", [])
    # More than `listed` keys: only their range, no list collected to the driver.
    assert delta_io.touched_keys(rows, ["k"], listed=1) == KeySet("k", [1, 3], spans=True)
    nothing = rows.filter("k IS NULL")
    assert delta_io.touched_keys(nothing, ["k"]) == KeySet("k", [])
    stamped = spark.createDataFrame([(1.5,)], "k double")
    assert delta_io.touched_keys(stamped, ["k"]) is None
