"""A streaming row layer (engine/declared_layers/streaming_rows.py): over a table's change
data feed it follows inserts, updates (several of one key in one run), deletes and rows
its filter drops, joined to another table, and equals its select over the upstream after
every run; the reconciliation check counts at the version the run covered; a run with
nothing new commits nothing; a run killed with SIGKILL right after a batch's MERGE resumes
with nothing lost or doubled; over a table without a feed it upserts appended rows and an
update fails naming the fix; a changed select is refused until the reset."""

from __future__ import annotations

from pathlib import Path

import pytest

from incremental_assets.engine.declared_layers import layer_inputs, stream_layer
from incremental_assets.engine.declared_layers.checks import counts_reconciled
from incremental_assets.engine.errors import LayerError, StreamCheckpointError
from incremental_assets.engine.streaming.checkpoint import reset
from incremental_assets.specs import load_project
from incremental_assets.specs.loader import SpecError
from incremental_assets_tests.builders import stream_killed

SELECT = (
    "SELECT o.order_id, o.amount, c.country FROM orders o "
    "JOIN customers c ON c.customer_id = o.customer_id WHERE o.status <> 'void'"
)
PROJECT = f"""
warehouse: {{root: ./warehouse}}
tables:
  - name: orders
    source: {{format: delta, path: ./source/orders}}
    keys: [order_id]
    watermark: {{column: updated_at, kind: timestamp}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
  - name: customers
    source: {{format: delta, path: ./source/customers}}
    keys: [customer_id]
    watermark: {{column: updated_at, kind: timestamp}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
layers:
  - name: orders_clean
    from: orders
    run: streaming
    select: {SELECT}
    keys: [order_id]
"""


class Warehouse:
    """``orders`` (with or without its change data feed) and ``customers``, written with
    Spark SQL as the loader would, and the streaming row layer after ``orders``."""

    def __init__(self, spark, root: Path, feed: bool = True, project: str = PROJECT):
        (root / "tables.yaml").write_text(project)
        self.spark, self.root = spark, root
        self.project = load_project(root / "tables.yaml")
        self.orders = f"delta.`{root}/warehouse/orders`"
        properties = " TBLPROPERTIES (delta.enableChangeDataFeed = true)" if feed else ""
        spark.sql(
            f"CREATE TABLE {self.orders} (order_id INT, customer_id INT, status STRING, "
            f"amount DOUBLE, updated_at TIMESTAMP) USING delta{properties}"
        )
        customers = f"delta.`{root}/warehouse/customers`"
        spark.sql(f"CREATE TABLE {customers} (customer_id INT, country STRING) USING delta")
        spark.sql(f"INSERT INTO {customers} VALUES (10, 'FR'), (11, 'DE'), (12, 'IT')")
        self.inputs = layer_inputs(self.project, self.project.layer("orders_clean"))

    def sql(self, text: str) -> None:
        self.spark.sql(text.format(orders=self.orders))

    def run(self):
        return stream_layer(self.spark, self.inputs)

    def rows(self) -> list[tuple]:
        frame = self.spark.read.format("delta").load(self.inputs.target.spark_path)
        return sorted(tuple(r) for r in frame.select("order_id", "amount", "country").collect())

    def expected(self) -> list[tuple]:
        """The select over the whole upstream as it is now."""
        self.spark.sql(f"SELECT * FROM {self.orders}").createOrReplaceTempView("orders")
        customers = f"delta.`{self.root}/warehouse/customers`"
        self.spark.sql(f"SELECT * FROM {customers}").createOrReplaceTempView("customers")
        return sorted(tuple(r) for r in self.spark.sql(SELECT).collect())

    def commits(self) -> list[str]:
        return [h["operation"] for h in self.inputs.target.open().history()]


def order(number: int, customer: int, amount: float, status: str = "placed") -> str:
    return f"({number}, {customer}, '{status}', {amount}, TIMESTAMP'2026-01-01 00:00:00')"


def test_a_stream_over_a_change_feed_follows_every_change_and_equals_its_select(spark, tmp_path):
    warehouse = Warehouse(spark, tmp_path)
    placed = [order(1, 10, 5.0), order(2, 10, 3.0), order(3, 11, 4.0), order(4, 99, 6.0)]
    warehouse.sql(f"INSERT INTO {{orders}} VALUES {', '.join(placed)}")
    first = warehouse.run()
    assert first.batches == 1 and first.rows_in == 4 and first.committed
    # Order 4's customer is unknown: the join leaves it out.
    assert warehouse.rows() == warehouse.expected() and len(warehouse.rows()) == 3
    assert first.rows_out == 3
    assert first.upstream_version == warehouse.inputs.upstream.open().version()

    # One run: order 1 updated twice, order 2 voided (the filter drops it), order 3
    # deleted, order 5 inserted then deleted, order 6 new, order 4's customer now known.
    for statement in (
        "UPDATE {orders} SET amount = 7.0 WHERE order_id = 1",
        "UPDATE {orders} SET amount = 8.0 WHERE order_id = 1",
        "UPDATE {orders} SET status = 'void' WHERE order_id = 2",
        "DELETE FROM {orders} WHERE order_id = 3",
        f"INSERT INTO {{orders}} VALUES {order(5, 12, 1.0)}, {order(6, 12, 2.0)}",
        "DELETE FROM {orders} WHERE order_id = 5",
        "UPDATE {orders} SET customer_id = 11 WHERE order_id = 4",
    ):
        warehouse.sql(statement)
    second = warehouse.run()
    assert second.committed and second.batches == 1
    assert warehouse.rows() == warehouse.expected()
    assert warehouse.rows() == [(1, 8.0, "FR"), (4, 6.0, "DE"), (6, 2.0, "IT")]
    # Order 1 and 4 updated or inserted, 6 inserted, 2 and 3 deleted.
    assert second.rows_out == 5
    reconciled = counts_reconciled(spark, warehouse.inputs, second.upstream_version)
    assert reconciled.passed, reconciled.description
    assert second.upstream_version == warehouse.inputs.upstream.open().version()

    # Maintenance changes no row: nothing to merge, nothing committed.
    warehouse.sql("OPTIMIZE {orders}")
    version = warehouse.inputs.target.open().version()
    idle = warehouse.run()
    assert not idle.committed and warehouse.inputs.target.open().version() == version
    assert counts_reconciled(spark, warehouse.inputs, idle.upstream_version).passed

    # The check fails when the layer does not hold what the select gives.
    spark.sql(f"DELETE FROM delta.`{warehouse.inputs.target.spark_path}` WHERE order_id = 6")
    broken = counts_reconciled(spark, warehouse.inputs, idle.upstream_version)
    assert not broken.passed and "holds 2 rows" in broken.description


def test_a_run_killed_after_a_batch_merged_resumes_with_nothing_lost_or_doubled(spark, tmp_path):
    warehouse = Warehouse(spark, tmp_path)
    warehouse.sql(f"INSERT INTO {{orders}} VALUES {order(1, 10, 5.0)}, {order(2, 11, 3.0)}")
    warehouse.run()
    warehouse.sql("UPDATE {orders} SET amount = 7.0 WHERE order_id = 1")
    warehouse.sql(f"INSERT INTO {{orders}} VALUES {order(3, 12, 1.0)}")
    done = stream_killed(tmp_path / "tables.yaml", "orders_clean")
    assert done.returncode == -9, done.stderr[-3000:]  # killed inside batch 1, after its MERGE
    assert warehouse.commits().count("MERGE") == 1  # merged; the checkpoint does not know

    resumed = warehouse.run()
    # Batch 1 ran again and its write was skipped: still one MERGE, and exact.
    assert resumed.batch_ids == (1, 1) and not resumed.committed
    assert warehouse.commits().count("MERGE") == 1
    assert (
        warehouse.rows()
        == warehouse.expected()
        == [
            (1, 7.0, "FR"),
            (2, 3.0, "DE"),
            (3, 1.0, "IT"),
        ]
    )


def test_appended_rows_are_upserted_and_an_update_fails_naming_the_fix(spark, tmp_path):
    warehouse = Warehouse(spark, tmp_path, feed=False)
    warehouse.sql(f"INSERT INTO {{orders}} VALUES {order(1, 10, 5.0)}, {order(2, 11, 3.0)}")
    assert warehouse.run().rows_in == 2
    warehouse.sql(f"INSERT INTO {{orders}} VALUES {order(3, 12, 1.0)}")
    assert warehouse.run().rows_in == 1
    assert warehouse.rows() == warehouse.expected()

    version = warehouse.inputs.target.open().version()
    warehouse.sql("UPDATE {orders} SET amount = 7.0 WHERE order_id = 1")
    with pytest.raises(LayerError) as caught:
        warehouse.run()
    text = str(caught.value)
    assert "layer 'orders_clean', field 'from'" in text and "delta.enableChangeDataFeed" in text
    assert "incremental-assets reset-layer orders_clean" in text
    assert warehouse.inputs.target.open().version() == version


def test_a_changed_select_is_refused_until_the_reset_and_a_bad_one_names_the_layer(spark, tmp_path):
    warehouse = Warehouse(spark, tmp_path)
    warehouse.sql(f"INSERT INTO {{orders}} VALUES {order(1, 10, 5.0)}, {order(2, 11, 3.0)}")
    bad = PROJECT.replace("o.amount, c.country", "o.amount, c.country, o.no_such_column")
    (tmp_path / "tables.yaml").write_text(bad)
    project = load_project(tmp_path / "tables.yaml")
    with pytest.raises(LayerError) as caught:
        stream_layer(spark, layer_inputs(project, project.layer("orders_clean")))
    assert "layer 'orders_clean', field 'select'" in str(caught.value)
    assert "no_such_column" in str(caught.value)
    assert not warehouse.inputs.target.exists()

    warehouse.run()
    version = warehouse.inputs.target.open().version()
    changed = PROJECT.replace("o.status <> 'void'", "o.amount > 4")
    (tmp_path / "tables.yaml").write_text(changed)
    project = load_project(tmp_path / "tables.yaml")
    inputs = layer_inputs(project, project.layer("orders_clean"))
    with pytest.raises(StreamCheckpointError) as caught:
        stream_layer(spark, inputs)
    text = str(caught.value)
    assert "field 'select'" in text and "the declared query changed" in text
    assert "incremental-assets reset-layer orders_clean" in text
    assert inputs.target.open().version() == version
    reset(spark, inputs.target)
    assert stream_layer(spark, inputs).rows_in == 2
    rows = spark.read.format("delta").load(inputs.target.spark_path).collect()
    assert sorted(r.order_id for r in rows) == [1]


def test_newest_is_refused_on_a_streaming_row_layer(tmp_path):
    newest = PROJECT + "    newest: {by: [amount]}\n"
    (tmp_path / "tables.yaml").write_text(newest)
    with pytest.raises(SpecError) as caught:
        load_project(tmp_path / "tables.yaml")
    text = str(caught.value)
    assert "newest" in text and "run: batch" in text
