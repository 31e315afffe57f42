"""A snapshot that holds a key twice is refused before anything is written, naming the
keys; the target stays equal to the last good snapshot, and loads it once fixed."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from incremental_assets.engine import DeltaTarget
from incremental_assets.engine.errors import DuplicateKeysError
from incremental_assets_tests.builders import (
    DeltaSourceTable,
    load,
    make_spec,
    products,
    rows,
    snapshot_spec,
)


def reference(*items: tuple) -> list[tuple]:
    """The target a snapshot of ``items`` (one row per key) leaves: its rows."""
    return sorted(items)


def test_a_repeated_key_is_refused_and_the_target_keeps_the_last_snapshot(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source")
    spec = snapshot_spec(source.path)
    target = DeltaTarget("t", str(tmp_path / "target"))
    first = [(1, "pen", 1.0), (2, "ink", 2.0), (3, "pad", 3.0)]
    source.replace(products(*first))
    load(spark, spec, target, 1)
    assert rows(target, "id", "name", "price") == reference(*first)
    version = DeltaTable(target.path).version()

    # Key 2 twice, with different prices: which one is the product's price?
    source.replace(products((1, "pen", 1.5), (2, "ink", 2.0), (2, "ink", 2.5), (3, "pad", 3.0)))
    with pytest.raises(DuplicateKeysError) as refused:
        load(spark, spec, target, 2)

    message = str(refused.value)
    assert "holds 1 key (id) more than once: id=2 (2 rows)" in message
    assert "Nothing was committed" in message and "set keys to columns" in message
    assert (refused.value.count, refused.value.sample) == (1, ["id=2 (2 rows)"])
    assert DeltaTable(target.path).version() == version
    assert rows(target, "id", "name", "price") == reference(*first)

    fixed = [(1, "pen", 1.5), (2, "ink", 2.5), (3, "pad", 3.0)]
    source.replace(products(*fixed))
    result = load(spark, spec, target, 2)
    assert rows(target, "id", "name", "price") == reference(*fixed)
    assert result.changes == {"insert": 0, "change": 2, "vanish": 0}
    again = load(spark, spec, target, 2)
    assert again.changes == {"insert": 0, "change": 0, "vanish": 0}
    assert rows(target, "id", "name", "price") == reference(*fixed)


def test_many_repeated_keys_are_counted_and_some_named(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source")
    target = DeltaTarget("t", str(tmp_path / "target"))
    twice = [(i, f"item {i}", float(i)) for i in range(1, 9)]
    source.replace(products(*twice, *[(i, name, price + 1) for i, name, price in twice]))

    with pytest.raises(DuplicateKeysError) as refused:
        load(spark, snapshot_spec(source.path), target, 1)

    assert refused.value.count == 8
    assert refused.value.sample == [f"id={i} (2 rows)" for i in range(1, 6)]
    assert "id=5 (2 rows) and 3 more." in str(refused.value)
    assert not DeltaTable.is_deltatable(target.path)


def test_a_history_fed_by_snapshots_refuses_a_repeated_key(spark, tmp_path):
    source = DeltaSourceTable(tmp_path / "source")
    spec = make_spec(
        source.path, keys=["id"], watermark=None, strategy={"kind": "scd2", "changes": "snapshot"}
    )
    target = DeltaTarget("t", str(tmp_path / "target"))
    source.replace(products((1, "pen", 1.0), (2, "ink", 2.0)))
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()
    source.replace(products((1, "pen", 1.0), (1, "pen", 1.2), (2, "ink", 2.0)))

    with pytest.raises(DuplicateKeysError, match=r"id=1 \(2 rows\)"):
        load(spark, spec, target, 2)

    assert DeltaTable(target.path).version() == version
    assert rows(target, "id", "name", "price") == [(1, "pen", 1.0), (2, "ink", 2.0)]
