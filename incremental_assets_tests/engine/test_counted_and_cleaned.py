"""Nothing is silent or left behind: watermark values no window can reach are counted and
checked, and a run's staging folder is gone after it fails (or, if its process was
killed, after the table's next run)."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone

import pytest

from incremental_assets.dagster_layer.checks import WATERMARK_IN_RANGE, check_specs
from incremental_assets.engine import IncrementalLoadError, run_load
from incremental_assets.engine.checks import watermark_in_range
from incremental_assets_tests.builders import at, day_request, make_spec, target_rows

UTC = timezone.utc
ANCIENT = datetime(1700, 3, 1, tzinfo=UTC)
FAR_FUTURE = datetime(9999, 12, 31, tzinfo=UTC)


def test_watermarks_before_the_start_or_far_in_the_future_are_counted_and_fail_a_check(
    spark, orders_source, target
):
    orders_source.upsert(
        [(1, "new", 1.0, ANCIENT), (2, "new", 2.0, at(1, 1)), (3, "new", 3.0, FAR_FUTURE)]
    )
    spec = make_spec(orders_source.path)

    result = run_load(spark, spec, target, day_request(1))

    assert [r[0] for r in target_rows(target)] == [2]
    found = result.out_of_range
    assert found is not None
    assert (found.before_start, found.in_future) == (1, 1)
    assert (found.earliest, found.latest) == (ANCIENT, FAR_FUTURE)
    outcome = watermark_in_range(result)
    assert not outcome.passed
    assert "1 rows have a watermark before partitioning.start (2026-01-01" in outcome.description
    assert "move partitioning.start to 1700-03-01 or earlier" in outcome.description
    assert "more than a day ahead of the source clock" in outcome.description
    commit = target.loads(limit=1)[0]
    assert (commit["rows_before_start"], commit["rows_in_future"]) == (1, 1)
    assert WATERMARK_IN_RANGE in {c.name for c in check_specs(spec)}


def test_watermarks_in_range_pass_the_check(spark, orders_source, target):
    orders_source.upsert([(1, "new", 1.0, at(1, 1))])

    result = run_load(spark, make_spec(orders_source.path), target, day_request(1))

    assert watermark_in_range(result).passed
    assert result.out_of_range is not None and result.out_of_range.total == 0


def test_a_failed_run_leaves_no_staging_folder(spark, orders_source, target, tmp_path):
    orders_source.upsert([(1, "new", -1.0, at(1, 1))])
    spec = make_spec(
        orders_source.path,
        quality={"rules": [{"name": "positive", "check": "amount > 0", "action": "fail"}]},
    )
    staging = tmp_path / "staging"
    staging.mkdir()

    with pytest.raises(IncrementalLoadError, match="positive: 1 rows"):
        run_load(spark, spec, target, day_request(1), staging_dir=str(staging))

    assert list(staging.iterdir()) == []
    assert not target.exists()


def test_a_killed_runs_staging_folder_is_removed_by_the_next_run(
    spark, orders_source, target, tmp_path
):
    staging = tmp_path / "staging"
    ended = subprocess.Popen(["true"])  # its pid stands for a run that was killed
    ended.wait()
    orphan = staging / f"ia-orders-{ended.pid}-abc123" / "increment"
    orphan.mkdir(parents=True)
    (orphan / "part-0.parquet").write_bytes(b"left by a SIGKILLed run")
    other_table = staging / f"ia-orders_2-{ended.pid}-def456"
    other_table.mkdir()
    orders_source.upsert([(1, "new", 1.0, at(1, 1))])

    run_load(spark, make_spec(orders_source.path), target, day_request(1), staging_dir=str(staging))

    assert sorted(p.name for p in staging.iterdir()) == [other_table.name]
