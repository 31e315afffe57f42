"""The IncrementalTables Component: the same specs and definitions as tables.yaml, loaded
from a defs.yaml, and dg (scaffold, check yaml, list defs) on a user's own project."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from incremental_assets.dagster_layer.build import AUTOMATION_SENSOR
from incremental_assets.dagster_layer.component import IncrementalTables
from incremental_assets.specs import load_project
from incremental_assets.specs.loader import SpecError
from incremental_assets_tests.builders import PROJECT_ROOT

COMPONENT = "incremental_assets.IncrementalTables"
ORDERS = {
    "name": "orders",
    "source": {"format": "parquet", "path": "source/orders"},
    "keys": ["order_id"],
    "watermark": {"column": "updated_at", "kind": "timestamp"},
    "strategy": "upsert",
    "partitioning": {"granularity": "daily", "start": "2026-01-01"},
}


def _component(attributes: dict) -> IncrementalTables:
    return IncrementalTables.from_attributes_dict(attributes=attributes)


def test_inline_tables_resolve_against_the_defs_folder(tmp_path):
    component = _component({"warehouse": {"root": "warehouse"}, "tables": [ORDERS]})
    project = component.project(tmp_path)
    assert project.tables[0].source.path == str(tmp_path / "source" / "orders")
    assert project.warehouse.root == str(tmp_path / "warehouse")


def test_a_tables_file_loads_as_tables_yaml_does(tmp_path):
    (tmp_path / "specs").mkdir()
    path = tmp_path / "specs" / "tables.yaml"
    path.write_text(yaml.safe_dump({"warehouse": {"root": "wh"}, "tables": [ORDERS]}))
    from_component = _component({"tables_file": "specs/tables.yaml"}).project(tmp_path)
    assert from_component == load_project(path)


def test_a_bad_inline_spec_fails_with_the_loaders_table_and_field_message(tmp_path):
    bad = {**ORDERS, "strategy": "upsrt", "partitioning": {"granularity": "weekly"}}
    with pytest.raises(SpecError) as raised:
        _component({"warehouse": {"root": "wh"}, "tables": [bad]}).project(tmp_path)
    message = str(raised.value)
    assert f"invalid table spec in {tmp_path / 'defs.yaml'}" in message
    assert "table 'orders', field 'strategy': got 'upsrt'" in message
    assert "table 'orders', field 'partitioning.granularity'" in message


def test_tables_file_and_inline_tables_together_are_refused(tmp_path):
    component = _component({"tables_file": "t.yaml", "tables": [ORDERS]})
    with pytest.raises(ValueError, match="either tables_file or the tables inline"):
        component.project(tmp_path)
    with pytest.raises(ValueError, match="needs tables_file"):
        _component({}).project(tmp_path)


def test_the_shipped_defs_folder_builds_every_table_of_tables_yaml(monkeypatch):
    monkeypatch.delenv("INCREMENTAL_ASSETS_TABLES", raising=False)
    defs = dg.load_from_defs_folder(project_root=PROJECT_ROOT)
    names = {key.to_user_string() for key in defs.resolve_all_asset_keys()}
    tables = {spec.name for spec in load_project(PROJECT_ROOT / "tables.yaml").tables}
    assert tables <= names
    sensors = {sensor.name for sensor in defs.sensors or []}
    assert AUTOMATION_SENSOR in sensors
    assert defs.resolve_job_def("maintain_tables")


# --- dg on a user's own project ------------------------------------------------------


def _dg(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    venv = Path(sys.executable).parent
    env = {
        **os.environ,
        "VIRTUAL_ENV": str(venv.parent),
        "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}",
        "DAGSTER_HOME": str(project),
        "PYTHONPATH": str(project),
        "COLUMNS": "200",
    }
    return subprocess.run(
        [str(venv / "dg"), *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def user_project(tmp_path):
    """A dg project of a user's own, which has only installed incremental-assets."""
    (tmp_path / "shop" / "defs").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "shop"\nversion = "0.1.0"\n\n'
        '[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "shop"\n'
    )
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "defs" / "__init__.py").write_text("")
    (tmp_path / "shop" / "definitions.py").write_text(
        "from pathlib import Path\n\nimport dagster as dg\n\n"
        "defs = dg.load_from_defs_folder(project_root=Path(__file__).parent.parent)\n"
    )
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return tmp_path


@pytest.mark.slow
def test_dg_scaffolds_checks_and_lists_a_tables_component(user_project):
    scaffolded = _dg(user_project, "scaffold", "defs", COMPONENT, "sales")
    assert scaffolded.returncode == 0, scaffolded.stderr
    defs_yaml = user_project / "shop" / "defs" / "sales" / "defs.yaml"
    assert "name: sales" in defs_yaml.read_text()

    checked = _dg(user_project, "check", "yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Warning" not in checked.stderr.replace("PreviewWarning: Class `SparkDecl", "")

    listed = _dg(user_project, "list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr
    defs = json.loads(listed.stdout)
    assert [asset["asset_key"] for asset in defs["assets"]] == ["sales"]
    assert "sales:keys_unique" in {check["key"] for check in defs["asset_checks"]}
    assert AUTOMATION_SENSOR in {sensor["name"] for sensor in defs["sensors"]}

    # A bad field: dg check yaml points at the table's field and its line, before loading.
    good = defs_yaml.read_text()
    defs_yaml.write_text(good.replace("granularity: daily", "granularity: weekly"))
    checked = _dg(user_project, "check", "yaml")
    assert checked.returncode == 1
    assert "attributes.tables.0.partitioning.granularity 'weekly' is not one of" in checked.stdout
    assert "defs.yaml:20" in checked.stdout
    # What a schema cannot see fails the load (dg check defs, dg dev) with the loader's
    # table-and-field message, as tables.yaml does.
    start = next(line for line in good.splitlines() if "start:" in line).strip()
    defs_yaml.write_text(good.replace(start, 'start: "next tuesday"'))
    assert _dg(user_project, "check", "yaml").returncode == 0
    loaded = _dg(user_project, "check", "defs")
    assert loaded.returncode != 0
    assert "table 'sales', field 'partitioning.start'" in loaded.stdout + loaded.stderr


@pytest.mark.slow
def test_two_components_share_resources_and_the_automation_sensor(user_project):
    for name in ("sales", "returns"):
        assert _dg(user_project, "scaffold", "defs", COMPONENT, name).returncode == 0
    listed = _dg(user_project, "list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr
    defs = json.loads(listed.stdout)
    assert sorted(asset["asset_key"] for asset in defs["assets"]) == ["returns", "sales"]
    assert [sensor["name"] for sensor in defs["sensors"]] == [AUTOMATION_SENSOR]
    assert sorted(job["name"] for job in defs["jobs"]) == [
        "maintain_tables_returns",
        "maintain_tables_sales",
    ]

    # Different Spark settings cannot share the one session: said by name.
    returns = user_project / "shop" / "defs" / "returns" / "defs.yaml"
    returns.write_text(
        returns.read_text().replace("  tables:\n", "  spark:\n    master: local[1]\n  tables:\n")
    )
    listed = _dg(user_project, "list", "defs", "--json")
    assert listed.returncode != 0
    assert "set different 'spark' settings" in listed.stdout + listed.stderr
