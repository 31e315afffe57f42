"""Reading only the Delta files that may hold a run's keys (history tables' log and target)."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.io import KeySet
from incremental_assets.engine.predicates import Range
from incremental_assets.engine.staging import write_counted
from incremental_assets_tests.builders import jobs_in


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


def test_a_range_is_narrowed_to_the_files_that_hold_one_of_the_keys(spark, tmp_path):
    # Files 1-100, 101-200, 201-300 and 301-400; keys 150, 160 and 350 (and 500, in no
    # file): their range 150..500 covers the last three files, of which 201-300 holds none.
    table = _table_of_files(tmp_path / "t", [list(range(a, a + 100)) for a in (1, 101, 201, 301)])
    rows = spark.createDataFrame([(150,), (160,), (350,), (500,)], "k bigint")
    spanned = KeySet("k", [150, 500], spans=True)
    actions = delta_io.live_files(table)

    narrowed = delta_io.within_files(rows, spanned, actions)

    # The two files' ranges, each clipped to the keys' own range.
    assert narrowed == KeySet("k", [150, 200, 301, 400], spans=True)
    assert _file_keys(delta_io.files_holding(actions, narrowed)) == [
        (101, 200),
        (301, 400),
    ]
    assert delta_io.may_hold_sql(narrowed, alias="t") == (
        "(t.`k` BETWEEN 150 AND 200 OR t.`k` BETWEEN 301 AND 400)"
    )
    # Keys in no file: no file to count.
    assert delta_io.within_files(rows.filter("k > 400"), spanned, actions) == KeySet(
        "k", [], spans=True
    )
    # A range covering one file, or more files than are looked at: as it is, no Spark job.
    one_file = KeySet("k", [150, 160], spans=True)
    kept, jobs = jobs_in(
        spark,
        "within_files",
        lambda: (
            delta_io.within_files(rows, one_file, actions),
            delta_io.within_files(rows, spanned, actions, most_files=2),
        ),
    )
    assert (kept, jobs) == ((one_file, spanned), 0)


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


def test_a_key_range_counted_as_rows_are_written_stands_in_for_the_range_job(spark, tmp_path):
    rows = spark.range(5, 3005).selectExpr(
        "id AS k",
        "CAST(id AS string) AS s",
        "date_add(DATE'2026-01-01', CAST(id % 40 AS int)) AS d",
        "timestamp'2026-01-01 00:00:00' AS t",
    )
    counters = [
        *delta_io.range_counters(rows.schema, "k"),
    ]
    counted = write_counted(rows, str(tmp_path / "k"), *counters)
    keys = delta_io.KeyRange.counted("k", counted)
    assert (keys.column, keys.low, keys.high) == ("k", 5, 3004)
    # An estimate (HyperLogLog, 5% relative standard deviation): within three of them.
    assert abs(keys.values - 3000) <= 3000 * 0.15
    staged = spark.read.parquet(str(tmp_path / "k"))
    # More keys than are listed: their range, with no Spark job at all.
    found, jobs = jobs_in(
        spark, "counted", lambda: delta_io.touched_keys(staged, ["k"], at_most=3000, counted=keys)
    )
    assert found == KeySet("k", [5, 3004], spans=True) == delta_io.touched_keys(staged, ["k"])
    assert jobs == 0
    _, jobs = jobs_in(
        spark, "uncounted", lambda: delta_io.touched_keys(staged, ["k"], at_most=3000)
    )
    assert jobs >= 1
    # A range counted for another column is not taken for this one.
    assert delta_io.KeyRange.counted("s", counted) is None
    # Dates and texts are counted as they are; a timestamp has no reliable statistics.
    for column, low, high in (("s", "10", "999"), ("d", date(2026, 1, 1), date(2026, 2, 9))):
        written = write_counted(
            rows, str(tmp_path / column), *delta_io.range_counters(rows.schema, column)
        )
        assert delta_io.KeyRange.counted(column, written) == delta_io.KeyRange(
            column, low, high, written["key_range:values"]
        )
    assert delta_io.range_counters(rows.schema, "t") == []
    assert delta_io.range_counters(rows.schema, "absent") == []


def test_a_counted_range_of_few_keys_still_lists_them(spark, tmp_path):
    rows = spark.createDataFrame([(3, "a"), (1, "b"), (3, "c"), (None, "d")], "k bigint, v string")
    few = delta_io.KeyRange("k", 1, 3, 2)
    assert delta_io.touched_keys(rows, ["k"], counted=few) == KeySet("k", [1, 3])
    # No key at all (every one null), as a write counts it: nothing is touched.
    nulls = rows.filter("k IS NULL")
    written = write_counted(
        nulls, str(tmp_path / "nulls"), *delta_io.range_counters(nulls.schema, "k")
    )
    assert delta_io.KeyRange.counted("k", written) == delta_io.KeyRange("k", None, None, 0)
    assert delta_io.touched_keys(nulls, ["k"], counted=delta_io.KeyRange.counted("k", written)) == (
        KeySet("k", [])
    )


def test_bytes_holding_sums_the_files_a_merge_of_the_keys_may_rewrite(tmp_path):
    table = _table_of_files(tmp_path / "t", [[1, 50, 100], [101, 200], [201, 300]])
    sizes = {
        (f["min.k"], f["max.k"]): f["size_bytes"] for f in delta_io.live_files(table).to_pylist()
    }

    assert delta_io.bytes_holding(table, KeySet("k", [120, 150])) == sizes[(101, 200)]
    assert delta_io.bytes_holding(table, KeySet("k", [400])) == 0
    assert delta_io.bytes_holding(table, None) == sum(sizes.values())


def test_a_table_holds_rows_above_a_cursor_by_its_statistics_to_the_millisecond(tmp_path):
    def table_of(path, stamps) -> DeltaTable:
        kind = pa.timestamp("us", tz="UTC")
        write_deltalake(
            str(path), pa.table({"k": range(len(stamps)), "ts": pa.array(stamps, kind)})
        )
        return DeltaTable(str(path))

    def moment(ms: int, us: int = 0) -> datetime:
        return datetime(2026, 1, 1, 10, tzinfo=timezone.utc) + timedelta(
            milliseconds=ms, microseconds=us
        )

    table = table_of(tmp_path / "a", [moment(0), moment(5, 700)])
    assert delta_io.holds_above(table, "ts", moment(4))
    assert not delta_io.holds_above(table, "ts", moment(6))
    # Statistics keep 10:00:00.005 of 10:00:00.005700: a cursor inside that millisecond
    # cannot tell, so rows counted as surely newer begin at the next millisecond.
    assert not delta_io.holds_above(table, "ts", moment(5, 300))
    assert delta_io.above_bound(moment(5, 300)) == (moment(6), True)
    assert delta_io.above_bound(41) == (41, False)
    # A row without a watermark is not replaced by a newer row: the table may hold one.
    assert delta_io.holds_above(table_of(tmp_path / "b", [moment(0), None]), "ts", moment(6))
    assert delta_io.holds_above(None, "ts", moment(6))


def test_a_file_lies_within_a_window_by_its_statistics_and_a_sentinel_is_not_known_to():
    utc = timezone.utc
    window = [(Range("t", datetime(2026, 1, 1, tzinfo=utc), False, None, False),)]
    inside = {"min.t": datetime(2026, 1, 2, tzinfo=utc), "max.t": datetime(2026, 1, 3, tzinfo=utc)}
    across = {"min.t": datetime(2025, 12, 31, tzinfo=utc), "max.t": inside["max.t"]}
    # Every row at the end of the calendar: the millisecond of slack would overflow.
    sentinel = {
        "min.t": datetime.max.replace(tzinfo=utc),
        "max.t": datetime.max.replace(tzinfo=utc),
    }

    assert delta_io.file_within(inside, window)
    assert not delta_io.file_within(across, window)
    assert not delta_io.file_within({"max.t": inside["max.t"]}, window)  # no lowest value
    assert not delta_io.file_within(sentinel, window)
