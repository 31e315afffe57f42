"""Which columns a new table keeps file statistics of (``stats_options``)."""

from __future__ import annotations

from deltalake import DeltaTable
from pyspark.sql.types import (
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake.stats_columns import (
    STATS_COLUMNS,
    session_indexed,
    stats_options,
)
from incremental_assets.engine.delta_lake.store import table_options


def schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(name, kind) for name, kind in fields])


def test_a_table_whose_needed_columns_are_among_its_first_32_gets_no_property():
    narrow = schema(("id", LongType()), ("name", StringType()), ("deleted_at", TimestampType()))
    wide = schema(*[(f"c{i}", LongType()) for i in range(40)])

    assert stats_options(narrow, ["id", "deleted_at"]) == {}
    assert stats_options(wide, ["c0", "c31"]) == {}


def test_a_needed_column_past_the_32nd_is_named_with_the_leading_eligible_columns():
    fields = [("id", LongType()), ("flag", BooleanType())]
    fields += [(f"c{i}", LongType()) for i in range(40)] + [("deleted at", TimestampType())]

    named = stats_options(schema(*fields), ["id", "deleted at"])[STATS_COLUMNS]

    columns = named.split(",")
    # 32 columns: the needed ones first, then the leading ones Delta keeps statistics of
    # (a boolean is not one: Delta refuses the property naming it).
    assert columns[:3] == ["`id`", "`deleted at`", "`c0`"]
    assert len(columns) == 32 and "`flag`" not in columns and columns[-1] == "`c29`"


def test_a_key_delta_keeps_no_min_or_max_of_leaves_delta_s_default():
    # Named, a boolean key would lose its null count (keys_not_null, Z-ordering read it).
    fields = [("flag", BooleanType()), *[(f"c{i}", LongType()) for i in range(40)]]

    assert stats_options(schema(*fields, ("at", TimestampType())), ["flag", "at"]) == {}


def test_partition_columns_are_left_out_whatever_their_case():
    fields = [("Day", StringType()), *[(f"c{i}", LongType()) for i in range(40)]]

    named = stats_options(schema(*fields), ["c39"], partition_by=["day"])[STATS_COLUMNS]

    assert "`Day`" not in named.split(",")


def test_struct_leaves_count_toward_the_32_and_partition_columns_do_not():
    nested = StructType([StructField(f"f{i}", LongType()) for i in range(31)])
    fields = (("day", StringType()), ("id", LongType()), ("s", nested), ("at", TimestampType()))

    assert stats_options(schema(*fields), ["id", "at"], partition_by=["day"]) != {}
    assert stats_options(schema(*fields[:3], ("at", LongType())), ["at"], ["day", "s"]) == {}


def test_a_count_of_indexed_columns_other_than_32_is_the_count_the_rule_follows():
    wide = schema(*[(f"c{i}", LongType()) for i in range(40)])

    # Wider than the table: every column keeps statistics, no property.
    assert stats_options(wide, ["c0", "c39"], indexed=50) == {}
    assert stats_options(wide, ["c0", "c39"], indexed=-1) == {}  # -1: every column
    # Narrower: the needed columns, then the leading ones up to the count.
    named = stats_options(wide, ["c39"], indexed=10)[STATS_COLUMNS].split(",")
    assert named == ["`c39`", *[f"`c{i}`" for i in range(9)]]
    assert stats_options(wide, ["c5"], indexed=10) == {}
    # None: the session names the columns itself.
    assert stats_options(wide, ["c39"], indexed=None) == {}


SESSION = "spark.databricks.delta.properties.defaults."


def test_the_session_s_delta_defaults_are_the_count_or_the_columns_themselves(spark):
    count, columns = SESSION + "dataSkippingNumIndexedCols", SESSION + "dataSkippingStatsColumns"
    assert session_indexed(spark) == 32
    try:
        spark.conf.set(count, "-1")
        assert session_indexed(spark) == -1
        spark.conf.set(count, "50")
        assert session_indexed(spark) == 50
        spark.conf.set(columns, "id,deleted_at")
        assert session_indexed(spark) is None
    finally:
        spark.conf.unset(count)
        spark.conf.unset(columns)
    assert session_indexed(spark) == 32


def test_delta_accepts_the_property_and_keeps_statistics_of_the_named_columns(spark, tmp_path):
    # A boolean and a partition column among them: both left out, as Delta requires.
    names = ["day", "flag", *[f"c{i}" for i in range(40)], "deleted at"]
    row = ("d", True, *range(40), None)
    types = ["string", "boolean", *["long"] * 41]
    ddl = ", ".join(f"`{n}` {t}" for n, t in zip(names, types, strict=True))
    rows = spark.createDataFrame([row], ddl)
    options = {**table_options(names), **stats_options(rows.schema, ["deleted at"], ["day"])}
    path = str(tmp_path / "t")

    delta_commits.append(rows, path, {}, mode="error", partition_by=["day"], options=options)

    table = DeltaTable(path)
    # A name with a space takes column mapping: the statistics name physical columns.
    physical = {
        f.name: f.metadata["delta.columnMapping.physicalName"] for f in table.schema().fields
    }
    files = table.get_add_actions(flatten=True)
    assert files.column(f"null_count.{physical['deleted at']}").to_pylist() == [1]
    assert f"null_count.{physical['c31']}" not in files.column_names  # the 32nd is c30
    assert files.column(f"null_count.{physical['c30']}").to_pylist() == [0]
