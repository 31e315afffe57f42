"""Nothing is silent or left behind: watermark values no window can reach are counted and
checked, and a run's staging folder (on the warehouse, never in the driver's temp folder)
is gone after it fails (or, if its process was killed, after the table's next run)."""

from __future__ import annotations

import tempfile
import uuid
from datetime import datetime, timezone

import pytest

from incremental_assets.dagster_layer.checks import WATERMARK_IN_RANGE, check_specs
from incremental_assets.engine import IncrementalLoadError, run_load
from incremental_assets.engine.checks import watermark_in_range
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import NullValuesError
from incremental_assets.engine.guards import out_of_range, probe_source
from incremental_assets.engine.predicates import Range
from incremental_assets.engine.sources import source_class
from incremental_assets_tests.builders import (
    ParquetFolder,
    at,
    day_request,
    make_spec,
    order_rows,
    staging_left,
    target_rows,
)
from incremental_assets_tests.servers import s3_options

UTC = timezone.utc
ANCIENT = datetime(1700, 3, 1, tzinfo=UTC)
FAR_FUTURE = datetime(9999, 12, 31, tzinfo=UTC)
QUARANTINE_NEGATIVE = {"name": "positive", "check": "amount > 0", "action": "quarantine"}


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


def test_one_scan_finds_the_high_water_mark_and_the_rows_out_of_range_as_two_would(
    spark, orders_source
):
    # The probe takes both from one filtered aggregation (one Spark job, not two): it must
    # give what each gives alone, with rows on every side of the probe part.
    orders_source.upsert(
        [
            (1, "x", 1.0, ANCIENT),
            (2, "x", 2.0, at(1, 1)),
            (3, "x", 3.0, at(2, 5)),
            (4, "x", 4.0, at(3, 7)),
            (5, "x", 5.0, FAR_FUTURE),
        ]
    )
    spec = make_spec(orders_source.path)
    source = source_class("orders", spec.source).open(spark, "orders", spec.source, {})
    start, clock = spec.partitioning.start, at(4)
    for lower, upper, high in [(at(1), at(3), at(2, 5)), (at(3, 8), at(4), None)]:
        part = (Range("updated_at", lower, False, upper, False),)

        together = probe_source(source, "updated_at", "UTC", (start, clock), (part, "timestamp"))

        alone = out_of_range(source, "updated_at", start, clock, "UTC")
        assert together[:2] == (alone, source.high_water(part, "timestamp"))
        assert together.high_water == high
        assert together.outside is not None
        assert (together.outside.before_start, together.outside.in_future) == (1, 1)
        # A Delta source's log statistics count its null watermarks: the scan does not,
        # and the run takes the count from the probe rather than reading them again.
        assert together.nulls == source.known_nulls("updated_at") == 0


def test_the_probes_scan_of_a_folder_counts_its_null_watermarks_as_count_nulls_would(
    spark, tmp_path, monkeypatch
):
    # A folder's null watermarks are known only from a scan: the probe's one scan counts
    # them, so the run refuses them (test_bad_sources_and_schemas.py) without a second job.
    folder = ParquetFolder(tmp_path / "files")
    folder.drop(order_rows([(1, "x", 1.0, at(1, 1)), (2, "x", 2.0, None), (3, "x", 3.0, None)]))
    folder.drop(order_rows([(4, "x", 4.0, at(2, 5)), (5, "x", 5.0, FAR_FUTURE)]))
    spec = make_spec(str(folder.path), source={"format": "parquet"})
    source = source_class("orders", spec.source).open(spark, "orders", spec.source, {})
    part = (Range("updated_at", at(1), False, at(3), False),)
    start, clock = spec.partitioning.start, at(4)
    assert source.count_nulls("updated_at") == 2
    calls: list[str] = []
    monkeypatch.setattr(type(source), "count_nulls", lambda self, c: calls.append(c) or 0)

    probed = probe_source(source, "updated_at", "UTC", (start, clock), (part, "timestamp"))

    assert probed.nulls == 2
    assert probed.high_water == at(2, 5)
    assert probed.outside is not None
    assert (probed.outside.before_start, probed.outside.in_future) == (0, 1)
    # A backfill's probe (no incremental part), a time watermark's or an id's, too.
    assert probe_source(source, "updated_at", "UTC", (start, clock), None)[1:] == (None, 2, None)
    assert probe_source(source, "updated_at", "UTC", None, None) == (None, None, 2, None)
    with pytest.raises(NullValuesError) as refused:
        run_load(spark, spec, DeltaTarget("orders", str(tmp_path / "target")), day_request(2))
    assert refused.value.counts == {"updated_at": 2}
    assert calls == []


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

    # The table's staging root under staging_dir, emptied by Spark: one empty file is all.
    assert [p.name for p in staging.iterdir()] == ["orders__staging"]
    assert staging_left(staging / "orders__staging") == []
    assert not target.exists()


def test_a_killed_runs_staging_folder_is_removed_by_the_next_run(
    spark, orders_source, target, tmp_path
):
    staging = tmp_path / "staging"
    orphan = staging / "orders__staging" / "3f2a9c0d41b7" / "increment"  # a SIGKILLed run's
    orphan.mkdir(parents=True)
    (orphan / "part-0.parquet").write_bytes(b"left by a SIGKILLed run")
    other_table = staging / "orders_2__staging" / "5e0c1d2b3a49"
    other_table.mkdir(parents=True)
    orders_source.upsert([(1, "new", 1.0, at(1, 1))])

    run_load(spark, make_spec(orders_source.path), target, day_request(1), staging_dir=str(staging))

    assert staging_left(staging / "orders__staging") == []
    assert other_table.is_dir()  # another table's staging root is not this run's


def test_a_run_on_an_s3_warehouse_writes_nothing_to_the_driver_temp_folder(
    spark, s3, orders_source, tmp_path, monkeypatch
):
    bucket = f"wh-{uuid.uuid4().hex[:10]}"
    s3.create(bucket)
    target = DeltaTarget("orders", f"s3://{bucket}/wh/orders", s3_options(s3.endpoint))
    driver_temp = tmp_path / "driver-temp"
    driver_temp.mkdir()
    # Python's temp folder for this run (Spark's own local folder, executor scratch space
    # for shuffles, is fixed at the session's start and may be used).
    monkeypatch.setenv("TMPDIR", str(driver_temp))
    monkeypatch.setattr(tempfile, "tempdir", str(driver_temp))
    orders_source.upsert([(1, "new", 1.0, at(1, 1)), (2, "new", 2.0, at(1, 2))])
    spec = make_spec(orders_source.path, quality={"rules": [QUARANTINE_NEGATIVE]})
    run_load(spark, spec, target, day_request(1))
    orders_source.upsert([(1, "paid", 1.5, at(2, 1)), (3, "new", -3.0, at(2, 2))])

    seen = {}

    def look(phase: str) -> None:  # mid-run, once the increment is staged
        if phase == "staged":
            keys = [k for k in s3.keys(bucket) if k.startswith("wh/orders__staging/")]
            seen["temp"] = list(driver_temp.iterdir())
            seen["increment"] = any("/increment/part-" in k for k in keys)

    result = run_load(spark, spec, target, day_request(2), hook=look)

    assert seen == {"temp": [], "increment": True}
    assert result.quality is not None and result.quality.rows_quarantined == 1
    assert (result.rows_inserted, result.rows_updated) == (0, 1)
    assert list(driver_temp.iterdir()) == []
    # Staged beside the target on the store, and emptied: one empty object is all.
    staged = [k for k in s3.keys(bucket) if k.startswith("wh/orders__staging/")]
    assert [s3.get(bucket, k) for k in staged if not k.endswith("/")] == [""]
    assert [r["order_id"] for r in spark.read.format("delta").load(target.spark_path).collect()]
