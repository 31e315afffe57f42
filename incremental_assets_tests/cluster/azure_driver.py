"""A driver that loads one upsert table twice into a warehouse on Azure Blob storage
(Azurite, the emulator) through hadoop-azure's wasb driver, run as a subprocess by
test_azure_warehouse.py in a network namespace of its own:

    python -m incremental_assets_tests.cluster.azure_driver FOLDER

wasb's and delta-rs's emulator modes both reach the emulator at its fixed address,
127.0.0.1:10000, which a namespace of its own keeps free of other test runs; Azurite is
started here, inside it. The Spark settings come from the tables file alone
(engine/spark/settings.py project_conf: ``use_emulator`` and an ``az://`` warehouse).
Prints one JSON line: each run's outcome, how the target compares with a full reload of
the source, the target's rows, and the blobs under the warehouse. (The quick JIT
compiler alone: a third less time for these few short jobs.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.reload import differences
from incremental_assets.engine.spark.settings import project_conf
from incremental_assets.engine.spark_session import start_session
from incremental_assets.specs import load_project
from incremental_assets_tests.builders import DeltaSourceTable, at, load
from incremental_assets_tests.object_stores import AZURITE_ACCOUNT, AzuriteServer
from incremental_assets_tests.servers import QUICK_JIT

CONTAINER = "lake"
WAREHOUSE = f"az://{CONTAINER}@{AZURITE_ACCOUNT}.blob.core.windows.net/wh"
TABLES = """
warehouse: {{root: '{warehouse}', storage_options: {{use_emulator: 'true'}}}}
spark:
  master: local[1]
  conf:
    spark.sql.shuffle.partitions: '1'
    spark.default.parallelism: '1'
    spark.driver.extraJavaOptions: '{quick_jit}'
tables:
  - name: orders
    source: {{format: delta, path: '{source}'}}
    keys: [order_id]
    watermark: {{column: updated_at, kind: timestamp, lookback: 0s}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
"""


def main(folder: Path) -> dict:
    azurite = AzuriteServer(folder, port=10000)
    try:
        azurite.create(CONTAINER)
        source = DeltaSourceTable(folder / "source")
        tables = folder / "tables.yaml"
        tables.write_text(
            TABLES.format(warehouse=WAREHOUSE, source=source.path, quick_jit=QUICK_JIT)
        )
        project = load_project(tables)
        spec = project.tables[0]
        target = DeltaTarget(
            spec.name, project.target_path(spec), project.warehouse.storage_options
        )
        spark = start_session(project_conf(project), "incremental-assets-azure-test")
        source.upsert([(1, "placed", 10.0, at(1, 1)), (2, "placed", 20.0, at(1, 2))])
        first = load(spark, spec, target, 1)
        # Day 2 changes an order and adds two that share their watermark value.
        source.upsert(
            [
                (1, "paid", 10.0, at(2, 1)),
                (3, "placed", 30.0, at(2, 3)),
                (4, "placed", 4.0, at(2, 3)),
            ]
        )
        second = load(spark, spec, target, 2)
        rows = target.to_spark(spark).select("order_id", "status").collect()
        out = {
            "runs": [[r.committed, r.delta_version] for r in (first, second)],
            "differences": list(differences(spark, spec, target)),
            "rows": sorted([r.order_id, r.status] for r in rows),
            "spark_path": target.spark_path,
            "blobs": azurite.keys(CONTAINER),
        }
        spark.stop()
        return out
    finally:
        azurite.stop()


if __name__ == "__main__":
    sys.stdout.write("RESULT " + json.dumps(main(Path(sys.argv[1]))) + "\n")
