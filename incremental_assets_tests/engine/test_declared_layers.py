"""Declared layers refreshed from what changed upstream (engine/declared_layers/): a row
layer follows inserts, updates and deletes over several runs and equals its SELECT over
the upstream from scratch after each, by the change data feed or by the files added and
removed; an aggregate layer recomputes only the groups the changes touched and equals a
from-scratch aggregation; a run with no upstream change commits nothing; a run killed
before its commit is exact on the next run; a SELECT that cannot give the keys fails
naming the layer and field, with nothing written; over an upstream keeping every version
(``newest``), a group's newest version replaces its rows and an older one changes
nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from incremental_assets.engine.declared_layers import layer_inputs, refresh_layer
from incremental_assets.engine.declared_layers.checks import counts_reconciled, sample_matches
from incremental_assets.engine.errors import LayerError
from incremental_assets.engine.faults import CRASH_ENV
from incremental_assets.engine.layers import covered_version
from incremental_assets.specs import load_project
from incremental_assets_tests.builders import CHILD_SPARK_CONF

PROJECT = """
warehouse: {root: ./warehouse}
tables:
  - name: orders
    source: {format: delta, path: ./source/orders}
    keys: [order_id]
    watermark: {column: updated_at, kind: timestamp}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
  - name: customers
    source: {format: delta, path: ./source/customers}
    keys: [customer_id]
    watermark: {column: updated_at, kind: timestamp}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
  - name: doc_versions
    source: {format: delta, path: ./source/doc_versions}
    keys: [doc, version, item]
    watermark: {column: loaded_at, kind: timestamp}
    strategy: append
    partitioning: {granularity: daily, start: 2026-01-01}
layers:
  - name: orders_silver
    from: orders
    select: |
      SELECT o.order_id, o.amount * 2 AS doubled, upper(c.country) AS country
      FROM orders o JOIN customers c ON c.customer_id = o.customer_id
      WHERE o.status <> 'void'
    keys: [order_id]
  - name: sales_hourly
    kind: aggregate
    from: orders
    group_by: [customer_id]
    window: {column: updated_at, size: 1h}
    aggregates:
      - {name: revenue, function: sum, column: amount}
      - {name: orders, function: count}
      - {name: largest, function: max, column: amount}
  - name: no_key_column
    from: orders
    select: SELECT customer_id, amount FROM orders
    keys: [order_id]
  - name: one_row_per_customer_key
    from: orders
    select: SELECT customer_id AS k, amount FROM orders
    keys: [k]
  - name: doc_items
    from: doc_versions
    select: SELECT doc, item, qty, version FROM doc_versions
    keys: [doc, item]
    newest: {by: [version], replaces: [doc]}
  - name: doc_items_unversioned
    from: doc_versions
    select: SELECT doc, item, qty FROM doc_versions
    keys: [doc, item]
    newest: {by: [version]}
"""


class Warehouse:
    """The project's upstream tables, written with Spark SQL as any writer would."""

    def __init__(self, spark, root: Path, feed: bool):
        (root / "tables.yaml").write_text(PROJECT)
        self.spark, self.root = spark, root
        self.project = load_project(root / "tables.yaml")
        self.orders = f"delta.`{root}/warehouse/orders`"
        self.customers = f"delta.`{root}/warehouse/customers`"
        on = "true" if feed else "false"
        spark.sql(
            f"CREATE TABLE {self.orders} (order_id INT, customer_id INT, status STRING, "
            f"amount DOUBLE, updated_at TIMESTAMP) USING delta "
            f"TBLPROPERTIES ('delta.enableChangeDataFeed' = '{on}')"
        )
        spark.sql(f"CREATE TABLE {self.customers} (customer_id INT, country STRING) USING delta")
        spark.sql(
            f"INSERT INTO {self.customers} VALUES (10, 'fr'), (11, 'de'), (12, 'es'), (13, 'it')"
        )
        self.sql(
            "INSERT INTO {orders} VALUES "
            "(1, 10, 'placed', 5.0, TIMESTAMP'2026-01-01 00:10:00'), "
            "(2, 10, 'placed', 3.0, TIMESTAMP'2026-01-01 00:20:00'), "
            "(3, 11, 'placed', 4.0, TIMESTAMP'2026-01-01 01:10:00'), "
            "(4, 12, 'placed', 6.0, TIMESTAMP'2026-01-01 02:10:00'), "
            "(6, 13, 'placed', 1.0, TIMESTAMP'2026-01-01 03:10:00')"
        )

    def sql(self, text: str) -> None:
        self.spark.sql(text.format(orders=self.orders))

    def inputs(self, name: str):
        return layer_inputs(self.project, self.project.layer(name))

    def layer_rows(self, name: str, columns: list[str]) -> list[tuple]:
        path = self.project.layer_path(self.project.layer(name))
        rows = self.spark.read.format("delta").load(path).select(*columns).collect()
        return sorted(tuple(r) for r in rows)

    def silver_from_scratch(self) -> list[tuple]:
        rows = self.spark.sql(
            f"SELECT o.order_id, o.amount * 2 AS doubled, upper(c.country) AS country "
            f"FROM {self.orders} o JOIN {self.customers} c ON c.customer_id = o.customer_id "
            "WHERE o.status <> 'void'"
        ).collect()
        return sorted(tuple(r) for r in rows)

    def gold_from_scratch(self) -> list[tuple]:
        orders = self.spark.sql(f"SELECT * FROM {self.orders}")
        rows = (
            orders.groupBy("customer_id", F.window("updated_at", "1 hour").alias("w"))
            .agg(F.sum("amount"), F.count(F.lit(1)), F.max("amount"))
            .select("customer_id", "w.start", "w.end", "sum(amount)", "count(1)", "max(amount)")
            .collect()
        )
        return sorted(tuple(r) for r in rows)


SILVER = ["order_id", "doubled", "country"]
GOLD = ["customer_id", "window_start", "window_end", "revenue", "orders", "largest"]


def change_orders(warehouse: Warehouse) -> None:
    """An update, a row the filter now drops, a delete and an insert, in four commits."""
    warehouse.sql("UPDATE {orders} SET amount = 7.0 WHERE order_id = 1")
    warehouse.sql("UPDATE {orders} SET status = 'void' WHERE order_id = 2")
    warehouse.sql("DELETE FROM {orders} WHERE order_id = 3")
    warehouse.sql(
        "INSERT INTO {orders} VALUES (5, 11, 'placed', 2.0, TIMESTAMP'2026-01-01 04:10:00')"
    )


@pytest.mark.parametrize("feed", [True, False], ids=["change_feed", "files"])
def test_row_layer_follows_inserts_updates_and_deletes_and_equals_its_select_each_run(
    spark, tmp_path, feed
):
    warehouse = Warehouse(spark, tmp_path, feed)
    inputs = warehouse.inputs("orders_silver")

    first = refresh_layer(spark, inputs)
    assert (first.upstream_from, first.changes_from, first.rows_inserted) == (-1, "full read", 5)
    assert warehouse.layer_rows("orders_silver", SILVER) == warehouse.silver_from_scratch()

    change_orders(warehouse)
    second = refresh_layer(spark, inputs)
    assert warehouse.layer_rows("orders_silver", SILVER) == warehouse.silver_from_scratch()
    assert (second.upstream_from, second.upstream_to) == (first.upstream_to, first.upstream_to + 4)
    assert covered_version(inputs.target, inputs.upstream) == second.upstream_to
    # Order 2 (now void) and order 3 (deleted) leave the layer; 5 comes in; 1 is updated.
    assert (second.rows_inserted, second.rows_deleted) == (1, 2)
    if feed:
        # Only the changed keys are read: 1, 2 and 5 as they are now (3 is gone).
        assert (second.changes_from, second.rows_in, second.rows_updated) == (
            "change data feed",
            3,
            1,
        )
    else:
        assert second.changes_from == "added and removed files"
        return  # what follows is the layer's, whichever way the changes were found

    version = inputs.target.open().version()
    again = refresh_layer(spark, inputs)  # nothing new upstream: nothing committed
    assert (again.committed, inputs.target.open().version()) == (False, version)

    # A change the select does not see (a column it does not read): the layer's row stays
    # as it was, and its change data feed holds no update for the layers after it.
    warehouse.sql(
        "UPDATE {orders} SET updated_at = updated_at + INTERVAL 1 MINUTE WHERE order_id = 1"
    )
    unseen = refresh_layer(spark, inputs)
    assert (unseen.committed, unseen.rows_in, unseen.rows_updated) == (True, 1, 0)
    path = warehouse.project.layer_path(warehouse.project.layer("orders_silver"))
    feed_rows = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", version + 1)
        .load(path)
    )
    assert feed_rows.count() == 0

    warehouse.sql(
        "INSERT INTO {orders} VALUES (3, 12, 'placed', 9.0, TIMESTAMP'2026-01-01 05:10:00')"
    )
    warehouse.sql("UPDATE {orders} SET status = 'placed', customer_id = 13 WHERE order_id = 2")
    warehouse.sql("DELETE FROM {orders} WHERE order_id = 6")
    refresh_layer(spark, inputs)
    assert warehouse.layer_rows("orders_silver", SILVER) == warehouse.silver_from_scratch()
    assert counts_reconciled(spark, inputs).passed


def test_aggregate_layer_recomputes_only_touched_groups_and_equals_full_aggregation(
    spark, tmp_path
):
    warehouse = Warehouse(spark, tmp_path, feed=True)
    inputs = warehouse.inputs("sales_hourly")

    first = refresh_layer(spark, inputs)
    assert first.groups_recomputed == 4
    assert warehouse.layer_rows("sales_hourly", GOLD) == warehouse.gold_from_scratch()

    change_orders(warehouse)
    second = refresh_layer(spark, inputs)
    assert warehouse.layer_rows("sales_hourly", GOLD) == warehouse.gold_from_scratch()
    # Touched: customer 10 at 00:00 (orders 1, 2), 11 at 01:00 (3, deleted: the group goes),
    # 11 at 04:00 (5, new); 12 and 13 are not recomputed.
    assert (second.groups_recomputed, second.rows_inserted, second.rows_deleted) == (2, 1, 1)
    assert second.rows_updated == 1

    # An order moving to another customer and hour leaves its old group and joins another.
    warehouse.sql(
        "UPDATE {orders} SET customer_id = 13, updated_at = TIMESTAMP'2026-01-01 03:40:00' "
        "WHERE order_id = 4"
    )
    third = refresh_layer(spark, inputs)
    assert warehouse.layer_rows("sales_hourly", GOLD) == warehouse.gold_from_scratch()
    assert (third.groups_recomputed, third.rows_deleted) == (1, 1)
    assert sample_matches(spark, inputs).passed

    version = inputs.target.open().version()
    assert not refresh_layer(spark, inputs).committed
    assert inputs.target.open().version() == version

    # A group changed behind the layer's back is found by the sampled from-scratch check.
    gold = warehouse.project.layer_path(warehouse.project.layer("sales_hourly"))
    spark.sql(f"UPDATE delta.`{gold}` SET revenue = revenue + 1 WHERE customer_id = 10")
    tampered = sample_matches(spark, inputs)
    assert not tampered.passed
    assert tampered.metadata["groups_differing"] == 2  # the layer's row and the fresh one
    assert "differ from a from-scratch aggregation" in tampered.description


CHILD = """
import sys
from incremental_assets.engine.declared_layers import layer_inputs, refresh_layer
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import load_project

project = load_project(sys.argv[1])
spark = local_session(**dict(arg.split("=", 1) for arg in sys.argv[3:]))
refresh_layer(spark, layer_inputs(project, project.layer(sys.argv[2])))
"""


def test_a_run_killed_before_its_commit_is_exact_on_the_next_run(spark, tmp_path):
    warehouse = Warehouse(spark, tmp_path, feed=True)
    inputs = warehouse.inputs("orders_silver")
    refresh_layer(spark, inputs)
    covered, version = (
        covered_version(inputs.target, inputs.upstream),
        inputs.target.open().version(),
    )
    change_orders(warehouse)

    conf = [f"{k}={v}" for k, v in CHILD_SPARK_CONF.items()]
    env = {**os.environ, CRASH_ENV: "before_commit", "INCREMENTAL_ASSETS_DRIVER_MEMORY": "1g"}
    command = [sys.executable, "-c", CHILD, str(tmp_path / "tables.yaml"), "orders_silver", *conf]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, done.stderr[-3000:]  # killed at the crash point
    assert inputs.target.open().version() == version
    assert covered_version(inputs.target, inputs.upstream) == covered

    rerun = refresh_layer(spark, inputs)
    assert (rerun.upstream_from, rerun.rows_deleted) == (covered, 2)
    assert warehouse.layer_rows("orders_silver", SILVER) == warehouse.silver_from_scratch()


@pytest.mark.parametrize(
    ("layer", "fragment"),
    [
        ("no_key_column", "the select gives no column order_id"),
        ("one_row_per_customer_key", "more than one row for a key"),
    ],
)
def test_a_select_that_cannot_give_its_keys_fails_naming_the_layer_with_nothing_written(
    spark, tmp_path, layer, fragment
):
    warehouse = Warehouse(spark, tmp_path, feed=False)
    warehouse.sql(
        "INSERT INTO {orders} VALUES (7, 10, 'placed', 1.0, TIMESTAMP'2026-01-01 00:30:00')"
    )
    inputs = warehouse.inputs(layer)
    with pytest.raises(LayerError) as caught:
        refresh_layer(spark, inputs)
    assert f"layer '{layer}', field 'keys'" in str(caught.value)
    assert fragment in str(caught.value)
    assert not inputs.target.exists()


def test_upstream_history_removed_by_vacuum_fails_naming_the_reset_and_commits_nothing(
    spark, tmp_path
):
    warehouse = Warehouse(spark, tmp_path, feed=False)
    inputs = warehouse.inputs("orders_silver")
    refresh_layer(spark, inputs)
    version = inputs.target.open().version()
    # The update rewrites the file the layer's covered version holds; VACUUM with no
    # retention then deletes it, so that version can no longer be read.
    warehouse.sql("UPDATE {orders} SET amount = 7.0 WHERE order_id = 1")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        warehouse.sql("VACUUM {orders} RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")

    with pytest.raises(LayerError) as caught:
        refresh_layer(spark, inputs)

    text = str(caught.value)
    assert "layer 'orders_silver', field 'from'" in text
    assert "no longer holds its history since version" in text
    assert f"delete the layer's table at {inputs.target.path}" in text
    assert inputs.target.open().version() == version
    # The documented reset: the layer's table deleted, the next run rebuilds it whole.
    shutil.rmtree(inputs.target.path)
    rebuilt = refresh_layer(spark, inputs)
    assert rebuilt.changes_from == "full read"
    assert warehouse.layer_rows("orders_silver", SILVER) == warehouse.silver_from_scratch()


def test_newest_version_of_a_group_replaces_its_rows_and_an_older_version_changes_nothing(
    spark, tmp_path
):
    # Only the doc_versions table: the orders and customers of Warehouse are not needed.
    (tmp_path / "tables.yaml").write_text(PROJECT)
    project = load_project(tmp_path / "tables.yaml")
    docs = f"delta.`{tmp_path}/warehouse/doc_versions`"
    spark.sql(f"CREATE TABLE {docs} (doc STRING, version INT, item STRING, qty INT) USING delta")
    spark.sql(f"INSERT INTO {docs} VALUES ('a', 1, 'x', 1), ('a', 1, 'y', 1), ('b', 1, 'x', 5)")
    inputs = layer_inputs(project, project.layer("doc_items"))
    assert refresh_layer(spark, inputs).rows_inserted == 3

    # a's version 2 no longer has y; a copy of b's older version 0 arrives late; c arrives
    # in two versions at once (only the newest counts). One append, as bronze gets them.
    spark.sql(
        f"INSERT INTO {docs} VALUES ('a', 2, 'x', 2), ('b', 0, 'x', 9), ('c', 1, 'x', 1), "
        "('c', 2, 'z', 3)"
    )
    second = refresh_layer(spark, inputs)
    rows = spark.read.format("delta").load(inputs.target.spark_path)
    assert sorted(tuple(r) for r in rows.select("doc", "item", "qty", "version").collect()) == [
        ("a", "x", 2, 2),
        ("b", "x", 5, 1),
        ("c", "z", 3, 2),
    ]
    assert (second.rows_inserted, second.rows_updated, second.rows_deleted) == (1, 1, 1)
    assert counts_reconciled(spark, inputs).passed

    with pytest.raises(LayerError) as caught:
        refresh_layer(spark, layer_inputs(project, project.layer("doc_items_unversioned")))
    assert "layer 'doc_items_unversioned', field 'newest.by'" in str(caught.value)
    assert "the select gives no column version" in str(caught.value)
