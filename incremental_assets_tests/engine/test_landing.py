"""Landing-zone files into bronze: each file version once, settle and marker, quarantine."""

from __future__ import annotations

import json
import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable

from incremental_assets.engine import landing
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.explain import explain_landing
from incremental_assets.engine.landing import FileIndex, list_files, load_landing, newest_versions
from incremental_assets.engine.operations import table_status
from incremental_assets.specs import SpecError, TableSpec, load_project
from incremental_assets_tests.builders import NOW, OLD, drop, invoice, landing_spec


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "landing" / "invoices"
    path.mkdir(parents=True)
    return path


@pytest.fixture
def bronze(tmp_path: Path) -> DeltaTarget:
    return DeltaTarget("invoices_bronze", str(tmp_path / "warehouse" / "invoices_bronze"))


def bronze_rows(target: DeltaTarget) -> list[tuple]:
    table = DeltaTable(target.path).to_pyarrow_table(
        columns=["_ia_source_file", "_ia_file_version", "_ia_file_row", "InvoiceNumber"]
    )
    return sorted(tuple(r.values()) for r in table.to_pylist())


def test_each_new_file_loads_once_and_a_rerun_adds_nothing(spark, folder, bronze):
    spec = landing_spec(folder)
    drop(folder, "a.json", [invoice(1), invoice(2)])
    drop(folder, "b.json", [invoice(3)])

    first = load_landing(spark, spec, bronze, now=NOW)
    assert [Path(f.path).name for f in first.files_loaded] == ["a.json", "b.json"]
    assert first.commit.rows_inserted == 3
    rows = bronze_rows(bronze)
    assert [(Path(r[0]).name, r[2], r[3]) for r in rows] == [
        ("a.json", 1, "INV1"),
        ("a.json", 2, "INV2"),
        ("b.json", 1, "INV3"),
    ]
    nested = DeltaTable(bronze.path).to_pyarrow_table(
        columns=["DeliveryAddress", "InvoiceLineItems", "_ia_ingested_at"]
    )
    assert nested.column("DeliveryAddress")[0].as_py()["City"] == "Pune"
    assert len(nested.column("InvoiceLineItems")[0].as_py()) == 2

    again = load_landing(spark, spec, bronze, now=NOW)
    assert again.files_loaded == [] and again.files_already_loaded == 2
    assert again.commit is None
    assert bronze_rows(bronze) == rows

    # Spark's glob characters in a name are read as written.
    drop(folder, "c[1] {x}*.json", [invoice(4)])
    third = load_landing(spark, spec, bronze, now=NOW)
    assert [Path(f.path).name for f in third.files_loaded] == ["c[1] {x}*.json"]
    assert third.commit.rows_inserted == 1
    assert bronze_rows(bronze)[-1][0] == str(folder / "c[1] {x}*.json")
    assert len(bronze_rows(bronze)) == 4


def test_a_lost_file_index_neither_duplicates_nor_rereads(spark, folder, bronze):
    spec = landing_spec(folder)
    drop(folder, "a.json", [invoice(1), invoice(2)])
    load_landing(spark, spec, bronze, now=NOW)
    rows = bronze_rows(bronze)
    version = DeltaTable(bronze.path).version()

    # The index is a cache: rebuilt from the bronze commits, which list their files.
    shutil.rmtree(FileIndex(bronze).location.path)
    rerun = load_landing(spark, spec, bronze, now=NOW)
    assert rerun.files_loaded == [] and rerun.files_already_loaded == 1
    assert FileIndex(bronze).known() == {(str(folder / "a.json"), rerun_version(folder))}
    assert DeltaTable(bronze.path).version() == version
    assert bronze_rows(bronze) == rows


def rerun_version(folder: Path) -> str:
    stat = (folder / "a.json").stat()
    return f"{stat.st_size}-{stat.st_mtime_ns}"


def test_a_file_loaded_again_after_a_crash_before_its_index_adds_no_rows(
    spark, folder, bronze, monkeypatch
):
    spec = landing_spec(folder)
    drop(folder, "a.json", [invoice(1), invoice(2)])
    load_landing(spark, spec, bronze, now=NOW)
    rows = bronze_rows(bronze)
    # As if the index and the commit's file list were both lost: the merge on
    # (file, version, row) still inserts nothing.
    shutil.rmtree(FileIndex(bronze).location.path)
    monkeypatch.setattr(landing, "loaded_files", lambda target, record=True: set())
    rerun = load_landing(spark, spec, bronze, now=NOW)
    assert [Path(f.path).name for f in rerun.files_loaded] == ["a.json"]
    assert rerun.commit.rows_inserted == 0
    assert bronze_rows(bronze) == rows


def test_a_file_rewritten_in_place_is_a_new_version_and_silver_reads_the_newest(
    spark, folder, bronze
):
    spec = landing_spec(folder)
    drop(folder, "a.json", [invoice(1), invoice(2)])
    load_landing(spark, spec, bronze, now=NOW)
    drop(folder, "a.json", [invoice(1, items=3), invoice(2), invoice(5)], modified=OLD)
    later = NOW + timedelta(minutes=5)
    second = load_landing(spark, spec, bronze, now=later)

    assert [Path(f.path).name for f in second.files_loaded] == ["a.json"]
    rows = bronze_rows(bronze)
    assert len(rows) == 5 and len({r[1] for r in rows}) == 2
    newest = newest_versions(spark.read.parquet(*_files(bronze)))
    assert sorted(r["InvoiceNumber"] for r in newest.collect()) == ["INV1", "INV2", "INV5"]


def _files(target: DeltaTarget) -> list[str]:
    return DeltaTable(target.path).file_uris()


def test_a_malformed_file_is_quarantined_with_its_reason_and_the_others_load(spark, folder, bronze):
    spec = landing_spec(folder)
    drop(folder, "good.json", [invoice(1)])
    bad = folder / "bad.json"
    bad.write_text(json.dumps(invoice(2)) + "\n{not json at all\n")
    os.utime(bad, (OLD.timestamp(), OLD.timestamp()))

    report = load_landing(spark, spec, bronze, now=NOW)
    assert [Path(f.path).name for f in report.files_loaded] == ["good.json"]
    assert list(report.quarantined) == [str(bad)]
    assert "1 of 2 rows" in report.quarantined[str(bad)]
    assert not bad.exists()
    moved = folder / "_quarantine" / "bad.json"
    assert moved.exists()
    assert "not json" in (folder / "_quarantine" / "bad.json.reason.txt").read_text()
    assert [r[3] for r in bronze_rows(bronze)] == ["INV1"]
    # The quarantine folder is not read as landing input.
    assert load_landing(spark, spec, bronze, now=NOW).files_loaded == []


def test_files_still_settling_or_without_their_marker_wait(folder):
    drop(folder, "old.json", [invoice(1)])
    drop(folder, "fresh.json", [invoice(2)], modified=NOW - timedelta(seconds=5))
    listing = list_files(str(folder), landing_spec(folder).landing, NOW)
    assert [Path(f.path).name for f in listing.ready] == ["old.json"]
    assert [Path(f.path).name for f in listing.waiting] == ["fresh.json"]

    marked = landing_spec(folder, marker=".done").landing
    assert list_files(str(folder), marked, NOW).ready == []
    (folder / "old.json.done").touch()
    ready = list_files(str(folder), marked, NOW).ready
    assert [Path(f.path).name for f in ready] == ["old.json"]


LANDING_YAML = """\
warehouse: {root: ./warehouse}
tables:
  - name: invoices_bronze
    source:
      format: json
      path: ./landing/invoices
      schema: "InvoiceNumber STRING"
      landing: {settle: 30s}
    strategy: append
    partitioning: {granularity: daily, start: 2026-01-01}
"""


@pytest.mark.parametrize(
    ("good", "bad", "field", "words"),
    [
        ("settle: 30s", "settel: 30s", "source.landing.settel", "unknown field"),
        ('schema: "InvoiceNumber STRING"', "", "source", "need source.schema"),
        ("strategy: append", "strategy: upsert", None, "use strategy: append"),
        ("strategy: append", "strategy: append\n    keys: [id]", None, "remove keys"),
        ("format: json", "format: delta", "source", "landing folder holds json"),
    ],
)
def test_a_bad_landing_spec_fails_at_load_naming_table_and_field(tmp_path, good, bad, field, words):
    path = tmp_path / "tables.yaml"
    path.write_text(LANDING_YAML.replace(good, bad))
    with pytest.raises(SpecError) as info:
        load_project(path)
    problems = info.value.problems
    assert any(t == "invoices_bronze" and words in m for t, _, m in problems), problems
    if field:
        assert any(f == field and words in m for _, f, m in problems), problems


def test_a_typo_under_source_landing_gets_a_did_you_mean_hint(tmp_path):
    path = tmp_path / "tables.yaml"
    path.write_text(LANDING_YAML.replace("settle: 30s", "settel: 30s, quarantien: bad"))
    with pytest.raises(SpecError) as info:
        load_project(path)
    messages = {f: m for _, f, m in info.value.problems}
    assert "did you mean 'settle'?" in messages["source.landing.settel"]
    assert "did you mean 'quarantine'?" in messages["source.landing.quarantien"]
    assert (
        "allowed: marker, pattern, quarantine, refine, settle" in messages["source.landing.settel"]
    )


def test_a_landing_spec_loads_with_file_keys_and_the_open_day(tmp_path):
    path = tmp_path / "tables.yaml"
    path.write_text(LANDING_YAML)
    spec = load_project(path).table("invoices_bronze")
    assert spec.keys == ["_ia_source_file", "_ia_file_version", "_ia_file_row"]
    assert spec.partition_column == "_ia_ingested_at"
    assert spec.partitioning.end_offset == 1
    assert spec.source.path == str(tmp_path / "landing" / "invoices")


def test_csv_and_parquet_landing_files_with_a_quarantine_inside_the_folder(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    csv_folder = tmp_path / "csv"
    csv_folder.mkdir()
    (csv_folder / "a.csv").write_text("id,amount\n1,2.5\n2,3.0\n")
    (csv_folder / "b.csv").write_text("id,amount\n3,not-a-number\n")
    parquet_folder = tmp_path / "parquet"
    parquet_folder.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "amount": [2.5, 3.0]}), parquet_folder / "a.parquet")
    (parquet_folder / "b.parquet").write_bytes(b"PAR1 truncated")
    for path in [*csv_folder.iterdir(), *parquet_folder.iterdir()]:
        os.utime(path, (OLD.timestamp(), OLD.timestamp()))

    for fmt, folder in (("csv", csv_folder), ("parquet", parquet_folder)):
        spec = TableSpec.model_validate(
            {
                "name": f"{fmt}_bronze",
                "source": {
                    "format": fmt,
                    "path": str(folder),
                    "schema": "id BIGINT, amount DOUBLE",
                    "landing": {"quarantine": "bad"},
                },
                "partitioning": {"granularity": "daily", "start": "2026-01-01"},
            }
        )
        target = DeltaTarget(spec.name, str(tmp_path / "warehouse" / spec.name))
        report = load_landing(spark, spec, target, now=NOW)
        assert [Path(f.path).name for f in report.files_loaded] == [f"a.{fmt}"], fmt
        assert [Path(p).name for p in report.quarantined] == [f"b.{fmt}"], fmt
        assert (folder / "bad" / f"b.{fmt}").exists()
        ids = DeltaTable(target.path).to_pyarrow_table(columns=["id"]).column(0).to_pylist()
        assert sorted(ids) == [1, 2]
        again = load_landing(spark, spec, target, now=NOW)
        assert again.files_seen == 1 and again.files_loaded == []


def test_explain_lists_the_files_the_next_run_would_load_and_writes_nothing(spark, folder, bronze):
    spec = landing_spec(folder)
    drop(folder, "a.json", [invoice(1)])
    load_landing(spark, spec, bronze, now=NOW)
    shutil.rmtree(FileIndex(bronze).location.path)  # the index lags the bronze log
    drop(folder, "b.json", [invoice(2)])
    drop(folder, "c.json", [invoice(3)], modified=NOW)  # still settling at NOW
    version = DeltaTable(bronze.path).version()

    plan = explain_landing(spec, bronze, now=NOW)
    assert [Path(f.path).name for f in plan.pending] == ["b.json"]
    assert [Path(f.path).name for f in plan.waiting] == ["c.json"]
    assert (plan.ready, plan.known) == (2, 1)
    shown = plan.to_json()
    assert shown["pending"][0]["path"] == str(folder / "b.json") and shown["settle"] == "30s"
    # Nothing written: not bronze, and not the index (explain does not catch it up).
    assert DeltaTable(bronze.path).version() == version
    assert not FileIndex(bronze).location.exists()

    status = table_status(spec, bronze)
    assert status.last_run.cursor_before is None and status.last_run.cursor_after is None
    assert status.to_json()["last_run"]["cursor_before"] is None


def test_a_landing_table_asking_for_deletion_vectors_is_created_with_them(spark, folder, bronze):
    plain = landing_spec(folder)
    spec = plain.model_copy(
        update={"target": plain.target.model_copy(update={"deletion_vectors": True})}
    )
    drop(folder, "a.json", [invoice(1), invoice(2)])
    load_landing(spark, spec, bronze, now=NOW)
    drop(folder, "b.json", [invoice(3)])

    second = load_landing(spark, spec, bronze, now=NOW)

    assert delta_io.writes_deletion_vectors(DeltaTable(bronze.path))
    assert second.commit.rows_inserted == 1
    assert spark.read.format("delta").load(bronze.path).count() == 3
