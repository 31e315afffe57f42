"""Two runs of one table at once: one commits, the other fails with a clear error and
commits nothing (its merge read a snapshot the first one replaced). A table written here
reads the same through Spark's Delta Lake and through delta-rs."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from deltalake import DeltaTable

from incremental_assets.engine import ConcurrentLoadError, DeltaTarget, run_load
from incremental_assets_tests.builders import at, day_request, make_spec, target_rows


def test_of_two_overlapping_runs_one_commits_and_the_other_fails_cleanly(
    spark, orders_source, target
):
    orders_source.upsert([(1, "new", 1.0, at(1, 1)), (2, "new", 2.0, at(1, 2))])
    spec = make_spec(orders_source.path)
    run_load(spark, spec, target, day_request(1))
    orders_source.upsert([(1, "paid", 1.5, at(2, 1)), (3, "new", 3.0, at(2, 2))])
    before = DeltaTable(target.path).version()
    other: list = []

    def the_other_run_commits_meanwhile(phase: str) -> None:
        if phase == "staged":
            other.append(run_load(spark, spec, target, day_request(2)))

    with pytest.raises(ConcurrentLoadError, match="another writer committed to") as caught:
        run_load(spark, spec, target, day_request(2), hook=the_other_run_commits_meanwhile)

    assert "nothing from this run was committed" in str(caught.value)
    assert DeltaTable(target.path).version() == before + 1  # only the other run's commit
    assert other[0].rows_inserted == 1 and other[0].rows_updated == 1
    assert target_rows(target) == [
        (1, "paid", 1.5, at(2, 1)),
        (2, "new", 2.0, at(1, 2)),
        (3, "new", 3.0, at(2, 2)),
    ]
    again = run_load(spark, spec, target, day_request(2))
    assert again.rows_extracted == 0  # the cursor moved once, with the other run's data


@pytest.mark.parametrize(
    "strategy", ["append", "upsert", {"kind": "scd2", "tracked": ["status"]}], ids=str
)
def test_spark_delta_and_delta_rs_read_the_same_rows(spark, orders_source, tmp_path, strategy):
    orders_source.upsert([(1, "new", 1.0, at(1, 1)), (2, "new", 2.0, at(1, 2))])
    spec = make_spec(orders_source.path, strategy=strategy)
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    run_load(spark, spec, target, day_request(1))
    orders_source.upsert([(1, "paid", 1.5, at(2, 1)), (3, "new", 3.0, at(2, 2))])
    run_load(spark, spec, target, day_request(2))

    by_spark = spark.read.format("delta").load(target.path)
    by_delta_rs = DeltaTable(target.path).to_pyarrow_table()

    columns = sorted(by_delta_rs.column_names)
    assert sorted(by_spark.columns) == columns
    spark_rows = sorted(tuple(_utc(r[c]) for c in columns) for r in by_spark.collect())
    rs_rows = sorted(tuple(_utc(r[c]) for c in columns) for r in by_delta_rs.to_pylist())
    assert len(spark_rows) >= 3
    assert spark_rows == rs_rows


def _utc(value: object) -> object:
    """PySpark gives timestamps as naive local times (the process runs in UTC here),
    delta-rs as aware ones: compare both as aware UTC instants; None sorts first."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return ("t", aware.astimezone(timezone.utc))
    return ("-", "") if value is None else ("v", value)
