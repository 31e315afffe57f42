"""Landing folders on an object store: the files sit in a bucket of an S3-compatible server
(moto's, started here over HTTP), listed, copied and quarantined through delta-rs with the
warehouse resource's storage options; bronze is a local Delta table."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable

from incremental_assets.defs.build import build_definitions
from incremental_assets.defs.landing import FILES_QUARANTINED, sensor_name
from incremental_assets.engine.delta_store import DeltaTarget
from incremental_assets.engine.errors import SourceNotFoundError
from incremental_assets.engine.landing import load_landing, newest_versions
from incremental_assets.specs import SpecError, load_project
from incremental_assets_tests.s3_server import S3Server
from incremental_assets_tests.test_landing import INVOICE_DDL, invoice, landing_spec

LATER = datetime.now(timezone.utc) + timedelta(hours=1)  # every object has settled


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    if not S3Server.available():
        pytest.skip("moto_server is missing: install the dev extra (pip install -e '.[dev]')")
    server = S3Server(tmp_path_factory.mktemp("moto") / "requests.log")
    yield server
    server.stop()


@pytest.fixture
def bucket(s3) -> str:
    name = f"landing-{uuid.uuid4().hex[:12]}"
    s3.client.create_bucket(Bucket=name)
    return name


def lines(*numbers: int) -> str:
    return "".join(json.dumps(invoice(n)) + "\n" for n in numbers)


def write_tables(root: Path, folder: str, landing: str) -> Path:
    path = root / "tables.yaml"
    path.write_text(
        f"""
warehouse: {{root: ./warehouse}}
tables:
  - name: invoices_bronze
    source:
      format: json
      path: {folder}
      schema: "{INVOICE_DDL}"
      landing: {landing}
    strategy: append
    partitioning: {{granularity: daily, start: 2026-01-01}}
"""
    )
    return path


def local_bronze(tmp_path: Path, s3: S3Server) -> DeltaTarget:
    # Bronze is local; the landing folder is reached with the same storage options.
    options = s3.warehouse().storage_options()
    return DeltaTarget("invoices_bronze", str(tmp_path / "invoices_bronze"), options)


def test_s3_files_load_once_only_new_ones_are_read_and_a_bad_one_is_quarantined(
    spark, tmp_path, s3, bucket
):
    folder = f"s3://{bucket}/invoices"
    spec = landing_spec(folder)
    bronze = local_bronze(tmp_path, s3)
    s3.put(bucket, "invoices/a.json", lines(1, 2))
    s3.put(bucket, "invoices/2026/01/b.json", lines(3))
    s3.put(bucket, "invoices/bad.json", lines(4) + "this is not json\n")
    s3.put(bucket, "invoices/_partial/c.json", lines(9))  # '_' folders are never read

    first = load_landing(spark, spec, bronze, now=LATER)
    assert [f.path for f in first.files_loaded] == [f"{folder}/2026/01/b.json", f"{folder}/a.json"]
    assert list(first.quarantined) == [f"{folder}/bad.json"]
    table = DeltaTable(bronze.path).to_pyarrow_table(columns=["_ia_source_file", "InvoiceNumber"])
    assert sorted(zip(*table.to_pydict().values(), strict=True)) == [
        (f"{folder}/2026/01/b.json", "INV3"),
        (f"{folder}/a.json", "INV1"),
        (f"{folder}/a.json", "INV2"),
    ]
    # The bad file moved to the quarantine inside the folder, with its reason beside it.
    assert "invoices/bad.json" not in s3.keys(bucket)
    assert {"invoices/_quarantine/bad.json", "invoices/_quarantine/bad.json.reason.txt"} <= set(
        s3.keys(bucket)
    )
    reason = s3.client.get_object(Bucket=bucket, Key="invoices/_quarantine/bad.json.reason.txt")
    assert "do not match source.schema" in reason["Body"].read().decode()

    # Nothing new: nothing read, nothing committed.
    reads = s3.object_reads(bucket, "invoices/a.json")
    assert reads == 1
    version = DeltaTable(bronze.path).version()
    again = load_landing(spark, spec, bronze, now=LATER)
    assert again.files_loaded == [] and again.files_already_loaded == 2 and again.commit is None
    assert DeltaTable(bronze.path).version() == version

    # A new file is read alone; the loaded ones are not downloaded again.
    s3.put(bucket, "invoices/d.json", lines(5))
    third = load_landing(spark, spec, bronze, now=LATER)
    assert [f.path for f in third.files_loaded] == [f"{folder}/d.json"]
    assert s3.object_reads(bucket, "invoices/a.json") == reads
    assert s3.object_reads(bucket, "invoices/d.json") == 1

    # A file rewritten in place is a new version, and silver's view keeps only its rows.
    time.sleep(1.1)  # object times have one-second resolution
    s3.put(bucket, "invoices/a.json", lines(1, 6))
    fourth = load_landing(spark, spec, bronze, now=LATER + timedelta(minutes=5))
    assert [f.path for f in fourth.files_loaded] == [f"{folder}/a.json"]
    newest = newest_versions(spark.read.parquet(*DeltaTable(bronze.path).file_uris()))
    assert sorted(r["InvoiceNumber"] for r in newest.collect()) == ["INV1", "INV3", "INV5", "INV6"]


def test_an_unlistable_bucket_fails_with_what_to_check_and_commits_nothing(spark, tmp_path, s3):
    spec = landing_spec("s3://no-such-bucket-here/invoices")
    bronze = local_bronze(tmp_path, s3)
    with pytest.raises(SourceNotFoundError) as failure:
        load_landing(spark, spec, bronze, now=LATER)
    message = str(failure.value)
    assert "s3://no-such-bucket-here/invoices could not be listed" in message
    assert "NoSuchBucket" in message or "404" in message
    assert "storage settings" in message
    assert not bronze.exists()


def test_a_quarantine_outside_an_object_store_folder_is_refused_when_the_spec_loads(tmp_path):
    tables = write_tables(tmp_path, "s3://landing/invoices", "{quarantine: /tmp/quarantine}")
    with pytest.raises(SpecError, match="the quarantine is a folder inside it"):
        load_project(tables)


def test_the_sensor_and_a_bronze_run_work_on_an_s3_folder(spark, tmp_path, s3, bucket):
    project = load_project(write_tables(tmp_path, f"s3://{bucket}/invoices", "{settle: 0s}"))
    defs = build_definitions(project, resources={"warehouse": s3.warehouse()})
    sensor = next(s for s in defs.sensors if s.name == sensor_name(project.tables[0]))
    s3.put(bucket, "invoices/a.json", lines(1, 2))
    s3.put(bucket, "invoices/bad.json", "not json at all\n")

    with dg.instance_for_test() as instance:

        def tick(cursor):
            context = dg.build_sensor_context(
                instance=instance,
                cursor=cursor,
                resources={"warehouse": defs.resources["warehouse"]},
                definitions=defs,
            )
            return sensor.evaluate_tick(context)

        first = tick(None)
        assert len(first.run_requests) == 1
        assert first.run_requests[0].tags["incremental_assets/new_files"] == "2"
        assert tick(first.cursor).run_requests == []

        result = dg.materialize(
            [defs.get_assets_def("invoices_bronze")],
            partition_key=first.run_requests[0].partition_key,
            instance=instance,
            resources=defs.resources,
        )
        event = result.asset_materializations_for_node("invoices_bronze")[-1]
        assert event.metadata["files_loaded"].value == 1
        assert event.metadata["files_quarantined"].value == 1
        checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
        assert not checks[FILES_QUARANTINED].passed
        target = defs.resources["warehouse"].target(project, project.tables[0])
        assert DeltaTable(target.path).to_pyarrow_table().num_rows == 2

        # Loaded and quarantined files are known: the sensor asks for nothing more.
        skipped = tick(first.cursor)
        assert skipped.run_requests == [] and "no new files" in skipped.skip_message
        s3.put(bucket, "invoices/b.json", lines(3))
        assert len(tick(first.cursor).run_requests) == 1
