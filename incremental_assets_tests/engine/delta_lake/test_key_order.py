"""When a merge's rewrite is written in key order (engine/delta_lake/key_order.py)."""

from __future__ import annotations

import pytest

from incremental_assets.engine.delta_lake.key_order import ORDERED_FILES, ordered_rewrite


def test_a_rewrite_of_at_most_two_files_worth_of_rows_is_one_task_rolling_files_at_the_bound():
    settings = ordered_rewrite(ORDERED_FILES * 1_000, 1_000, partitioned=False)
    assert settings == {
        "spark.sql.shuffle.partitions": "1",
        "spark.sql.files.maxRecordsPerFile": "1000",
    }


@pytest.mark.parametrize(
    "rows, partitioned",
    [
        (1_000, False),  # they fit in a file: Delta's write, spread over the tasks
        (ORDERED_FILES * 1_000 + 1, False),  # too many rows for one task
        (None, False),  # a file without a row count: not known
        (10, True),  # Delta repartitions a partitioned table's output by its partitions
    ],
)
def test_a_small_large_unknown_or_partitioned_rewrite_is_left_to_delta(rows, partitioned):
    assert ordered_rewrite(rows, 1_000, partitioned=partitioned) == {}
