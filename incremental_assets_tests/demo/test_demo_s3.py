"""The demo with its warehouse on S3 (moto's server, shared by the session), as
``./dev demo --warehouse s3://BUCKET/PREFIX --storage-option endpoint=...``: every table
(upsert, append, CDC, SCD2, snapshot, and the landing folder's bronze with its silver and
gold) is written to the bucket, none to the local warehouse, and ends equal to a full
reload; the throwaway server of ``--s3`` starts and serves its bucket."""

from __future__ import annotations

import shutil
import uuid

import boto3
import pytest

from incremental_assets.cli import main as cli_main
from incremental_assets.demo import run
from incremental_assets.demo.s3_server import BUCKET, REGION, local_s3
from incremental_assets_tests.builders import PROJECT_ROOT
from incremental_assets_tests.servers import s3_options

pytestmark = pytest.mark.slow

TABLES = {"orders", "events", "customers", "customers_history", "products"}


def test_the_demo_on_an_s3_warehouse_ends_equal_to_a_full_reload(
    tmp_path, monkeypatch, capsys, spark, s3
):
    for name in ("tables.yaml", "dagster.yaml"):
        shutil.copy(PROJECT_ROOT / name, tmp_path / name)
    monkeypatch.setenv("INCREMENTAL_ASSETS_TABLES", str(tmp_path / "tables.yaml"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    bucket = f"demo-{uuid.uuid4().hex[:10]}"
    s3.create(bucket)

    code = run.main(
        rounds=1,
        root=tmp_path,
        warehouse=f"s3://{bucket}/wh",
        storage_options=s3_options(s3.endpoint),
    )

    out = capsys.readouterr().out
    assert code == 0, out
    verdicts = {line.split()[0]: line for line in out.splitlines() if "a full reload (" in line}
    assert set(verdicts) == TABLES
    assert all(" equal to a full reload" in line for line in verdicts.values()), verdicts
    assert "invoices_gold" in out and "DIFFERENT" not in out
    logs = {k.split("/")[1] for k in s3.keys(bucket) if "/_delta_log/" in k}
    assert TABLES | {"invoices_bronze", "invoices_silver", "invoices_gold"} <= logs
    assert not (tmp_path / "data" / "warehouse").exists()
    staged = [k for k in s3.keys(bucket) if "__staging/" in k and not k.endswith("/")]
    assert all(s3.get(bucket, k) == "" for k in staged), staged


def test_the_throwaway_s3_server_serves_its_bucket_until_the_demo_ends(tmp_path):
    with local_s3(tmp_path) as (root, options):
        client = boto3.client("s3", endpoint_url=options["endpoint"], region_name=REGION)
        client.put_object(Bucket=BUCKET, Key="warehouse/x", Body=b"1")
        listed = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert (root, listed) == (f"s3://{BUCKET}/warehouse", ["warehouse/x"])
    with pytest.raises(Exception, match=r"(?i)connect"):
        client.list_objects_v2(Bucket=BUCKET)


def test_a_storage_option_without_a_warehouse_or_not_key_value_is_refused(capsys):
    assert cli_main(["demo", "--storage-option", "region=eu-west-1"]) == 2
    assert "--storage-option goes with --warehouse" in capsys.readouterr().err
    assert cli_main(["demo", "--warehouse", "s3://b/p", "--storage-option", "region"]) == 2
    assert "write KEY=VALUE" in capsys.readouterr().err
