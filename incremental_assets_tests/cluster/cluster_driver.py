"""A driver on the standalone cluster, run as a subprocess by test_standalone.py (a
classic SparkContext can exist only once in a process, and the tests' own is local):

    python -m incremental_assets_tests.cluster.cluster_driver MASTER S3_ENDPOINT BUCKET

It writes and MERGEs a Delta table on S3 and reads it back, asks every executor which
worker's /tmp it sees and which Python runs it, then writes Parquet to a folder in the
driver's /tmp and reads it back. Prints one JSON line of what happened."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile

from incremental_assets.engine.spark import connectors
from incremental_assets.engine.spark_session import spark_conf, start_session
from incremental_assets_tests.servers import WORKER_MARK, cluster_app_conf, s3_spark_conf


def _worker_and_python(_: int) -> tuple[str, str]:
    import sys

    with open(WORKER_MARK) as mark:
        return mark.read(), sys.executable


def main(master: str, endpoint: str, bucket: str) -> dict:
    conf = spark_conf(
        {
            "spark.master": master,
            **cluster_app_conf(),
            # Each executor downloads the jars once into its work folder, not also into a
            # fetch cache beside it (the AWS SDK alone is 640 MB).
            "spark.files.useFetchCache": "false",
            **s3_spark_conf(endpoint),
        }
    )
    spark = start_session(conf, "incremental-assets-cluster-test")
    # The AWS SDK's bundle, as Spark's resolver or Maven names it (the cache holds either).
    bundle = connectors.CONNECTORS["s3"].class_path_jars
    shipped = [j.rsplit("/", 1)[-1] for j in spark.conf.get("spark.jars", "").split(",")]
    out: dict = {"jars_shipped": any(bundle.match(name) for name in shipped)}

    path = f"s3a://{bucket}/orders"
    first = spark.createDataFrame([(1, "new"), (2, "new"), (3, "new")], "id BIGINT, status STRING")
    first.repartition(2).write.format("delta").save(path)
    changes = spark.createDataFrame([(2, "shipped"), (4, "new")], "id BIGINT, status STRING")
    changes.createOrReplaceTempView("changes")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING changes s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    rows = spark.read.format("delta").load(path).orderBy("id").collect()
    out["rows"] = [[r.id, r.status] for r in rows]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    out["operations"] = [r.operation for r in history]

    seen = spark.sparkContext.parallelize(range(8), 8).map(_worker_and_python).distinct()
    out["executors"] = sorted(set(seen.collect()))

    # A folder only the driver has: the executors write into their own /tmp.
    local = tempfile.mkdtemp(prefix="driver-only-", dir="/tmp")
    out["local_dir"] = local
    spark.range(10).write.parquet(f"file://{local}/numbers")
    try:
        out["local_rows"] = spark.read.parquet(f"file://{local}/numbers").count()
    except Exception as exc:  # what a user sees: Spark's own error
        out["local_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    shutil.rmtree(local)
    spark.stop()
    return out


if __name__ == "__main__":
    sys.stdout.write("RESULT " + json.dumps(main(*sys.argv[1:4])) + "\n")
