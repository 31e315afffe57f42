"""The public pieces for a user's own layers (engine/layers.py): the example layer of docs/layers.md
runs as written, reads only the files added since it last ran and commits nothing when
bronze has nothing new; rewritten files and the rows of their earlier versions are named."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from deltalake import DeltaTable

from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.landing import load_landing
from incremental_assets.engine.layers import covered_version, older_versions, rewritten_files
from incremental_assets_tests.builders import NOW, OLD, PROJECT_ROOT, drop, invoice, landing_spec

LAYERS_PAGE = PROJECT_ROOT / "docs" / "layers.md"


def readme_layer() -> str:
    """The Python block of docs/layers.md ("Your own layers")."""
    section = LAYERS_PAGE.read_text().split("# Your own layers", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_readme_layer_reads_only_files_added_since_it_last_ran(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the example's warehouse is data/warehouse
    folder = tmp_path / "landing"
    folder.mkdir()
    spec = landing_spec(folder)
    bronze = DeltaTarget("invoices_bronze", str(tmp_path / "data/warehouse/invoices_bronze"))
    headers = DeltaTarget("invoice_headers", str(tmp_path / "data/warehouse/invoice_headers"))
    layer = compile(readme_layer(), "docs/layers.md", "exec")

    def run() -> None:
        exec(layer, {"spark": spark})

    def invoices() -> list[str]:
        rows = DeltaTable(headers.path).to_pyarrow_table().column("InvoiceNumber")
        return sorted(rows.to_pylist())

    drop(folder, "a.json", [invoice(1), invoice(2)])
    load_landing(spark, spec, bronze, now=NOW)
    run()
    assert invoices() == ["INV1", "INV2"]
    assert covered_version(headers, bronze) == bronze.open().version()

    version = headers.open().version()
    run()  # bronze has nothing new: no commit
    assert headers.open().version() == version

    drop(folder, "b.json", [invoice(3)])
    load_landing(spark, spec, bronze, now=NOW + timedelta(minutes=5))
    run()
    assert invoices() == ["INV1", "INV2", "INV3"]
    assert covered_version(headers, bronze) == bronze.open().version()
    assert delta_commits.parse(headers.open().history(1)[0])["upstream"] == "invoices_bronze"


def test_a_file_rewritten_since_a_version_is_named_with_the_rows_of_its_older_version(
    spark, tmp_path
):
    folder = tmp_path / "landing"
    folder.mkdir()
    spec = landing_spec(folder)
    bronze = DeltaTarget("invoices_bronze", str(tmp_path / "warehouse" / "invoices_bronze"))
    drop(folder, "a.json", [invoice(1), invoice(2)])
    drop(folder, "b.json", [invoice(3)])
    load_landing(spark, spec, bronze, now=NOW)
    since = bronze.open().version()
    assert rewritten_files(bronze, since) == {}

    drop(folder, "a.json", [invoice(1)], modified=OLD + timedelta(minutes=1))
    load_landing(spark, spec, bronze, now=NOW + timedelta(minutes=5))
    files = rewritten_files(bronze, since)
    assert [Path(p).name for p in files] == ["a.json"]
    assert rewritten_files(bronze, bronze.open().version()) == {}

    rows = delta_io.read_files(spark, bronze.open()).alias("t")
    older = rows.filter(older_versions("t", files)).select("InvoiceNumber").collect()
    assert sorted(r["InvoiceNumber"] for r in older) == ["INV1", "INV2"]
