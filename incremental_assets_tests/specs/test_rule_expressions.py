"""Quality rules are expressions over the row, nothing more. A check that calls Java
(reflect, java_method), runs a second statement, reads another table, hides text in a
comment, or calls a function outside the allowlist (a UDF, a file reader, a random or clock
function, an aggregate) is refused when the specs load, naming the rule and the reason. The
engine repeats the check on Spark's own parse tree before it evaluates anything."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from incremental_assets.engine import IncrementalLoadError, quality
from incremental_assets.specs.loader import SpecError, parse_project
from incremental_assets.specs.models import QualitySpec, RuleSpec
from incremental_assets_tests.builders import PROJECT_ROOT, at, load, make_spec, target_rows

# The README and the reference pages: every rule they show.
DOCS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
SECRET = "S3cr3t-pa55"

# (rule name, check, what the refusal says)
REFUSED = [
    (
        "java_property",
        "java_method('java.lang.System', 'getProperty', 'user.name') = 'root'",
        "java_method() calls a Java method",
    ),
    (
        "leak",
        "reflect('java.lang.System', 'getenv', 'SHOP_DB_PASSWORD') LIKE 'S%'",
        "reflect() calls a Java method",
    ),
    (
        "backquoted_java",
        "`java_method`('java.lang.System', 'getProperty', 'user.name') IS NULL",
        "java_method() calls a Java method",
    ),
    ("drop", "1=1; DROP TABLE x", "';' at position 4 separates SQL statements"),
    ("subquery", "amount <= (SELECT max(amount) FROM orders)", "SELECT starts a subquery"),
    ("exists", "exists(SELECT 1)", "EXISTS starts a subquery or names a table"),
    ("from_first", "amount IN (FROM orders)", "FROM reads a table"),
    ("table_ref", "(TABLE orders) IS NOT NULL", "TABLE starts a subquery or names a table"),
    ("pipe", "amount > 0 |> WHERE amount > 1", "the pipe operator |> runs a query"),
    ("line_comment", "amount > 0 -- or reflect(...)", "'--' at position 12 starts a comment"),
    ("block_comment", "amount > 0 /* ok */", "'/*' at position 12 starts a comment"),
    (
        "udf",
        "is_valid_amount(amount)",
        "is_valid_amount() is not one of the functions a check may call",
    ),
    ("qualified", "spark_catalog.default.valid(amount)", "valid() is called with a qualified"),
    (
        "by_text",
        "IDENTIFIER('reflect')('java.lang.System', 'getenv', 'HOME') IS NULL",
        "IDENTIFIER() names a column or function through text",
    ),
    ("file_name", "input_file_name() LIKE '%.parquet'", "input_file_name() reads files"),
    ("random", "rand() > 0.5", "rand() is not deterministic"),
    ("clock", "updated_at <= current_timestamp()", "current_timestamp() reads the clock"),
    ("bare_clock", "updated_at <= current_timestamp", "current_timestamp() reads the clock"),
    ("whoami", "current_user() = 'loader'", "current_user() reads the session"),
    ("aggregate", "amount < 10 * avg(amount)", "avg() aggregates over many rows"),
    (
        "window",
        "amount >= lag(amount) OVER (ORDER BY updated_at)",
        "lag() is a window function over many rows",
    ),
    ("unclosed", "status = 'paid", "the string at position 10 is not closed"),
    (  # Spark upper-cases a long s to S: this is SELECT to its parser
        "long_s",
        "amount IN (\u017fELECT 1)",
        "'\u017fELECT' at position 12: an unquoted name uses ASCII letters, digits and '_' only",
    ),
]

# Every check in the tests and the demo (the docs' are read from README.md and docs/ below),
# and the keywords a check keeps.
ORDINARY = [
    "amount > 0",
    "amount >= 0",
    "amount < 1000",
    "amount < 10",
    "status IN ('placed', 'paid')",
    "`a.b` >= 0 AND `with space` > 0",
    "`order id` IS NOT NULL AND `select` <> 'x' AND `größe` > 0",
    "CASE WHEN status = 'paid' THEN amount > 0 ELSE TRUE END",
    "amount BETWEEN 0 AND 1000000 AND NOT (status IS NULL)",
    "status LIKE 'p!%%' ESCAPE '!' OR status ILIKE 'PAID' OR status RLIKE '^[a-z]+$'",
    "updated_at >= TIMESTAMP'2026-01-01 00:00:00' - INTERVAL 1 DAY",
    "CAST(amount AS DECIMAL(12, 2)) >= 0 AND try_cast(status AS INT) IS NULL",
    "order_id DIV 1 >= 0 AND order_id % 2 IN (0, 1)",
    "status IS DISTINCT FROM 'lost' AND trim(BOTH ' ' FROM status) = status",
    "coalesce(nullif(status, ''), 'x') <> 'x' AND length(lower(status)) < 20",
    "year(updated_at) = 2026 AND date(updated_at) >= DATE'2026-01-01'",
    "datediff(to_date(updated_at), DATE'2026-01-01') >= 0 AND round(abs(amount), 2) >= 0",
    "array_contains(array('placed', 'paid'), status) OR status = 'it''s; -- fine /* here */'",
]


def spec_with_rule(tmp_path: Path, name: str, check: str) -> dict[str, Any]:
    return {
        "warehouse": {"root": str(tmp_path / "wh")},
        "tables": [
            {
                "name": "orders",
                "source": {"format": "delta", "path": "./source/orders"},
                "keys": ["order_id"],
                "watermark": {"column": "updated_at", "kind": "timestamp"},
                "strategy": "upsert",
                "partitioning": {"granularity": "daily", "start": "2026-01-01"},
                "quality": {"rules": [{"name": name, "check": check, "action": "warn"}]},
            }
        ],
    }


@pytest.mark.parametrize(("name", "check", "reason"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_rule_that_is_more_than_an_expression_over_the_row_is_refused_at_load(
    tmp_path, monkeypatch, name, check, reason
):
    monkeypatch.setenv("SHOP_DB_PASSWORD", SECRET)

    with pytest.raises(SpecError) as info:
        parse_project(spec_with_rule(tmp_path, name, check), "tables.yaml", tmp_path)

    [(table, where, message)] = info.value.problems
    assert (table, where) == ("orders", "quality.rules.check")
    assert message.startswith(f"rule '{name}' is refused: {reason}")
    assert "Change the check to one expression over the row's columns" in message
    assert SECRET not in str(info.value)
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize("check", ORDINARY)
def test_ordinary_rules_stay_valid(tmp_path, check):
    project = parse_project(spec_with_rule(tmp_path, "ordinary", check), "t.yaml", tmp_path)

    assert project.tables[0].quality.rules[0].check == check


def test_every_rule_the_docs_show_is_valid(tmp_path):
    checks = [c for page in DOCS for c in re.findall(r'check: "([^"]+)"', page.read_text())]

    assert len(checks) >= 3
    for check in checks:
        parse_project(spec_with_rule(tmp_path, "readme", check), "t.yaml", tmp_path)


def test_ordinary_rules_load_and_are_counted(spark, orders_source, target):
    orders_source.upsert([(1, "placed", 10.0, at(1, 1)), (2, "lost", -5.0, at(1, 2))])
    rules = [{"name": f"r{i}", "check": check} for i, check in enumerate(ORDINARY)]
    spec = make_spec(orders_source.path, quality={"rules": rules[:5] + rules[7:]})

    result = load(spark, spec, target, 1)

    assert result.quality.rows_checked == 2
    assert result.quality.failures["r0"] == 1  # amount > 0
    assert [r[0] for r in target_rows(target)] == [1, 2]


# --- the engine's own check, on Spark's parse tree -----------------------------------------


def unchecked(name: str, check: str) -> RuleSpec:
    """A rule built without the spec's validation (as code could build one)."""
    return RuleSpec.model_construct(name=name, check=check, action="warn")


def with_rules(spec, *rules: RuleSpec):
    return spec.model_copy(update={"quality": QualitySpec.model_construct(rules=list(rules))})


SUBQUERY = "it holds a subquery, which reads other tables"
# What Spark's parse tree says where it differs from the spec's check (subqueries and table
# references are subquery nodes there); statements, the pipe, an unclosed string are not
# valid expressions for Spark, and its parser drops comments.
TREE_REASONS = {
    "subquery": SUBQUERY,
    "exists": SUBQUERY,
    "from_first": SUBQUERY,
    "table_ref": SUBQUERY,
    "long_s": SUBQUERY,
    "qualified": "spark_catalog.default.valid() is called with a qualified name",
}
NOT_PARSED = {"drop", "pipe", "unclosed", "line_comment", "block_comment"}
PARSED_REFUSALS = [
    (check, TREE_REASONS.get(name, reason))
    for name, check, reason in REFUSED
    if name not in NOT_PARSED
]


@pytest.mark.parametrize("check", ORDINARY)
def test_sparks_parse_tree_of_an_ordinary_rule_passes(spark, check):
    df = spark.range(1)

    assert quality.parse_tree_refusal(df, check) is None


@pytest.mark.parametrize(("check", "reason"), PARSED_REFUSALS)
def test_sparks_parse_tree_refuses_what_the_spec_check_refuses(spark, check, reason):
    df = spark.range(1)

    refusal = quality.parse_tree_refusal(df, check)

    assert refusal is not None
    assert refusal.startswith(reason)


def test_a_bare_user_reads_the_column_when_there_is_one_else_it_is_refused(spark):
    with_user = spark.createDataFrame([("ann",)], "user string")
    without = spark.range(1)

    assert quality.parse_tree_refusal(with_user, "user IS NOT NULL") is None
    refusal = quality.parse_tree_refusal(without, "`user` LIKE 'r%'")
    assert refusal is not None and refusal.startswith("user() reads the session")


@pytest.mark.classic_only("reads a Java system property of the local JVM")
def test_the_engine_refuses_an_unvalidated_java_rule_before_it_runs(spark, orders_source, target):
    orders_source.upsert([(1, "placed", 10.0, at(1, 1))])
    spec = make_spec(orders_source.path)
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()
    probe = "incremental_assets.tests.rule_probe"
    rule = unchecked(
        "probe", f"java_method('java.lang.System', 'setProperty', '{probe}', 'ran') IS NULL"
    )
    orders_source.upsert([(2, "placed", 20.0, at(1, 2))])

    with pytest.raises(IncrementalLoadError) as info:
        load(spark, with_rules(spec, rule), target, 1)

    message = str(info.value)
    assert message.startswith(
        "table 'orders': quality rule 'probe' is refused: java_method() calls a Java method"
    )
    assert "Nothing was evaluated or committed." in message
    assert "Fix: write the check as one expression over the row's columns" in message
    assert spark._jvm.java.lang.System.getProperty(probe) is None  # never ran
    assert DeltaTable(target.path).version() == version
    assert not Path(f"{target.path}__quarantine").exists()


def test_the_engine_refuses_a_bare_user_when_the_source_has_no_such_column(
    spark, orders_source, target
):
    orders_source.upsert([(1, "placed", 10.0, at(1, 1))])
    spec = make_spec(orders_source.path)
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()
    # Passes the spec's check (`user` may be a column) but Spark would read current_user().
    spec = make_spec(orders_source.path, quality={"rules": [{"name": "who", "check": "user > ''"}]})
    orders_source.upsert([(2, "placed", 20.0, at(1, 2))])

    with pytest.raises(IncrementalLoadError) as info:
        load(spark, spec, target, 1)

    assert "quality rule 'who' is refused: user() reads the session" in str(info.value)

    assert DeltaTable(target.path).version() == version


def test_the_engine_direct_call_refuses_statements_with_the_real_reason(spark):
    df = spark.range(1).withColumnRenamed("id", "amount")

    with pytest.raises(IncrementalLoadError) as info:
        quality.failed_rules("orders", df, [unchecked("drop", "1=1; DROP TABLE x")])

    message = str(info.value)
    assert "quality rule 'drop' is refused: ';' at position 4 separates SQL statements" in message


def test_a_rule_spark_cannot_parse_fails_with_sparks_reason_not_a_blank(
    spark, orders_source, target
):
    orders_source.upsert([(1, "placed", 10.0, at(1, 1))])
    spec = make_spec(orders_source.path)
    load(spark, spec, target, 1)
    version = DeltaTable(target.path).version()
    spec = make_spec(orders_source.path, quality={"rules": [{"name": "half", "check": "amount >"}]})
    orders_source.upsert([(2, "placed", 20.0, at(1, 2))])

    with pytest.raises(IncrementalLoadError) as info:
        load(spark, spec, target, 1)

    message = str(info.value)
    assert "quality rule 'half' ('amount >') cannot be evaluated: [PARSE_SYNTAX_ERROR]" in message
    assert "cannot be evaluated:  " not in message
    assert "Fix: correct the rule's check" in message
    assert DeltaTable(target.path).version() == version
