"""The tests' local Spark session reaches S3 (moto's server) through s3a with settings
fixed at its start and credentials from the environment: a Delta table written to
``s3a://`` is merged and read back, ``s3://`` paths are the same table, and delta-rs reads
its log with the warehouse's storage options."""

from __future__ import annotations

import uuid

from deltalake import DeltaTable

from incremental_assets_tests.servers import s3_options


def _bucket(s3) -> str:
    name = f"lake-{uuid.uuid4().hex[:10]}"
    s3.create(name)
    return name


def test_a_delta_table_on_s3a_is_merged_and_read_back(spark, s3):
    path = f"s3a://{_bucket(s3)}/orders"
    spark.createDataFrame([(1, "new"), (2, "new")], "id BIGINT, status STRING").write.format(
        "delta"
    ).save(path)
    changes = spark.createDataFrame([(2, "shipped"), (3, "new")], "id BIGINT, status STRING")
    changes.createOrReplaceTempView("s3a_changes")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING s3a_changes s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )

    rows = spark.read.format("delta").load(path).orderBy("id").collect()

    assert [(r.id, r.status) for r in rows] == [(1, "new"), (2, "shipped"), (3, "new")]
    bucket = path.split("/")[2]
    assert "orders/_delta_log/00000000000000000001.json" in s3.keys(bucket)


def test_s3_paths_are_read_and_written_through_s3a(spark, s3):
    bucket = _bucket(s3)
    spark.range(3).write.format("delta").save(f"s3://{bucket}/numbers")
    spark.range(3, 5).write.format("delta").mode("append").save(f"s3a://{bucket}/numbers")

    # One table, whichever the scheme: s3:// is mapped to S3A (fs.s3.impl).
    assert spark.read.format("delta").load(f"s3://{bucket}/numbers").count() == 5
    assert spark.read.format("delta").load(f"s3a://{bucket}/numbers").count() == 5


def test_delta_rs_reads_the_log_spark_wrote_with_the_warehouse_storage_options(spark, s3):
    bucket = _bucket(s3)
    spark.range(4).write.format("delta").save(f"s3a://{bucket}/numbers")
    spark.sql(f"DELETE FROM delta.`s3a://{bucket}/numbers` WHERE id = 0")

    table = DeltaTable(f"s3://{bucket}/numbers", storage_options=s3_options(s3.endpoint))

    assert table.version() == 1
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == [1, 2, 3]
