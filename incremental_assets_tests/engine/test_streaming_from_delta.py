"""A streaming aggregate layer over an upstream Delta table
(engine/declared_layers/stream_sources.py): after a row layer it reads the layer's change
data feed, so an update changes its group's sums, a deleted or filtered-out row leaves
them, a group left with no row is deleted, and a change to a row behind the watermark is
dropped and counted; after a table without a change feed it reads the appended rows, and
an upstream update fails the run naming the fix, with nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import functions as F

from incremental_assets.engine.declared_layers import layer_inputs, refresh_layer, stream_layer
from incremental_assets.engine.errors import LayerError
from incremental_assets.specs import load_project

PROJECT = """
warehouse: {root: ./warehouse}
tables:
  - name: orders
    source: {format: delta, path: ./source/orders}
    keys: [order_id]
    watermark: {column: updated_at, kind: timestamp}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
layers:
  - name: orders_silver
    from: orders
    select: SELECT order_id, customer_id, amount, updated_at FROM orders WHERE status <> 'void'
    keys: [order_id]
  - name: sales_stream
    kind: aggregate
    from: orders_silver
    run: streaming
    group_by: [customer_id]
    window: {column: updated_at, size: 1h, watermark: 4h}
    aggregates:
      - {name: revenue, function: sum, column: amount}
      - {name: orders, function: count}
  - name: appended_stream
    kind: aggregate
    from: orders
    run: streaming
    group_by: [customer_id]
    window: {column: updated_at, size: 1h, watermark: 4h}
    aggregates:
      - {name: revenue, function: sum, column: amount}
      - {name: largest, function: max, column: amount}
"""
COLUMNS = ["customer_id", "window_start", "window_end", "revenue", "orders"]


class Warehouse:
    """The ``orders`` table (no change data feed), written with Spark SQL as the loader
    would, its silver layer refreshed in batch and the streaming layers after them."""

    def __init__(self, spark, root: Path):
        (root / "tables.yaml").write_text(PROJECT)
        self.spark = spark
        self.project = load_project(root / "tables.yaml")
        self.orders = f"delta.`{root}/warehouse/orders`"
        spark.sql(
            f"CREATE TABLE {self.orders} (order_id INT, customer_id INT, status STRING, "
            "amount DOUBLE, updated_at TIMESTAMP) USING delta"
        )

    def sql(self, text: str) -> None:
        self.spark.sql(text.format(orders=self.orders))

    def inputs(self, name: str):
        return layer_inputs(self.project, self.project.layer(name))

    def table(self, name: str):
        if name == "orders":
            return self.spark.sql(f"SELECT * FROM {self.orders}")
        return self.spark.read.format("delta").load(self.inputs(name).target.spark_path)

    def refresh(self):
        """The silver layer refreshed in batch, then the streaming gold after it."""
        refresh_layer(self.spark, self.inputs("orders_silver"))
        return stream_layer(self.spark, self.inputs("sales_stream"))

    def gold(self) -> list[tuple]:
        return sorted(tuple(r) for r in self.table("sales_stream").select(*COLUMNS).collect())

    def gold_from_scratch(self, upstream: str = "orders_silver", largest: bool = False):
        """Per customer and hour of ``upstream``: sum of amount and count (or max)."""
        last = F.max("amount") if largest else F.count(F.lit(1))
        rows = (
            self.table(upstream)
            .groupBy("customer_id", F.window("updated_at", "1 hour").alias("w"))
            .agg(F.sum("amount").alias("revenue"), last.alias("last"))
            .select("customer_id", "w.start", "w.end", "revenue", "last")
            .collect()
        )
        return sorted(tuple(r) for r in rows)


def order(number: int, customer: int, amount: float, at: str, status: str = "placed") -> str:
    return f"({number}, {customer}, '{status}', {amount}, TIMESTAMP'2026-01-01 {at}')"


def test_a_stream_over_a_layers_change_feed_follows_updates_and_deletes_and_drops_late_changes(
    spark, tmp_path
):
    warehouse = Warehouse(spark, tmp_path)
    first = [
        order(1, 10, 5.0, "00:10:00"),
        order(2, 10, 3.0, "00:20:00"),
        order(3, 11, 4.0, "01:10:00"),
        order(4, 12, 6.0, "02:10:00"),
    ]
    warehouse.sql(f"INSERT INTO {{orders}} VALUES {', '.join(first)}")
    run = warehouse.refresh()
    assert run.batches >= 1 and (run.rows_in, run.late_rows_dropped) == (4, 0)
    assert warehouse.gold() == warehouse.gold_from_scratch()

    # Through silver: order 1 updated, order 2 filtered out, order 3 deleted (customer
    # 11's only order: its group goes), order 5 new.
    warehouse.sql("UPDATE {orders} SET amount = 7.0 WHERE order_id = 1")
    warehouse.sql("UPDATE {orders} SET status = 'void' WHERE order_id = 2")
    warehouse.sql("DELETE FROM {orders} WHERE order_id = 3")
    warehouse.sql(f"INSERT INTO {{orders}} VALUES {order(5, 13, 2.0, '04:10:00')}")
    run = warehouse.refresh()
    assert run.late_rows_dropped == 0 and run.committed
    gold = warehouse.gold()
    assert gold == warehouse.gold_from_scratch()
    assert [g for g in gold if g[0] == 11] == []  # the emptied group is deleted
    assert [g[3:] for g in gold if g[0] == 10] == [(7.0, 1)]

    # An order at 08:10 moves the watermark to 04:10: the 00:00 window is closed, and a
    # change to order 1 then is dropped (its old and new rows), counted, the window kept.
    warehouse.sql(f"INSERT INTO {{orders}} VALUES {order(6, 12, 1.0, '08:10:00')}")
    assert warehouse.refresh().late_rows_dropped == 0
    warehouse.sql("UPDATE {orders} SET amount = 9.0 WHERE order_id = 1")
    late = warehouse.refresh()
    assert late.late_rows_dropped >= 1 and late.rows_in == 2
    assert [g[3:] for g in warehouse.gold() if g[0] == 10] == [(7.0, 1)]
    differ = set(warehouse.gold()) ^ set(warehouse.gold_from_scratch())
    assert {g[0] for g in differ} == {10}  # only the late change's group


def test_a_stream_of_a_tables_appended_rows_fails_naming_the_fix_when_rows_change(spark, tmp_path):
    warehouse = Warehouse(spark, tmp_path)
    inputs = warehouse.inputs("appended_stream")
    warehouse.sql(
        f"INSERT INTO {{orders}} VALUES {order(1, 10, 5.0, '00:10:00')}, "
        f"{order(2, 10, 3.0, '00:20:00')}, {order(3, 11, 4.0, '01:10:00')}"
    )
    first = stream_layer(spark, inputs)
    assert first.rows_in == 3
    rows = warehouse.table("appended_stream").select(*COLUMNS[:4], "largest").collect()
    assert sorted(tuple(r) for r in rows) == warehouse.gold_from_scratch("orders", largest=True)

    version = inputs.target.open().version()
    warehouse.sql("UPDATE {orders} SET amount = 7.0 WHERE order_id = 1")
    with pytest.raises(LayerError) as caught:
        stream_layer(spark, inputs)
    text = str(caught.value)
    assert "layer 'appended_stream', field 'from'" in text
    assert "updated or deleted rows" in text and "delta.enableChangeDataFeed" in text
    assert "incremental-assets reset-layer appended_stream" in text
    assert inputs.target.open().version() == version
