"""Late commits of a Delta source: rows appended below the cursor after the run that passed
their range are read by the next run from the files those commits added (the source's log
since the version the last load read), never by scanning the table; rewrites are read
from the change data feed, or reported when the source has none."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget, run_load
from incremental_assets.engine.errors import UnreadableLogError
from incremental_assets.engine.late_files import pending
from incremental_assets_tests.builders import (
    at,
    day_request,
    load,
    make_spec,
    order_rows,
    target_rows,
)
from incremental_assets_tests.servers import s3_options

SCHEMA = "order_id long, status string, amount double, updated_at timestamp"


def create(spark, path: str, **properties: str) -> str:
    props = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
    spark.sql(
        f"CREATE TABLE delta.`{path}` ({SCHEMA}) USING delta"
        + (f" TBLPROPERTIES ({props})" if props else "")
    )
    return path


def append(spark, path: str, *orders: tuple) -> None:
    rows = order_rows(list(orders)).to_pylist()
    spark.createDataFrame(rows, schema=SCHEMA).coalesce(1).write.format("delta").mode(
        "append"
    ).save(path)


def source_rows(path: str) -> list[tuple]:
    return target_rows(DeltaTarget("source", path))


def loaded_two_days(spark, tmp_path, **properties):
    source = create(spark, str(tmp_path / "source"), **properties)
    spec = make_spec(source)
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    append(spark, source, (1, "new", 1.0, at(1, 1)), (2, "new", 2.0, at(1, 2)))
    load(spark, spec, target, 1)
    append(spark, source, (3, "new", 3.0, at(2, 1)))
    return source, spec, target, load(spark, spec, target, 2)


def test_rows_appended_below_the_cursor_are_loaded_by_the_next_run(spark, tmp_path):
    source, spec, target, day2 = loaded_two_days(spark, tmp_path)
    # A normal run: its new file holds rows above the cursor only, so none is late.
    assert (day2.files_late, day2.rows_late, day2.late_unchecked) == (0, 0, "")
    assert "new file" not in day2.window  # its statistics say so: the file is not re-read

    # Day 1's stragglers commit after day 2 was loaded: a new key, a later change of
    # order 2, and a change of order 1 older than the one the target holds.
    append(
        spark,
        source,
        (4, "new", 4.0, at(1, 5)),
        (2, "paid", 2.5, at(1, 6)),
        (1, "stale", 0.0, at(1, 0, 30)),
    )
    waiting = pending(spark, spec, target)
    assert (waiting.rows, waiting.partitions, len(waiting.files)) == (3, ("2026-01-01",), 1)

    result = load(spark, spec, target, 2)

    assert (result.files_late, result.rows_late) == (1, 3)
    assert "watermark <= 2026-01-02T01:00:00" in result.window
    assert target_rows(target) == [
        (1, "new", 1.0, at(1, 1)),
        (2, "paid", 2.5, at(1, 6)),
        (3, "new", 3.0, at(2, 1)),
        (4, "new", 4.0, at(1, 5)),
    ]
    assert pending(spark, spec, target).rows == 0
    again = load(spark, spec, target, 2)
    assert (again.files_late, again.rows_late) == (0, 0)


def test_compaction_makes_nothing_late_and_keeps_what_was_appended(spark, tmp_path):
    source, spec, target, _ = loaded_two_days(spark, tmp_path)
    spark.sql(f"OPTIMIZE delta.`{source}`")  # rewrites every file, no data change
    assert load(spark, spec, target, 2).files_late == 0

    append(spark, source, (5, "new", 5.0, at(1, 3)))
    append(spark, source, (6, "new", 6.0, at(1, 4)))
    spark.sql(f"OPTIMIZE delta.`{source}`")  # the late files are compacted before the run
    result = load(spark, spec, target, 2)

    assert (result.files_late, result.rows_late, result.late_unchecked) == (2, 2, "")
    assert target_rows(target) == source_rows(source)


def test_deletion_vectors_and_mapped_columns_are_honoured_in_late_files(spark, tmp_path):
    features = {"delta.enableDeletionVectors": "true", "delta.columnMapping.mode": "name"}
    source, spec, target, _ = loaded_two_days(spark, tmp_path, **features)
    append(spark, source, (7, "new", 7.0, at(1, 3)), (8, "new", 8.0, at(1, 4)))
    spark.sql(f"DELETE FROM delta.`{source}` WHERE order_id = 8")  # a deletion vector
    spark.sql(f"ALTER TABLE delta.`{source}` RENAME COLUMN amount TO total")
    spark.sql(f"ALTER TABLE delta.`{source}` RENAME COLUMN total TO amount")
    assert "deletionVectors" in DeltaTable(source).protocol().reader_features

    result = load(spark, spec, target, 2)

    assert (result.files_late, result.rows_late) == (1, 1)
    assert [r[0] for r in target_rows(target)] == [1, 2, 3, 7]


def test_a_rewrite_is_reported_without_a_change_feed_and_read_with_one(spark, tmp_path):
    plain, spec, target, _ = loaded_two_days(spark, tmp_path / "plain")
    # An UPDATE that back-dates a change (a correction stamped with its business time).
    spark.sql(
        f"UPDATE delta.`{plain}` SET status = 'fixed', updated_at = TIMESTAMP "
        "'2026-01-01 07:00:00' WHERE order_id = 1"
    )
    version = DeltaTable(plain).version()
    result = load(spark, spec, target, 2)
    assert (result.files_late, result.rows_late) == (0, 0)
    assert str(version) in result.late_unchecked
    assert "fixed" not in [r[1] for r in target_rows(target)]
    # Reported by every run until a load commits past it (nothing here to load).
    assert pending(spark, spec, target).ledger.unchecked == (version,)

    fed, spec, target, _ = loaded_two_days(
        spark, tmp_path / "fed", **{"delta.enableChangeDataFeed": "true"}
    )
    spark.sql(
        f"UPDATE delta.`{fed}` SET status = 'fixed', updated_at = TIMESTAMP "
        "'2026-01-01 07:00:00' WHERE order_id = 1"
    )
    assert pending(spark, spec, target).rows == 1
    result = load(spark, spec, target, 2)
    assert (result.files_late, result.rows_late, result.late_unchecked) == (1, 1, "")
    assert target_rows(target) == source_rows(fed)


def test_versions_gone_from_the_source_log_are_reported_not_skipped_silently(spark, tmp_path):
    source, spec, target, _ = loaded_two_days(spark, tmp_path, **{"delta.checkpointInterval": "2"})
    loaded = DeltaTable(source).version()
    for n in range(3):
        append(spark, source, (10 + n, "new", 1.0, at(2, 3 + n)))
    # Log retention removed the commit files since the last load (a checkpoint remains).
    for version in range(loaded + 1, loaded + 3):
        (Path(source) / "_delta_log" / f"{version:020d}.json").unlink()

    result = load(spark, spec, target, 2)

    assert "no longer holds every version" in result.late_unchecked
    assert [r[0] for r in target_rows(target)] == [1, 2, 3, 10, 11, 12]
    assert load(spark, spec, target, 2).late_unchecked == ""  # recorded past the gap


@pytest.mark.parametrize("commits", [1, 4])
def test_a_source_dropped_and_created_again_is_read_whole_by_the_next_run(spark, tmp_path, commits):
    """A new table at the source's path shares no versions with the old one, whether its
    versions are below the one the last load read (1 commit) or past it (4): its rows at
    or below the cursor are read, not assumed covered by the old table's versions."""
    source, spec, target, _ = loaded_two_days(spark, tmp_path)
    read_before = target.state("timestamp").last_load["source_version"]
    shutil.rmtree(source)
    create(spark, source)
    append(spark, source, (4, "new", 4.0, at(1, 3)))  # below the cursor
    for n in range(commits - 1):
        append(spark, source, (10 + n, "new", 1.0, at(1, 4 + n)))
    append(spark, source, (5, "new", 5.0, at(2, 5)))  # above it
    assert (DeltaTable(source).version() > read_before) == (commits > 1)
    assert pending(spark, spec, target).rows == commits

    replaced = load(spark, spec, target, 2)

    assert (replaced.files_late, replaced.rows_late) == (commits, commits)
    assert {4, 5} <= {r[0] for r in target_rows(target)}
    # The ledger goes on from the new table's version: a late append is read next time.
    append(spark, source, (6, "new", 6.0, at(1, 7)))
    result = load(spark, spec, target, 2)
    assert (result.files_late, result.rows_late) == (1, 1)
    assert pending(spark, spec, target).rows == 0


def test_a_late_commit_of_a_source_on_s3_is_found_in_its_log_there(spark, s3, tmp_path):
    # The source's log is read where the source lives, with its storage options.
    bucket = f"src-{uuid.uuid4().hex[:10]}"
    s3.create(bucket)
    source, through_spark = f"s3://{bucket}/orders", f"s3a://{bucket}/orders"
    create(spark, through_spark)
    spec = make_spec(source)
    target = DeltaTarget("orders", str(tmp_path / "orders"))
    storage = s3_options(s3.endpoint)

    def run(day: int):
        return run_load(spark, spec, target, day_request(day), source_storage=storage)

    append(spark, through_spark, (1, "new", 1.0, at(1, 1)), (2, "new", 2.0, at(1, 2)))
    run(1)
    append(spark, through_spark, (3, "new", 3.0, at(2, 1)))
    run(2)
    append(spark, through_spark, (4, "new", 4.0, at(1, 5)))  # day 1's, after day 2's load

    result = run(2)

    assert (result.files_late, result.rows_late) == (1, 1)
    assert [r[0] for r in target_rows(target)] == [1, 2, 3, 4]


def test_a_commit_file_that_is_not_json_fails_the_run_naming_it(spark, tmp_path):
    # A checkpoint past it, so opening the source never parses it: the ledger's read of
    # the commits since the last load does, and names the file; nothing is written.
    source, spec, target, _ = loaded_two_days(spark, tmp_path, **{"delta.checkpointInterval": "2"})
    loaded = DeltaTable(source).version()
    for n in range(3):
        append(spark, source, (10 + n, "new", 1.0, at(2, 3 + n)))
    broken = Path(source) / "_delta_log" / f"{loaded + 1:020d}.json"
    broken.write_text("not json\n")
    before = DeltaTable(target.path).version()

    with pytest.raises(UnreadableLogError, match=broken.name) as refused:
        load(spark, spec, target, 2)

    assert "restore that file" in str(refused.value)
    assert DeltaTable(target.path).version() == before
