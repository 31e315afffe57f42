"""Data-quality rules: Spark SQL checks on every extracted row, and the quarantine.

Each rule is a boolean expression; a row fails it when the expression is false or null.
Rows failing a ``quarantine`` rule are diverted to a Delta table beside the target
(``<target>__quarantine``) with the names of the rules they failed, the run id and the
time; rows failing only ``warn`` rules are kept and counted; any row failing a ``fail``
rule fails the run before anything is committed. Quarantined rows never hold the
watermark back: fixed rules or data are replayed into the target later (``replay``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from incremental_assets.engine.checks import CheckOutcome
from incremental_assets.engine.errors import IncrementalLoadError, RuleTimeoutError
from incremental_assets.specs import TableSpec, expressions
from incremental_assets.specs.durations import format_duration
from incremental_assets.specs.models import RuleSpec

FAILED = "_ia_failed_rules"
RUN_ID, QUARANTINED_AT = "_ia_run_id", "_ia_quarantined_at"
QUARANTINE_COLUMNS = (FAILED, RUN_ID, QUARANTINED_AT)
# Operators and functions that match regular expressions (the usual cause of a slow rule).
_PATTERN_MATCH = re.compile(r"\b(rlike|regexp|regexp_like|regexp_extract|regexp_replace)\b", re.I)
# Each rule's own result (true, false or null), kept only until the run has counted it.
RESULTS = "_ia_rule_results"


@dataclass(frozen=True)
class QualityReport:
    """Per run: rows checked, rows failing each rule, rows for which a rule was null (they
    fail it too), rows quarantined, and the score (the share of rows that passed every
    rule)."""

    rows_checked: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    rows_failing_any: int = 0
    rows_quarantined: int = 0
    nulls: dict[str, int] = field(default_factory=dict)

    @property
    def always_null(self) -> list[str]:
        """Rules that were null for every row checked (none when no row was checked)."""
        if not self.rows_checked:
            return []
        return [name for name, n in self.nulls.items() if n >= self.rows_checked]

    @property
    def score(self) -> float:
        if not self.rows_checked:
            return 1.0
        return round(1 - self.rows_failing_any / self.rows_checked, 6)


def failed_rules(table: str, df: DataFrame, rules: Sequence[RuleSpec]) -> DataFrame:
    """Add ``_ia_failed_rules``: the names of the rules a row fails (empty when none).

    Raises:
        IncrementalLoadError: a rule is not an expression over one row (see
            :func:`refuse_unsafe`), or not valid Spark SQL for these columns.
    """
    return judged(table, df, rules).drop(RESULTS)


def judged(table: str, df: DataFrame, rules: Sequence[RuleSpec]) -> DataFrame:
    """Add ``_ia_rule_results`` (each rule's result, by rule name) and ``_ia_failed_rules``
    (the names of the rules a row fails: false or null). Each check is evaluated once: the
    names are taken from the results, which Spark does not inline into both.

    Raises:
        IncrementalLoadError: as :func:`failed_rules`.
    """
    results = []
    for rule in rules:
        refuse_unsafe(table, df, rule)
        try:
            expression = F.expr(rule.check)
            analysed = df.select(expression.cast("boolean"))
            analysed.schema  # noqa: B018 - analyse now
        except (AnalysisException, ParseException) as exc:
            raise IncrementalLoadError(
                table,
                f"quality rule '{rule.name}' ({rule.check!r}) cannot be evaluated: "
                f"{_first_line(exc)}",
                "correct the rule's check (a Spark SQL boolean expression over the source "
                f"columns: {', '.join(df.columns)})",
            ) from None
        results.append(expression.cast("boolean").alias(rule.name))
    judged = df.withColumn(RESULTS, F.struct(*results))
    checks = [
        F.when(~F.coalesce(F.col(RESULTS)[rule.name], F.lit(False)), F.lit(rule.name))
        for rule in rules
    ]
    return judged.withColumn(FAILED, F.filter(F.array(*checks), lambda name: name.isNotNull()))


def refuse_unsafe(table: str, df: DataFrame, rule: RuleSpec) -> None:
    """Refuse a check that is more than an expression over one row of ``df``, before Spark
    evaluates anything: the spec's own check (``specs.expressions``, repeated here for rules
    built without validation), then Spark's parse tree of the check: every function called
    must be on the same allowlist (whose functions are all deterministic), and no subquery
    may appear. Both run through public interfaces, on a local session and over Connect.

    Raises:
        IncrementalLoadError: naming the rule and the reason.
    """
    reason = expressions.refusal(rule.check) or parse_tree_refusal(df, rule.check)
    if reason:
        _refuse(table, rule, reason)


def _refuse(table: str, rule: RuleSpec, reason: str) -> NoReturn:
    raise IncrementalLoadError(
        table,
        f"quality rule '{rule.name}' is refused: {reason}. Nothing was evaluated or committed.",
        "write the check as one expression over the row's columns, with operators, CASE, IN, "
        "BETWEEN, LIKE, CAST and the functions docs/quality.md lists (section 'What a rule may "
        "contain')",
    )


def _first_line(exc: Exception) -> str:
    """The first non-blank line of an error (Spark's parse errors start with a newline)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


# Spark's parsed plan, as SQL's EXPLAIN prints it (a public interface that Spark Connect
# serves too; no JVM object is reached). Unresolved names print with a leading quote:
# 'f(...) is a function call, 'name a column or a bare keyword such as current_user.
_CALL = re.compile(r"'((?:\w+\.)*\w+)\(")
_NAME = re.compile(r"'(\w+)(?![\w.(])")
# Nodes the parser builds itself for the clock and the session user, printed resolved.
_BARE_NODE = re.compile(
    r"(?<![\w'`])(current_date|current_timestamp|current_time|now|localtimestamp"
    r"|current_user)\(\)"
)
# A relation no catalog holds: the analysis of the probe fails on it, so nothing past the
# parser (no optimizer, no constant folding) ever sees the check.
_NO_RELATION = "`incremental_assets rule probe`"


def parse_tree_refusal(df: DataFrame, check: str) -> str | None:
    """Why Spark's own parse of ``check`` is refused (None when it is not). Spark's parser
    is asked through SQL's ``EXPLAIN EXTENDED``, which prints the parsed plan even when the
    analysis fails; a check Spark cannot parse is left to the evaluation, which reports
    Spark's reason."""
    try:
        rows = df.sparkSession.sql(
            f"EXPLAIN EXTENDED SELECT ({check}) AS c FROM {_NO_RELATION}"
        ).collect()
    except ParseException:
        return None  # not valid SQL: evaluating it reports Spark's reason
    text = rows[0][0] if rows else ""
    if "== Parsed Logical Plan ==" not in text:  # fail closed: an unread tree is not run
        return f"Spark's parse tree of the check could not be inspected ({_first_line(text)})"
    parsed = text.split("== Parsed Logical Plan ==", 1)[1].split("== Analyzed", 1)[0]
    return _plan_refusal(parsed, {c.lower() for c in df.columns})


def _plan_refusal(parsed: str, columns: set[str]) -> str | None:
    lines = [line for line in parsed.splitlines() if line.strip()]
    # A subquery's plan is printed under the expression that holds it, its lines led by ':'.
    if any(line.startswith(":") for line in lines):
        return (
            "it holds a subquery, which reads other tables; a check may only read the "
            "row's own columns"
        )
    expression = lines[0] if lines else ""
    if "expressionwithunresolvedidentifier(" in expression:
        return expressions.function_refusal("identifier")
    for name in _CALL.findall(expression):
        if "." in name:
            return (
                f"{name}() is called with a qualified name; a check may only call built-in "
                "functions by their plain name"
            )
        if reason := expressions.function_refusal(name):
            return reason
    for name in _NAME.findall(expression):
        # Spark reads a bare current_user, user, current_date ... as the function when no
        # column has that name.
        if name.lower() in expressions.LITERAL_FUNCTIONS and name.lower() not in columns:
            return expressions.function_refusal(name)
    if match := _BARE_NODE.search(expression):
        return expressions.function_refusal(match.group(1))
    return None


def counters(rules: Sequence[RuleSpec], nulls: bool = False) -> list[Column]:
    """Aggregates for a Spark observation: rows failing each rule, and any rule; with
    ``nulls`` (rows from :func:`judged`), rows for which each rule was null."""
    failed = F.col(FAILED)
    return [
        *[
            F.sum(F.array_contains(failed, r.name).cast("int")).alias(f"rule:{r.name}")
            for r in rules
        ],
        F.sum((F.size(failed) > 0).cast("int")).alias("rules:any"),
        *[
            F.sum(F.col(RESULTS)[r.name].isNull().cast("int")).alias(f"rule_null:{r.name}")
            for r in rules
            if nulls
        ],
    ]


def diverted(rules: Sequence[RuleSpec]) -> Column:
    """True for a row that fails a quarantine rule."""
    names = [r.name for r in rules if r.action == "quarantine"]
    if not names:
        return F.lit(False)
    return F.arrays_overlap(F.col(FAILED), F.array(*[F.lit(n) for n in names]))


def report(rules: Sequence[RuleSpec], observed: dict, quarantined: int) -> QualityReport:
    return QualityReport(
        rows_checked=int(observed.get("rows") or 0),
        failures={r.name: int(observed.get(f"rule:{r.name}") or 0) for r in rules},
        rows_failing_any=int(observed.get("rules:any") or 0),
        rows_quarantined=quarantined,
        nulls={r.name: int(observed.get(f"rule_null:{r.name}") or 0) for r in rules},
    )


def fail_on_failed_rules(table: str, rules: Sequence[RuleSpec], quality: QualityReport) -> None:
    broken = {r.name: quality.failures.get(r.name, 0) for r in rules if r.action == "fail"}
    broken = {name: n for name, n in broken.items() if n}
    if broken:
        detail = ", ".join(f"{name}: {n} rows" for name, n in sorted(broken.items()))
        raise IncrementalLoadError(
            table,
            f"rows fail quality rules whose action is 'fail' ({detail}); nothing was committed.",
            "fix the source rows, or change the rule's check or action (warn / quarantine)",
        )


def timed_out(spec: TableSpec) -> RuleTimeoutError:
    """The error of a run whose rule-evaluating job ran past ``quality.rule_timeout``:
    every rule of the table is named (Spark evaluates them in one job, so which one held it
    is not known), those that match regular expressions first."""
    rules = spec.quality.rules
    limit = format_duration(spec.quality.rule_timeout)
    ordered = sorted(rules, key=lambda r: not _matches_patterns(r.check))
    named = "; ".join(f"'{r.name}' ({r.check})" for r in ordered)
    return RuleTimeoutError(
        spec.name,
        [r.name for r in ordered],
        f"the Spark job evaluating the table's quality rules ran past quality.rule_timeout "
        f"({limit}) and was cancelled. Its rules: {named}. Nothing was committed.",
        "correct the rule that takes this long (a regular expression with nested repetition, "
        "such as '(.*a){30}$', can backtrack for hours on one row: write it without the "
        "nested quantifier), or raise quality.rule_timeout when the window is simply large",
    )


def _matches_patterns(check: str) -> bool:
    return bool(_PATTERN_MATCH.search(check))


def score_check(report: QualityReport | None, minimum: float) -> CheckOutcome:
    """The run's share of rows passing every quality rule is at least ``minimum`` (a run
    that checked no rows passes)."""
    if report is None or not report.rows_checked:
        return CheckOutcome(True, "no rows checked in this run", {"quality_score": 1.0})
    metadata = {
        "quality_score": float(report.score),
        "min_score": float(minimum),
        "rows_checked": report.rows_checked,
        "rows_failing_any_rule": report.rows_failing_any,
        "rows_quarantined": report.rows_quarantined,
    }
    passed = report.score >= minimum
    verb = "at least" if passed else "below"
    return CheckOutcome(
        passed, f"quality score {report.score:.4f} is {verb} the minimum {minimum}", metadata
    )


def rules_not_null_check(report: QualityReport | None) -> CheckOutcome:
    """No rule was null for every row the run checked. Such a rule judges nothing (a
    ``check: NULL``, a misspelt or always-null column, a comparison with NULL) and fails
    every row: quarantined, or counted as failing, with the run otherwise green."""
    nulls = report.nulls if report else {}
    metadata: dict[str, object] = {
        "rows_checked": report.rows_checked if report else 0,
        **{f"rows_null_{name}": n for name, n in nulls.items()},
    }
    if report is None or not report.rows_checked:
        return CheckOutcome(True, "no rows checked in this run", metadata)
    always = report.always_null
    if not always:
        return CheckOutcome(True, "every rule was true or false for some row", metadata)
    named = ", ".join(f"'{name}'" for name in always)
    return CheckOutcome(
        False,
        f"quality rule{'s' if len(always) > 1 else ''} {named} "
        f"{'were' if len(always) > 1 else 'was'} NULL for all {report.rows_checked} rows "
        f"checked, so every row failed {'them' if len(always) > 1 else 'it'} without being "
        "judged. Fix the rule's check (a "
        "column that is always null, a misspelt name, a comparison with NULL); to accept a "
        "null value, say so in the check (`col IS NULL OR col > 0`).",
        metadata,
    )
