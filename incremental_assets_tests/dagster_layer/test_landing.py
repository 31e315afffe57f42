"""Landing tables in Dagster: the sensor against a real folder, and a bronze
materialization that reports loaded and quarantined files."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable

from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.dagster_layer.landing import FILES_QUARANTINED, sensor_name
from incremental_assets.demo.simulator import INVOICE_DDL
from incremental_assets.specs import load_project
from incremental_assets_tests.builders import invoice, invoice_layers_yaml

TABLES_YAML = f"""
warehouse:
  root: ./warehouse
tables:
  - name: invoices_bronze
    source:
      format: json
      path: ./landing/invoices
      schema: "{INVOICE_DDL}"
      landing: {{settle: 30s}}
    strategy: append
    partitioning: {{granularity: daily, start: 2026-01-01}}
"""


class LandingProject:
    def __init__(self, root: Path):
        self.folder = root / "landing" / "invoices"
        self.folder.mkdir(parents=True)
        (root / "tables.yaml").write_text(TABLES_YAML)
        self.spec = load_project(root / "tables.yaml")
        self.defs = build_definitions(self.spec)
        self.target = self.defs.resources["warehouse"].target(self.spec, self.spec.tables[0])
        name = sensor_name(self.spec.tables[0])
        self.sensor = next(s for s in self.defs.sensors if s.name == name)

    def drop(self, name: str, text: str, age_seconds: float = 3600) -> Path:
        path = self.folder / name
        path.write_text(text)
        stamp = time.time() - age_seconds
        os.utime(path, (stamp, stamp))
        return path

    def tick(self, instance, cursor: str | None):
        context = dg.build_sensor_context(
            instance=instance,
            cursor=cursor,
            resources={"warehouse": self.defs.resources["warehouse"]},
            definitions=self.defs,
        )
        return self.sensor.evaluate_tick(context)

    def materialize(self, instance, partition: str):
        return dg.materialize(
            [self.defs.get_assets_def("invoices_bronze")],
            partition_key=partition,
            instance=instance,
            resources=self.defs.resources,
            raise_on_error=False,
        )


def lines(*numbers: int) -> str:
    return "".join(json.dumps(invoice(n)) + "\n" for n in numbers)


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def test_sensor_requests_a_run_only_for_new_or_changed_files(tmp_path, instance, spark):
    project = LandingProject(tmp_path)
    assert project.tick(instance, None).run_requests == []

    project.drop("a.json", lines(1, 2))
    project.drop("still-writing.json", lines(3), age_seconds=-3600)
    first = project.tick(instance, None)
    assert len(first.run_requests) == 1
    partition = first.run_requests[0].partition_key
    assert (
        partition
        == project.defs.get_assets_def("invoices_bronze").partitions_def.get_last_partition_key()
    )

    # Evaluated again with nothing new: nothing requested.
    again = project.tick(instance, first.cursor)
    assert again.run_requests == [] and again.cursor in (None, first.cursor)

    # After the run has loaded the files, still nothing.
    assert project.materialize(instance, partition).success
    assert project.tick(instance, first.cursor).run_requests == []

    # A new file, or a file rewritten in place, asks for a run again.
    project.drop("b.json", lines(4))
    second = project.tick(instance, first.cursor)
    assert len(second.run_requests) == 1 and second.cursor != first.cursor
    assert project.materialize(instance, partition).success
    project.drop("a.json", lines(1, 2, 5), age_seconds=600)
    assert len(project.tick(instance, second.cursor).run_requests) == 1


def test_bronze_run_loads_good_files_and_reports_the_quarantined_one(tmp_path, instance, spark):
    project = LandingProject(tmp_path)
    project.drop("good.json", lines(1, 2))
    project.drop("bad.json", lines(3) + "this is not json\n")

    result = project.materialize(instance, "2026-01-02")
    assert result.success
    event = result.asset_materializations_for_node("invoices_bronze")[-1]
    metadata = {k: v.value for k, v in event.metadata.items()}
    assert metadata["files_loaded"] == 1
    assert metadata["files_quarantined"] == 1
    assert "does not match" in json.dumps(metadata["quarantined"]) or "rows do not" in (
        json.dumps(metadata["quarantined"])
    )
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert not checks[FILES_QUARANTINED].passed
    assert checks["keys_unique"].passed
    version = DeltaTable(project.target.path).version()

    rerun = project.materialize(instance, "2026-01-02")
    event = rerun.asset_materializations_for_node("invoices_bronze")[-1]
    assert event.metadata["files_loaded"].value == 0
    assert DeltaTable(project.target.path).version() == version
    assert DeltaTable(project.target.path).to_pyarrow_table().num_rows == 2


def test_silver_and_gold_materialize_by_themselves_after_bronze(tmp_path, instance, spark):
    root = tmp_path / "refined"
    root.mkdir()
    (root / "landing" / "invoices").mkdir(parents=True)
    # The invoices' silver and gold as the project's tables.yaml declares them.
    (root / "tables.yaml").write_text(TABLES_YAML + invoice_layers_yaml())
    defs = build_definitions(load_project(root / "tables.yaml"))
    path = root / "landing" / "invoices" / "a.json"
    path.write_text(lines(1, 2))
    os.utime(path, (time.time() - 3600, time.time() - 3600))

    def run(names: list[str], partition: str | None = None):
        result = dg.materialize(
            [defs.get_assets_def(name) for name in names],
            partition_key=partition,
            instance=instance,
            resources=defs.resources,
        )
        assert result.success
        return result

    def requested(cursor):
        evaluation = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        names = {r.key.to_user_string() for r in evaluation.results if r.true_subset.size}
        return names, evaluation.cursor

    names, cursor = requested(None)
    assert names == set()
    run(["invoices_bronze"], "2026-01-02")
    # Bronze has new data: silver, and gold after it in the same run.
    names, cursor = requested(cursor)
    assert names == {"invoices_silver", "invoices_gold"}
    result = run(["invoices_silver", "invoices_gold"])
    silver = result.asset_materializations_for_node("invoices_silver")[-1].metadata
    assert silver["rows_inserted"].value + silver["rows_updated"].value == 4
    gold = result.asset_materializations_for_node("invoices_gold")[-1].metadata
    assert gold["windows_recomputed"].value == "2026-01-01"
    # Both layers carry the standard table metadata and the tables' key checks.
    assert silver["dagster/row_count"].value == 4
    columns = {c.name: c.description for c in silver["dagster/column_schema"].value.columns}
    assert columns["InvoiceNumber"] == columns["ItemCode"] == "key"
    assert gold["dagster/row_count"].value >= 1
    evaluations = {
        (e.asset_key.to_user_string(), e.check_name): e.passed
        for e in result.get_asset_check_evaluations()
    }
    # (A gold group's key may be null, a group of its own: gold has no keys_not_null.)
    key_checks = {
        ("invoices_silver", "keys_unique"),
        ("invoices_silver", "keys_not_null"),
        ("invoices_gold", "keys_unique"),
    }
    assert key_checks <= set(evaluations) and all(evaluations.values()), evaluations
    names, cursor = requested(cursor)
    assert names == set()
