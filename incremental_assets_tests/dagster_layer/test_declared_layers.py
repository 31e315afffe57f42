"""Declared layers as Dagster assets (dagster_layer/declared.py): each downstream of its
upstream's asset, reporting the rows it read and merged and the upstream versions it
covered, with its checks passing on a real instance (a re-run with nothing new upstream
commits nothing: incremental_assets_tests/engine/test_declared_layers.py); a streaming
layer reports its batches, rows, offsets, checkpoint and late rows, and its check fails
naming how many rows it dropped as late; a row layer streaming a folder's files reports
its run with its key checks."""

from __future__ import annotations

import dagster as dg
import pytest

from incremental_assets_tests.builders import (
    ORDERS_YAML,
    STREAMING_YAML,
    InvoiceFiles,
    Project,
    at,
)

LAYERS_YAML = """
layers:
  - name: paid_orders
    from: orders
    select: SELECT order_id, amount FROM orders WHERE status = 'paid'
    keys: [order_id]
  - name: orders_by_status
    kind: aggregate
    from: orders
    group_by: [status]
    aggregates:
      - {name: total, function: sum, column: amount}
      - {name: orders, function: count}
  - name: paid_orders_doubled
    from: paid_orders
    run: streaming
    select: SELECT order_id, amount * 2 AS doubled FROM paid_orders
    keys: [order_id]
"""
FILES_LAYER = """
  - name: invoices_clean
    from: invoices
    run: streaming
    reads: files
    select: SELECT InvoiceID, CustomerID, TotalAmount FROM invoices
    keys: [InvoiceID]
"""
LAYERS = ("paid_orders", "orders_by_status")
STREAMED = "paid_orders_doubled"


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def metadata_of(result, name: str) -> dict:
    event = result.asset_materializations_for_node(name)[-1]
    return {k: v.value for k, v in event.metadata.items()}


def checks_of(result, name: str) -> dict[str, bool]:
    evaluations = result.get_asset_check_evaluations()
    return {c.check_name: c.passed for c in evaluations if c.asset_key == dg.AssetKey(name)}


def test_declared_layers_materialize_after_their_table_with_metadata_and_checks(
    tmp_path, spark, instance
):
    project = Project(tmp_path, ORDERS_YAML + LAYERS_YAML)
    layers = [project.defs.get_assets_def(name) for name in LAYERS]
    for asset in layers:
        assert asset.dependency_keys == {dg.AssetKey("orders")}
    layers.append(project.defs.get_assets_def(STREAMED))
    assert layers[-1].dependency_keys == {dg.AssetKey("paid_orders")}

    def refresh():
        return dg.materialize(layers, instance=instance, resources=project.defs.resources)

    project.source.upsert([(1, "paid", 1.0, at(1, 5)), (2, "placed", 2.0, at(1, 6))])
    project.materialize(instance, "2026-01-01")
    first = refresh()
    silver = metadata_of(first, "paid_orders")
    assert (silver["upstream_version_from"], silver["rows_in"], silver["rows_merged"]) == (-1, 2, 1)
    assert silver["dagster/row_count"] == 1
    assert checks_of(first, "paid_orders") == {
        "keys_unique": True,
        "keys_not_null": True,
        "counts_reconciled_with_upstream": True,
    }
    assert checks_of(first, "orders_by_status") == {
        "keys_unique": True,
        "sample_matches_full_aggregation": True,
    }
    streamed = metadata_of(first, STREAMED)
    assert (streamed["run"], streamed["rows_out"], streamed["dagster/row_count"]) == (
        "streaming",
        1,
        1,
    )
    # It read the silver layer up to the version the silver run committed.
    assert streamed["upstream_version_to"] == silver["delta_version"]
    assert checks_of(first, STREAMED) == {
        "keys_unique": True,
        "keys_not_null": True,
        "counts_reconciled_with_upstream": True,
    }

    project.source.upsert([(2, "paid", 2.5, at(2, 1)), (3, "placed", 3.0, at(2, 2))])
    project.materialize(instance, "2026-01-02")
    second = refresh()
    silver = metadata_of(second, "paid_orders")
    assert (
        silver["upstream_version_from"] == metadata_of(first, "paid_orders")["upstream_version_to"]
    )
    assert silver["versions_covered"] == (
        f"{silver['upstream_version_from'] + 1}..{silver['upstream_version_to']}"
    )
    assert silver["rows_inserted"] == 1  # order 2 is paid now
    assert silver["dagster/row_count"] == 2
    gold = metadata_of(second, "orders_by_status")
    assert gold["committed"] and gold["groups_recomputed"] >= 1
    assert all(checks_of(second, name) and all(checks_of(second, name).values()) for name in LAYERS)
    streamed = metadata_of(second, STREAMED)
    # The row the silver run merged (order 2 inserted) reached the stream through the
    # silver's change data feed; order 1, re-read because its file held a changed row,
    # came out as the silver held it and was left alone, so the stream did not see it.
    assert (silver["rows_merged"], silver["rows_updated"]) == (1, 0)
    assert streamed["rows_out"] == 1
    assert streamed["dagster/row_count"] == 2
    assert all(checks_of(second, STREAMED).values())


def test_a_streaming_layer_reports_its_run_and_its_check_fails_naming_the_late_rows(
    tmp_path, spark, instance
):
    project = Project(tmp_path, STREAMING_YAML + FILES_LAYER)
    layer = project.defs.get_assets_def("invoice_totals")
    assert layer.dependency_keys == {dg.AssetKey("invoices")}
    clean = project.defs.get_assets_def("invoices_clean")
    assert (
        "over the files that arrived in invoices's folder"
        in clean.descriptions_by_key[dg.AssetKey("invoices_clean")]
    )
    files = InvoiceFiles(tmp_path)
    # One batch per file. Spark judges a batch's rows against the watermark the batch
    # before applied: 11:30 from the third batch on.
    files.drop(("I1", "C1", "2026-01-01 10:10:00", 10.0), ("I2", "C1", "2026-01-01 12:30:00", 2.0))
    files.drop(("I3", "C1", "2026-01-01 12:40:00", 1.0))
    files.drop(("I4", "C2", "2026-01-01 10:30:00", 7.0))  # behind the watermark: dropped

    result = dg.materialize([layer, clean], instance=instance, resources=project.defs.resources)
    metadata = metadata_of(result, "invoice_totals")
    assert (metadata["run"], metadata["rows_in"], metadata["late_rows_dropped"]) == (
        "streaming",
        4,
        1,
    )
    assert (metadata["batches"], metadata["batch_ids"], metadata["rows_out"]) == (3, "0..2", 3)
    assert metadata["checkpoint"].endswith("/warehouse/invoice_totals__checkpoint")
    assert metadata["source_offsets_to"] != "-" and metadata["dagster/row_count"] == 2
    assert checks_of(result, "invoice_totals") == {
        "keys_unique": True,
        "no_late_rows_dropped": False,
    }
    late = next(
        c for c in result.get_asset_check_evaluations() if c.check_name == "no_late_rows_dropped"
    )
    assert late.description.startswith("1 row arrived behind the watermark")

    # The same files streamed row by row into a row layer, its folder's table never loaded.
    rows = metadata_of(result, "invoices_clean")
    assert (rows["run"], rows["batches"], rows["rows_in"], rows["rows_out"]) == (
        "streaming",
        3,
        4,
        4,
    )
    assert "upstream_version_to" not in rows and rows["dagster/row_count"] == 4
    assert checks_of(result, "invoices_clean") == {"keys_unique": True, "keys_not_null": True}
