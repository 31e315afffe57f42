"""The demo's S3 options: the throwaway server of ``--s3`` starts and serves its bucket;
``--storage-option`` without ``--warehouse``, or not KEY=VALUE, is refused. The demo run
end to end on a warehouse on S3 (``--warehouse s3://BUCKET/PREFIX --storage-option ...``)
is tested on the standalone cluster: cluster/test_cluster_demo.py."""

from __future__ import annotations

import boto3
import pytest

from incremental_assets.cli import main as cli_main
from incremental_assets.demo.s3_server import BUCKET, REGION, local_s3

pytestmark = pytest.mark.slow


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
