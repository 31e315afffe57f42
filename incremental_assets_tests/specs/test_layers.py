"""Declared layers in the tables file (specs/layers.py): a good declaration loads with its
kind and keys; each bad one fails at load with one problem naming the layer and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from incremental_assets.specs.layers import WINDOW_END, WINDOW_START
from incremental_assets.specs.loader import SpecError, parse_project
from incremental_assets_tests.builders import invoices_chain

TABLE = {
    "name": "orders",
    "source": {"format": "delta", "path": "/data/source/orders"},
    "keys": ["order_id"],
    "watermark": {"column": "updated_at", "kind": "timestamp"},
    "strategy": "upsert",
    "partitioning": {"granularity": "daily", "start": "2026-01-01"},
}
SILVER = {
    "name": "orders_silver",
    "from": "orders",
    "select": "SELECT order_id, CAST(amount AS DOUBLE) AS amount FROM orders WHERE amount > 0",
    "keys": ["order_id"],
}
GOLD = {
    "name": "revenue_hourly",
    "kind": "aggregate",
    "from": "orders_silver",
    "group_by": ["customer_id"],
    "window": {"column": "updated_at", "size": "1h"},
    "aggregates": [
        {"name": "revenue", "function": "sum", "column": "amount"},
        {"name": "orders", "function": "count"},
    ],
}


def project(*layers: dict):
    raw = {"warehouse": {"root": "/data/warehouse"}, "tables": [TABLE], "layers": list(layers)}
    return parse_project(raw, source="tables.yaml", base_dir=Path("/data"))


def test_declared_layers_load_with_their_kind_upstream_and_keys():
    loaded = project(SILVER, GOLD)
    silver, gold = loaded.layers
    assert (silver.kind, silver.upstream, silver.keys_of_layer) == ("row", "orders", ("order_id",))
    assert (gold.kind, gold.upstream) == ("aggregate", "orders_silver")
    assert gold.keys_of_layer == ("customer_id", WINDOW_START, WINDOW_END)
    assert gold.window.spark_duration == "3600 seconds"
    assert loaded.layer_path(gold) == "/data/warehouse/revenue_hourly"


@pytest.mark.parametrize(
    ("layer", "field", "fragment"),
    [
        ({**SILVER, "from": "ordrs"}, "from", "unknown upstream 'ordrs' (did you mean 'orders'?)"),
        ({**GOLD, "from": "later_layer"}, "from", "declared before this one"),
        ({**SILVER, "select": "SELECT * FROM orders; DROP TABLE x"}, "select", "';'"),
        ({**SILVER, "select": "SELECT '${env:PW}' AS pw FROM orders"}, "select", "'${'"),
        ({**SILVER, "select": "DELETE FROM orders"}, "select", "one query"),
        (
            {**SILVER, "select": "WITH a AS (SELECT 1) INSERT INTO b SELECT * FROM orders"},
            "select",
            "INSERT at position",
        ),
        ({**SILVER, "select": "SELECT reflect('a', 'b') FROM orders"}, "select", "Java"),
        ({**SILVER, "select": "SELECT * FROM customers"}, "select", "does not read its upstream"),
        ({**SILVER, "name": "ORDERS"}, "name", "already the name of a table"),
        ({**SILVER, "name": "orders__x"}, "name", "one '_'"),
        ({k: v for k, v in SILVER.items() if k != "keys"}, "keys", "required"),
        ({**SILVER, "kind": "gold"}, "kind", "use one of row, aggregate"),
        ({**GOLD, "from": "orders", "group_by": [], "window": None}, "group_by", "no window"),
        (
            {**GOLD, "from": "orders", "aggregates": [{"name": "a", "function": "avg"}]},
            "aggregates.function",
            "'avg'",
        ),
        ({**GOLD, "from": "orders", "window": {"column": "t", "size": "0s"}}, "window.size", "1s"),
        ({**SILVER, "newest": {"by": ["order_id"]}}, "newest.by", "a key column cannot order"),
        ({**SILVER, "newest": {"replaces": ["amount"]}}, "newest.by", "required"),
        ({**SILVER, "newest": {"by": ["t", "T"]}}, "newest.by", "listed twice"),
        (
            {**GOLD, "from": "orders", "aggregates": [{"name": "a", "function": "sum"}]},
            "aggregates.column",
            "only count works without a column",
        ),
    ],
)
def test_a_bad_declaration_is_one_problem_naming_the_layer_and_field(layer, field, fragment):
    with pytest.raises(SpecError) as caught:
        project(layer) if layer["name"] != "revenue_hourly" else project(SILVER, layer)
    problems = [p for p in caught.value.problems if p[1] != "-"]
    assert len(problems) == 1, caught.value
    name, got_field, message = problems[0]
    assert (name, got_field) == (layer["name"], field)
    assert fragment in message
    assert f"layer '{layer['name']}', field '{field}'" in str(caught.value)


def test_the_layers_of_docs_layers_md_load():
    page = (Path(__file__).parents[2] / "docs" / "layers.md").read_text()
    block = page.split("## Declared layers", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    declared = yaml.safe_load(block)["layers"]
    customers = {**TABLE, "name": "customers", "keys": ["customer_id"]}
    customers["source"] = {"format": "delta", "path": "/data/source/customers"}
    raw = {"warehouse": {"root": "/w"}, "tables": [TABLE, customers], "layers": declared}
    loaded = parse_project(raw, source="docs/layers.md", base_dir=Path("/data"))
    assert [(x.name, x.kind) for x in loaded.layers] == [
        ("orders_silver", "row"),
        ("revenue_hourly", "aggregate"),
    ]


@pytest.mark.parametrize(
    ("path", "relation"),
    [
        ("/data/warehouse/orders_silver", "is"),
        ("/data/warehouse/orders_silver/inner", "lies inside"),
        ("/data/warehouse", "contains"),
    ],
)
def test_a_table_writing_into_a_layers_folder_fails_naming_both(path, relation):
    other = {**TABLE, "name": "refunds", "source": {"format": "delta", "path": "/data/r"}}
    raw = {
        "warehouse": {"root": "/data/warehouse"},
        "tables": [TABLE, {**other, "target": {"path": path}}],
        "layers": [SILVER],
    }
    with pytest.raises(SpecError) as caught:
        parse_project(raw, source="tables.yaml", base_dir=Path("/data"))
    text = str(caught.value)
    assert "table 'refunds', field 'target.path'" in text
    assert f"{relation} the folder of layer 'orders_silver'" in text
    assert "rename the layer" in text


def test_the_invoices_layers_of_docs_layers_md_are_the_demos():
    root = Path(__file__).parents[2]
    page = (root / "docs" / "layers.md").read_text()
    block = page.split("### Newest versions", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    documented = yaml.safe_load(block)["layers"]
    declared = invoices_chain(yaml.safe_load((root / "tables.yaml").read_text())["layers"])
    drop = ("description",)
    assert documented == [{k: v for k, v in x.items() if k not in drop} for x in declared]


def test_the_streaming_layer_of_docs_layers_md_is_the_demos():
    root = Path(__file__).parents[2]
    page = (root / "docs" / "layers.md").read_text()
    block = page.split("## Streaming layers", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    documented = yaml.safe_load(block)["layers"]
    declared = yaml.safe_load((root / "tables.yaml").read_text())["layers"]
    streamed = [x for x in declared if x.get("run") == "streaming"]
    assert [x["name"] for x in streamed] == ["invoice_totals_hourly"]
    assert documented == [{k: v for k, v in x.items() if k != "description"} for x in streamed]


INVOICES = {
    "name": "invoices",
    "source": {
        "format": "csv",
        "path": "/data/landing/invoices",
        "schema": "InvoiceID STRING, CustomerID STRING, InvoiceDate TIMESTAMP, TotalAmount DOUBLE",
        "options": {"header": "true"},
        "landing": {},
    },
    "strategy": "append",
    "partitioning": {"granularity": "daily", "start": "2026-01-01"},
}
STREAMED = {
    "name": "invoice_totals_hourly",
    "kind": "aggregate",
    "from": "invoices",
    "run": "streaming",
    "group_by": ["CustomerID"],
    "window": {"column": "InvoiceDate", "size": "1h", "watermark": "1h"},
    "aggregates": [{"name": "total_amount", "function": "sum", "column": "TotalAmount"}],
}


def streamed_project(*layers: dict, table: dict = INVOICES):
    raw = {
        "warehouse": {"root": "/data/warehouse"},
        "tables": [table, TABLE],
        "layers": list(layers),
    }
    return parse_project(raw, source="tables.yaml", base_dir=Path("/data"))


def test_a_streaming_layer_loads_with_its_watermark_and_batch_stays_the_default():
    streamed = streamed_project(STREAMED).layers[0]
    assert (streamed.run, streamed.streaming) == ("streaming", True)
    assert streamed.window.spark_delay == "3600 seconds"
    assert not project(SILVER, GOLD).layers[1].streaming
    # After a table read from a Delta source, or a layer: the upstream's Delta table.
    assert streamed_project({**STREAMED, "from": "orders"}).layers[0].streaming
    assert streamed_project(SILVER, {**STREAMED, "from": "orders_silver"}).layers[1].streaming
    # A row layer streams its upstream's Delta table (a folder table's too).
    assert streamed_project({**SILVER, "run": "streaming"}).layers[0].streaming
    over_files = {**SILVER, "from": "invoices", "select": "SELECT * FROM invoices"}
    over_files |= {"keys": ["InvoiceID"], "run": "streaming"}
    assert streamed_project(over_files).layers[0].reads == "table"
    # Or, said so, the folder table's files themselves.
    assert streamed_project(FILES_SILVER).layers[0].reads == "files"
    # Without a declared schema, the first run infers one and keeps it.
    assert streamed_project(FILES_SILVER, table=NO_SCHEMA).layers[0].reads == "files"
    assert streamed_project(STREAMED, table=NO_SCHEMA).layers[0].streaming


# Over a layer (its change data feed), a max cannot be subtracted when a row goes.
OVER_SILVER_MAX = {
    **STREAMED,
    "from": "orders_silver",
    "aggregates": [{"name": "largest", "function": "max", "column": "amount"}],
}


FILES_SILVER = {
    "name": "invoices_clean",
    "from": "invoices",
    "run": "streaming",
    "reads": "files",
    "select": "SELECT InvoiceID, TotalAmount FROM invoices",
    "keys": ["InvoiceID"],
}
NO_SCHEMA = {**INVOICES, "source": {**INVOICES["source"], "format": "parquet", "schema": None}}


@pytest.mark.parametrize(
    ("layer", "table", "field", "fragment"),
    [
        ({**STREAMED, "window": None}, INVOICES, "window", "needs a window with a watermark"),
        (
            {**STREAMED, "window": {"column": "InvoiceDate", "size": "1h"}},
            INVOICES,
            "window.watermark",
            "needs the window's watermark",
        ),
        ({**STREAMED, "run": "batch"}, INVOICES, "window.watermark", "set run: streaming"),
        ({**STREAMED, "run": "stream"}, INVOICES, "run", "'batch' or 'streaming'"),
        (
            {**SILVER, "run": "streaming", "newest": {"by": ["amount"]}},
            INVOICES,
            "newest",
            "runs in batch only",
        ),
        ({**FILES_SILVER, "run": "batch"}, INVOICES, "reads", "set run: streaming"),
        ({**FILES_SILVER, "reads": "folder"}, INVOICES, "reads", "'table' or 'files'"),
        (
            {**FILES_SILVER, "from": "orders", "select": "SELECT * FROM orders"},
            INVOICES,
            "reads",
            "'orders' is a table read from delta",
        ),
    ],
)
def test_a_bad_streaming_declaration_is_one_problem_naming_the_layer_and_field(
    layer, table, field, fragment
):
    with pytest.raises(SpecError) as caught:
        streamed_project(layer, table=table)
    problems = [p for p in caught.value.problems if p[1] != "-"]
    assert len(problems) == 1, caught.value
    assert problems[0][:2] == (layer["name"], field)
    assert fragment in problems[0][2]


def test_a_streaming_layer_over_a_layer_refuses_aggregates_it_cannot_subtract():
    with pytest.raises(SpecError) as caught:
        streamed_project(SILVER, OVER_SILVER_MAX)
    problems = [p for p in caught.value.problems if p[1] != "-"]
    assert len(problems) == 1, caught.value
    assert problems[0][:2] == ("invoice_totals_hourly", "aggregates")
    assert "largest: a streaming layer after the layer 'orders_silver'" in problems[0][2]
    assert "only sum and count" in problems[0][2] and "set run: batch" in problems[0][2]
