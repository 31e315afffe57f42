"""Nothing is committed that the run's own checks cannot read. A column the spec names
(keys, watermark, partitions, strategy columns) with a dot, a space or a backtick is
refused when the specs load; source columns the spec does not name may be called
anything, and load and pass every check with every strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from incremental_assets.engine import DeltaTarget, checks
from incremental_assets.specs.loader import SpecError, parse_project
from incremental_assets_tests.builders import at, load, make_spec

ODD_NAMES = ["order.id", "order id", "order`id"]


def base_table(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "orders",
        "source": {"format": "parquet", "path": "./feed"},
        "keys": ["order_id"],
        "watermark": {"column": "updated_at", "kind": "timestamp"},
        "strategy": "upsert",
        "partitioning": {"granularity": "daily", "start": "2026-01-01"},
    }
    raw.update(overrides)
    return raw


def settings_naming(column: str) -> dict[str, dict[str, Any]]:
    """One table setting per place a spec names a column."""
    ts = {"column": "updated_at", "kind": "timestamp"}
    return {
        "keys": {"keys": [column]},
        "watermark.column": {"watermark": {"column": column, "kind": "timestamp"}},
        "watermark.tiebreak": {"watermark": {**ts, "kind": "hybrid", "tiebreak": column}},
        "partitioning.column": {
            "partitioning": {"granularity": "daily", "start": "2026-01-01", "column": column}
        },
        "target.partition_by": {"target": {"partition_by": [column]}},
        "strategy.operation": {"strategy": {"kind": "cdc", "operation": column}},
        "strategy.tracked": {"strategy": {"kind": "snapshot", "tracked": [column]}},
        "strategy.effective": {"strategy": {"kind": "scd2", "effective": column}},
        "strategy.valid_from": {"strategy": {"kind": "scd2", "valid_from": column}},
    }


@pytest.mark.parametrize("column", ODD_NAMES)
@pytest.mark.parametrize("field", list(settings_naming("x")))
def test_a_column_the_spec_names_with_a_dot_space_or_backtick_is_refused_at_load(
    tmp_path, field, column
):
    overrides = settings_naming(column)[field]
    if field == "strategy.tracked":
        overrides = {**overrides, "watermark": None}
    raw = {"warehouse": {"root": "./wh"}, "tables": [base_table(**overrides)]}

    with pytest.raises(SpecError) as info:
        parse_project(raw, source="tables.yaml", base_dir=tmp_path)

    (table, where, message) = info.value.problems[0]
    assert table == "orders"
    assert where == field
    assert f"{column!r} is not a plain column name" in message
    assert "rename the column in the source" in message


def test_plain_names_with_dollar_and_letters_of_any_script_are_accepted(tmp_path):
    raw = {
        "warehouse": {"root": "./wh"},
        "tables": [
            base_table(
                keys=["größe_id"],
                strategy={"kind": "cdc", "encoding": "sqlserver", "operation": "__$operation"},
            )
        ],
    }

    project = parse_project(raw, source="tables.yaml", base_dir=tmp_path)

    assert project.tables[0].keys == ["größe_id"]


# --- source columns the spec does not name ----------------------------------------------

FEED = pa.schema(
    [
        ("id", pa.int64()),
        ("a.b", pa.float64()),
        ("we`ird", pa.string()),
        ("with space", pa.int32()),
        ("op", pa.string()),
        ("lsn", pa.int64()),
        ("changed_at", pa.timestamp("us", tz="UTC")),
    ]
)


def events(*rows: tuple) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(FEED.names, r, strict=True)) for r in rows], FEED)


DAY1 = events(
    (1, 1.5, "x", 10, "I", 1, at(1, 1)),
    (2, -2.0, "y", 20, "I", 2, at(1, 2)),
    (3, 3.0, "z", 30, "I", 3, at(1, 3)),
)
DAY2 = events((1, 9.5, "x2", 11, "U", 4, at(2, 1)), (4, 4.0, "w", 40, "I", 5, at(2, 2)))

STRATEGIES = {
    "append": "append",
    "upsert": "upsert",
    "cdc-hard": {"kind": "cdc"},
    "cdc-soft": {"kind": "cdc", "deletes": "soft"},
    "snapshot": {"kind": "snapshot"},
    "scd2": {"kind": "scd2", "changes": "cdc"},
}


def odd_spec(folder: Path, strategy: Any):
    snapshot = isinstance(strategy, dict) and strategy["kind"] == "snapshot"
    return make_spec(
        str(folder),
        source={"format": "parquet"},
        keys=["id"],
        watermark=None if snapshot else {"column": "lsn", "kind": "id", "lookback": 0},
        partitioning={"column": "changed_at"},
        strategy=strategy,
        quality={"rules": [{"name": "positive", "check": "`a.b` >= 0 AND `with space` > 0"}]},
    )


@pytest.mark.parametrize("strategy", list(STRATEGIES.values()), ids=list(STRATEGIES))
def test_source_columns_with_dots_spaces_and_backticks_load_and_pass_every_check(
    spark, tmp_path, strategy
):
    folder = tmp_path / "feed"
    folder.mkdir()
    snapshot = isinstance(strategy, dict) and strategy["kind"] == "snapshot"
    spec = odd_spec(folder, strategy)
    target = DeltaTarget("orders", str(tmp_path / "target"))
    pq.write_table(DAY1, folder / "day1.parquet")
    first = load(spark, spec, target, 1)
    if snapshot:  # the source's whole current state after day 2's changes
        pq.write_table(pa.concat_tables([DAY2, DAY1.slice(1)]), folder / "day1.parquet")
    else:
        pq.write_table(DAY2, folder / "day2.parquet")

    second = load(spark, spec, target, 2)

    assert first.committed and second.committed
    assert first.quality is not None and first.quality.failures == {"positive": 1}
    version = second.delta_version
    outcomes = {
        "keys_unique": checks.keys_unique(spark, target, spec.row_identity, written_by=version),
        "keys_not_null": checks.keys_not_null(spark, target, spec.row_identity),
        "schema_matches_spec": checks.schema_matches_spec(target, spec),
        "counts_match_table": checks.counts_match_table(
            target, version, second.rows_inserted, second.rows_updated, second.rows_deleted
        ),
        "rows_reconciled": checks.rows_reconciled(spec, second),
    }
    if spec.history:
        scd2 = spec.history
        outcomes["history_consistent"] = checks.history_consistent(
            spark, target, spec.keys, scd2.valid_from, scd2.valid_to, scd2.is_current, version
        )
    assert {name: o.passed for name, o in outcomes.items()} == dict.fromkeys(outcomes, True), {
        name: o.description for name, o in outcomes.items()
    }
    # Read by Spark's Delta Lake: the target keeps 'with space' under column mapping.
    landed = spark.read.format("delta").load(target.path).collect()
    values = {(r["id"], r["a.b"], r["we`ird"], r["with space"]) for r in landed}
    assert (4, 4.0, "w", 40) in values
    expect_first = (1, 1.5, "x", 10) if strategy == "append" else (1, 9.5, "x2", 11)
    assert expect_first in values
