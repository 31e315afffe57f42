"""Bronze -> silver -> gold for invoices, as the project's tables.yaml declares silver and
gold: each layer reads only what changed upstream, lines that vanish from a file rewritten
in place leave silver, and gold always equals a from-scratch aggregation of silver."""

from __future__ import annotations

from datetime import timedelta

from deltalake import DeltaTable

from incremental_assets.engine.landing import load_landing
from incremental_assets_tests.builders import (
    NOW,
    OLD,
    InvoiceLayers,
    days,
    drop,
    invoice,
    landing_spec,
    written,
)

DAY = 86_400_000


def on_day(number: int, day: int, **kwargs) -> dict:
    row = invoice(number, **kwargs)
    row["CreatedTime"] = 1767225600000 + day * DAY + number * 1000  # 2026-01-01 + day
    return row


def test_silver_and_gold_follow_bronze_incrementally_and_match_a_full_recompute(spark, tmp_path):
    folder = tmp_path / "landing"
    folder.mkdir()
    spec = landing_spec(folder)
    layers = InvoiceLayers(spark, tmp_path / "warehouse", spec)
    bronze, silver, gold = layers.bronze, layers.silver_target, layers.gold_target

    drop(folder, "a.json", [on_day(1, 0), on_day(2, 0, store="S2", items=3)])
    drop(folder, "b.json", [on_day(3, 1)])
    load_landing(spark, spec, bronze, now=NOW)
    first = layers.silver()
    assert written(first) == 7  # 2 + 3 + 2 lines
    gold_first = layers.gold()
    assert days(gold_first) == ["2026-01-01", "2026-01-02"]
    assert layers.gold_rows() == layers.gold_from_scratch()

    # Nothing new upstream: neither layer commits.
    versions = (DeltaTable(silver.path).version(), DeltaTable(gold.path).version())
    assert layers.silver().version is None
    assert layers.gold().version is None
    assert (DeltaTable(silver.path).version(), DeltaTable(gold.path).version()) == versions

    # A new file for day 3 and b.json rewritten in place (INV3 now has 3 lines): silver
    # upserts the lines, gold recomputes only days 2 and 3.
    drop(folder, "c.json", [on_day(4, 2)])
    drop(folder, "b.json", [on_day(3, 1, items=3)], modified=OLD + timedelta(minutes=1))
    load_landing(spark, spec, bronze, now=NOW + timedelta(minutes=10))
    second = layers.silver()
    assert second.upstream_from == first.upstream_to
    silver_rows = DeltaTable(silver.path).to_pyarrow_table().num_rows
    assert silver_rows == 10  # 7 + one new line of INV3 + 2 lines of INV4
    gold_second = layers.gold()
    assert days(gold_second) == ["2026-01-02", "2026-01-03"]
    assert layers.gold_rows() == layers.gold_from_scratch()


def test_lines_that_vanish_from_a_rewritten_file_leave_silver_and_gold(spark, tmp_path):
    folder = tmp_path / "landing"
    folder.mkdir()
    spec = landing_spec(folder)
    layers = InvoiceLayers(spark, tmp_path / "warehouse", spec)
    bronze, silver, gold = layers.bronze, layers.silver_target, layers.gold_target

    # a.json: INV1 (3 lines, day 0) and INV2 (2 lines, day 1); b.json: INV3 (day 1).
    drop(folder, "a.json", [on_day(1, 0, items=3), on_day(2, 1)])
    drop(folder, "b.json", [on_day(3, 1)])
    load_landing(spark, spec, bronze, now=NOW)
    layers.silver()
    layers.gold()

    # a.json rewritten: INV1 keeps one line, INV2 is gone (day 1 keeps only INV3).
    drop(folder, "a.json", [on_day(1, 0, items=1)], modified=OLD + timedelta(minutes=1))
    load_landing(spark, spec, bronze, now=NOW + timedelta(minutes=10))
    step = layers.silver()
    assert step.rows_deleted == 4  # two lines of INV1 and both of INV2
    lines = DeltaTable(silver.path).to_pyarrow_table(columns=["InvoiceNumber", "ItemCode"])
    assert sorted(tuple(r.values()) for r in lines.to_pylist()) == [
        ("INV1", "400"),
        ("INV3", "400"),
        ("INV3", "401"),
    ]
    refresh = layers.gold()
    assert days(refresh) == ["2026-01-01", "2026-01-02"]
    assert layers.gold_rows() == layers.gold_from_scratch()

    # b.json rewritten empty of lines for day 1: gold's day 1 row disappears.
    drop(folder, "b.json", [on_day(4, 0)], modified=OLD + timedelta(minutes=2))
    load_landing(spark, spec, bronze, now=NOW + timedelta(minutes=20))
    layers.silver()
    layers.gold()
    assert layers.gold_rows() == layers.gold_from_scratch()
    assert {r[0] for r in layers.gold_rows()} == {"2026-01-01"}

    # INV1 corrected to day 2: its old day is recomputed too.
    drop(folder, "a.json", [on_day(1, 2, items=1)], modified=OLD + timedelta(minutes=3))
    load_landing(spark, spec, bronze, now=NOW + timedelta(minutes=25))
    layers.silver()
    moved = layers.gold()
    assert days(moved) == ["2026-01-01", "2026-01-03"]
    assert layers.gold_rows() == layers.gold_from_scratch()

    # a.json rewritten with no rows at all: its lines leave silver, its day leaves gold.
    bronze_rows = DeltaTable(bronze.path).to_pyarrow_table().num_rows
    drop(folder, "a.json", [], modified=OLD + timedelta(minutes=4))
    emptied = load_landing(spark, spec, bronze, now=NOW + timedelta(minutes=28))
    assert [f.path for f in emptied.files_loaded] == [str(folder / "a.json")]
    assert emptied.commit.committed and emptied.commit.rows_inserted == 0
    assert DeltaTable(bronze.path).to_pyarrow_table().num_rows == bronze_rows
    step = layers.silver()
    assert step.rows_deleted == 1
    lines = DeltaTable(silver.path).to_pyarrow_table(columns=["InvoiceNumber"])
    assert lines.column(0).to_pylist() == ["INV4", "INV4"]  # b.json's two lines
    gone = layers.gold()
    assert days(gone) == ["2026-01-03"]
    assert layers.gold_rows() == layers.gold_from_scratch()
    assert {r[0] for r in layers.gold_rows()} == {"2026-01-01"}

    # Loading nothing new changes nothing.
    versions = (DeltaTable(silver.path).version(), DeltaTable(gold.path).version())
    load_landing(spark, spec, bronze, now=NOW + timedelta(minutes=30))
    assert layers.silver().version is None
    assert (DeltaTable(silver.path).version(), DeltaTable(gold.path).version()) == versions
