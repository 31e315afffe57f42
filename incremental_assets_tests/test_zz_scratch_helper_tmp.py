from incremental_assets_tests.test_landing_layers import (
    test_lines_that_vanish_from_a_rewritten_file_leave_silver_and_gold as vanish,
)


def test_vanish_with_empty_commits_recorded(spark, tmp_path):
    spark.conf.set("spark.databricks.delta.skipRecordingEmptyCommits", "false")
    try:
        vanish(spark, tmp_path)
    finally:
        spark.conf.unset("spark.databricks.delta.skipRecordingEmptyCommits")
