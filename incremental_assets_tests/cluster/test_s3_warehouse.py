"""Runs with the warehouse on S3 (moto's server, shared by the session): a CDC table with
hard deletes (tombstones beside it) and a history table over the same feed (its change
log beside it) load two deliveries each, staged under ``<target>__staging`` on the
bucket, and end equal to a full reload; a landing folder on the bucket is read in place
by Spark into bronze on the bucket. The staging roots hold only the empty object their
emptying leaves. (Upsert on an S3 warehouse: engine/test_counted_and_cleaned.py.)"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.landing import load_landing
from incremental_assets.engine.reload import differences
from incremental_assets_tests.builders import (
    ParquetFolder,
    at,
    cdc_history_spec,
    cdc_spec,
    feed,
    invoice,
    landing_spec,
    load,
)
from incremental_assets_tests.servers import s3_options


@pytest.mark.parametrize("kind", ["cdc", "scd2"])
def test_a_feed_on_an_s3_warehouse_equals_a_full_reload(spark, s3, tmp_path, kind):
    bucket = f"wh-{uuid.uuid4().hex[:10]}"
    s3.create(bucket)
    folder = ParquetFolder(tmp_path / "feed")
    spec = cdc_spec(folder.path) if kind == "cdc" else cdc_history_spec(folder.path)
    target = DeltaTarget(spec.name, f"s3://{bucket}/wh/{spec.name}", s3_options(s3.endpoint))
    folder.drop(feed((1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(1, 2))))
    load(spark, spec, target, 1)
    folder.drop(feed((1, "a2", "U", 3, at(2, 1)), (2, None, "D", 4, at(2, 2))))

    second = load(spark, spec, target, 2)

    assert second.committed
    assert differences(spark, spec, target) == (0, 0)
    keys = s3.keys(bucket)
    side = "__tombstones/" if kind == "cdc" else "__changes/"
    assert any(k.startswith(f"wh/{spec.name}{side}_delta_log/") for k in keys)
    staged = [k for k in keys if k.startswith(f"wh/{spec.name}__staging/")]
    assert [s3.get(bucket, k) for k in staged if not k.endswith("/")] == [""]


def test_a_landing_folder_and_bronze_on_s3_are_read_in_place_and_loaded_once(spark, s3):
    bucket = f"wh-{uuid.uuid4().hex[:10]}"
    s3.create(bucket)
    spec = landing_spec(f"s3://{bucket}/landing/invoices")
    bronze = DeltaTarget(spec.name, f"s3://{bucket}/wh/{spec.name}", s3_options(s3.endpoint))
    later = datetime.now(timezone.utc) + timedelta(hours=1)  # every object has settled
    s3.put(bucket, "landing/invoices/a.json", _lines(1, 2))
    load_landing(spark, spec, bronze, now=later)
    s3.put(bucket, "landing/invoices/b.json", _lines(3))

    second = load_landing(spark, spec, bronze, now=later)

    assert [f.path.rsplit("/", 1)[-1] for f in second.files_loaded] == ["b.json"]
    loaded = spark.read.format("delta").load(bronze.spark_path).select("InvoiceNumber")
    assert sorted(r[0] for r in loaded.collect()) == ["INV1", "INV2", "INV3"]
    keys = s3.keys(bucket)
    staged = [k for k in keys if k.startswith(f"wh/{spec.name}__staging/")]
    assert [s3.get(bucket, k) for k in staged if not k.endswith("/")] == [""]


def _lines(*numbers: int) -> str:
    return "".join(json.dumps(invoice(n)) + "\n" for n in numbers)
