"""Landing folders on object stores: the files sit in a bucket of moto's S3 server, or a
container of Azurite (Azure's storage emulator), started here over HTTP; they are
listed, copied and quarantined through delta-rs with the warehouse resource's storage
options. Bronze is a local Delta table."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable

from incremental_assets import cli
from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.dagster_layer.landing import FILES_QUARANTINED, sensor_name
from incremental_assets.demo.simulator import INVOICE_DDL
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import SourceNotFoundError
from incremental_assets.engine.landing import load_landing, newest_versions, quarantine_dir
from incremental_assets.engine.landing_folder import LandedFile, LandingFolder
from incremental_assets.specs import SpecError, load_project
from incremental_assets_tests.builders import invoice, landing_spec
from incremental_assets_tests.object_stores import SERVERS
from incremental_assets_tests.postgres import skip_or_fail_on_ci


def later() -> datetime:
    """A clock an hour ahead, read when the test runs (not when the module is imported: a
    long session would reach this test with that hour spent, and every object unsettled)."""
    return datetime.now(timezone.utc) + timedelta(hours=1)


@pytest.fixture(scope="module", params=sorted(SERVERS))
def store(request, tmp_path_factory):
    server_class = SERVERS[request.param]
    missing = server_class.missing()
    if missing:
        skip_or_fail_on_ci(missing)
    server = server_class(tmp_path_factory.mktemp(request.param))
    yield server
    server.stop()


@pytest.fixture
def bucket(store) -> str:
    name = f"landing-{uuid.uuid4().hex[:12]}"
    store.create(name)
    return name


def lines(*numbers: int) -> str:
    return "".join(json.dumps(invoice(n)) + "\n" for n in numbers)


def write_tables(root: Path, folder: str, landing: str, options: dict | None = None) -> Path:
    path = root / "tables.yaml"
    path.write_text(
        f"""
warehouse: {{root: ./warehouse, storage_options: {json.dumps(options or {})}}}
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


def local_bronze(tmp_path: Path, store) -> DeltaTarget:
    # Bronze is local; the landing folder is reached with the same storage options.
    options = store.warehouse().storage_options()
    return DeltaTarget("invoices_bronze", str(tmp_path / "invoices_bronze"), options)


def test_files_load_once_only_new_ones_are_downloaded_and_a_bad_one_is_quarantined(
    spark, tmp_path, store, bucket, monkeypatch
):
    folder = store.folder(bucket, "invoices")
    spec = landing_spec(folder)
    bronze = local_bronze(tmp_path, store)
    store.put(bucket, "invoices/a.json", lines(1, 2))
    store.put(bucket, "invoices/2026/01/b.json", lines(3))
    store.put(bucket, "invoices/bad.json", lines(4) + "this is not json\n")
    store.put(bucket, "invoices/_partial/c.json", lines(9))  # '_' folders are never read

    first = load_landing(spark, spec, bronze, now=later())
    assert [f.path for f in first.files_loaded] == [f"{folder}/2026/01/b.json", f"{folder}/a.json"]
    assert list(first.quarantined) == [f"{folder}/bad.json"]
    table = DeltaTable(bronze.path).to_pyarrow_table(columns=["_ia_source_file", "InvoiceNumber"])
    assert sorted(zip(*table.to_pydict().values(), strict=True)) == [
        (f"{folder}/2026/01/b.json", "INV3"),
        (f"{folder}/a.json", "INV1"),
        (f"{folder}/a.json", "INV2"),
    ]
    # The bad file moved to the quarantine inside the folder, with its reason beside it.
    assert "invoices/bad.json" not in store.keys(bucket)
    assert {"invoices/_quarantine/bad.json", "invoices/_quarantine/bad.json.reason.txt"} <= set(
        store.keys(bucket)
    )
    reason = store.get(bucket, "invoices/_quarantine/bad.json.reason.txt")
    assert "do not match source.schema" in reason

    # Nothing new: nothing read, nothing committed.
    reads = store.object_reads(bucket, "invoices/a.json")
    assert reads == 1
    version = DeltaTable(bronze.path).version()
    again = load_landing(spark, spec, bronze, now=later())
    assert again.files_loaded == [] and again.files_already_loaded == 2 and again.commit is None
    assert DeltaTable(bronze.path).version() == version

    # A new file is read alone; the loaded ones are not downloaded again. A zero-byte
    # "folder" object is not a file, and a name with glob characters is read as named
    # (here with a relative staging folder).
    store.put(bucket, "invoices/d[1].json", lines(5))
    store.put(bucket, "invoices/2026/", "")
    monkeypatch.chdir(tmp_path)
    third = load_landing(spark, spec, bronze, now=later(), staging_dir=".")
    assert [f.path for f in third.files_loaded] == [f"{folder}/d[1].json"]
    assert third.commit.rows_inserted == 1 and third.files_seen == 3
    assert store.object_reads(bucket, "invoices/a.json") == reads
    assert store.object_reads(bucket, "invoices/d[1].json") == 1

    # A file rewritten in place is a new version, and silver's view keeps only its rows.
    time.sleep(1.1)  # object times have one-second resolution
    store.put(bucket, "invoices/a.json", lines(1, 6))
    fourth = load_landing(spark, spec, bronze, now=later() + timedelta(minutes=5))
    assert [f.path for f in fourth.files_loaded] == [f"{folder}/a.json"]
    newest = newest_versions(spark.read.parquet(*DeltaTable(bronze.path).file_uris()))
    assert sorted(r["InvoiceNumber"] for r in newest.collect()) == ["INV1", "INV3", "INV5", "INV6"]


def test_a_listing_in_milliseconds_is_not_taken_for_a_change_by_the_whole_second_head(
    tmp_path, store, bucket
):
    # GCS and MinIO list modification times in milliseconds, a HEAD gives whole seconds.
    store.put(bucket, "invoices/a.json", lines(1))
    folder = LandingFolder(store.folder(bucket, "invoices"), store.warehouse().storage_options())
    [(path, size, mtime_ns)] = folder.entries(skip=f"{folder.root}/_quarantine")
    listed = LandedFile(path, size, mtime_ns + 678_000_000)
    local, changed = folder.local_copies([listed], str(tmp_path / "copies"))
    assert changed == [] and Path(local[path]).read_text() == lines(1)
    # A different size is a change: the object is left for the next run.
    local, changed = folder.local_copies([LandedFile(path, size + 1, mtime_ns)], str(tmp_path))
    assert changed == [LandedFile(path, size + 1, mtime_ns)] and local == {}


def test_an_unlistable_bucket_fails_with_what_to_check_and_commits_nothing(spark, tmp_path, store):
    folder = store.folder("no-such-bucket-here", "invoices")
    spec = landing_spec(folder)
    bronze = local_bronze(tmp_path, store)
    with pytest.raises(SourceNotFoundError) as failure:
        load_landing(spark, spec, bronze, now=later())
    message = str(failure.value)
    assert f"{folder} could not be listed" in message
    assert "404" in message  # the server's answer: no such bucket or container
    assert "storage settings" in message
    assert not bronze.exists()


def test_a_secret_or_a_quarantine_outside_the_folder_is_refused_when_the_spec_loads(tmp_path):
    secret = write_tables(tmp_path, "s3://l/i", "{}", {"aws_secret_access_key": "x"})
    with pytest.raises(SpecError, match="secrets are never written in tables"):
        load_project(secret)
    for outside in ("/tmp/quarantine", "s3://other/q", "../q", "."):
        tables = write_tables(tmp_path, "s3://landing/invoices", f"{{quarantine: '{outside}'}}")
        with pytest.raises(SpecError, match="the quarantine is a folder inside it"):
            load_project(tables)
    tables = write_tables(tmp_path, "s3://landing/invoices", "{quarantine: ./bad//files/}")
    spec = load_project(tables).tables[0]
    assert quarantine_dir(spec.source.path, spec.landing) == "s3://landing/invoices/bad/files"


def test_the_sensor_a_bronze_run_and_explain_work_on_an_object_store_folder(
    spark, tmp_path, store, bucket, monkeypatch, capsys
):
    # Configured as a user would: storage options in tables.yaml, secrets in the
    # environment; the Dagster resource and the CLI both take them from there.
    options, secrets = store.settings()
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    folder = store.folder(bucket, "invoices")
    tables = write_tables(tmp_path, folder, "{settle: 0s}", options)
    project = load_project(tables)
    defs = build_definitions(project)
    sensor = next(s for s in defs.sensors if s.name == sensor_name(project.tables[0]))
    store.put(bucket, "invoices/a.json", lines(1, 2))
    store.put(bucket, "invoices/bad.json", "not json at all\n")

    assert cli.main(["explain", "invoices_bronze", "--tables", str(tables), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [f["path"] for f in plan["pending"]] == [f"{folder}/a.json", f"{folder}/bad.json"]

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
        store.put(bucket, "invoices/b.json", lines(3))
        assert len(tick(first.cursor).run_requests) == 1
