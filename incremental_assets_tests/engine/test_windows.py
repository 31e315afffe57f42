"""Window planning, without Spark: which part of the source a run reads."""

from __future__ import annotations

from datetime import timedelta

from incremental_assets.engine.windows import LoadRequest, WindowPolicy, plan_window
from incremental_assets_tests.builders import at

TS = WindowPolicy(
    kind="timestamp",
    lookback=timedelta(hours=2),
    settle_lag=timedelta(0),
    partitions_cut_watermark=True,
    history_start=at(1),
)
IDS = WindowPolicy(
    kind="id",
    lookback=0,
    settle_lag=timedelta(0),
    partitions_cut_watermark=False,
    history_start=at(1),
)


def request(first: int, last: int | None = None, backfill: bool = False) -> LoadRequest:
    return LoadRequest(at(first), at((last or first) + 1), backfill=backfill)


def test_first_load_starts_at_history_start_and_stops_at_partition_end():
    window = plan_window(TS, None, request(3), source_clock=at(20)).with_high_water(at(3, 23))
    assert window.mode == "incremental"
    assert window.lower < at(1) <= window.lower + timedelta(microseconds=1)
    assert window.cap == at(4)
    assert window.cursor_after == at(3, 23)


def test_incremental_run_reads_from_cursor_minus_lookback():
    window = plan_window(TS, at(2, 22), request(3), source_clock=at(20))
    window = window.with_high_water(at(3, 10))
    assert (window.lower, window.upper) == (at(2, 20), at(3, 10))
    assert window.backfill_range is None
    assert window.cursor_after == at(3, 10)


def test_no_new_rows_and_no_lookback_is_an_empty_window():
    policy = WindowPolicy("timestamp", timedelta(0), timedelta(0), True, at(1))
    window = plan_window(policy, at(3, 5), request(3), source_clock=at(20)).with_high_water(None)
    assert window.is_empty
    assert window.cursor_after == at(3, 5)


def test_partition_behind_cursor_is_reread_whole_without_moving_cursor():
    window = plan_window(TS, at(5, 12), request(2), source_clock=at(20)).with_high_water(None)
    assert window.mode == "backfill"
    assert window.backfill_range == (at(2), at(3))
    assert not window.reads_incremental
    assert window.cursor_after == at(5, 12)


def test_range_reaching_past_cursor_backfills_and_advances():
    window = plan_window(TS, at(3, 12), request(1, 4, backfill=True), source_clock=at(20))
    window = window.with_high_water(at(4, 18))
    assert window.mode == "backfill+incremental"
    assert window.backfill_range == (at(1), at(5))
    assert window.cap == at(5)
    assert window.cursor_after == at(4, 18)


def test_cursor_never_moves_backwards_when_source_max_drops():
    window = plan_window(TS, at(3, 12), request(3), source_clock=at(20)).with_high_water(at(3, 1))
    assert window.cursor_after == at(3, 12)


def test_settle_lag_caps_high_water_behind_source_clock():
    policy = WindowPolicy("timestamp", timedelta(0), timedelta(minutes=10), True, at(1))
    window = plan_window(policy, at(3, 1), request(3), source_clock=at(3, 12))
    assert window.cap is not None
    assert at(3, 11, 50) < window.cap <= at(3, 11, 50) + timedelta(microseconds=1)


def test_id_watermark_frontier_is_not_capped_by_partition_end():
    window = plan_window(IDS, 100, request(3), source_clock=at(20), partition_high_water=at(2, 23))
    window = window.with_high_water(250)
    assert window.mode == "incremental"
    assert window.cap is None
    assert (window.lower, window.upper, window.cursor_after) == (100, 250, 250)


def test_id_watermark_partition_behind_loaded_event_times_is_backfilled():
    window = plan_window(IDS, 900, request(2), source_clock=at(20), partition_high_water=at(6))
    assert window.mode == "backfill"
    assert window.backfill_range == (at(2), at(3))
    assert window.with_high_water(None).cursor_after == 900
