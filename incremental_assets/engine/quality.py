"""Data-quality rules: Spark SQL checks on every extracted row, and the quarantine.

Each rule is a boolean expression; a row fails it when the expression is false or null.
Rows failing a ``quarantine`` rule are diverted to a Delta table beside the target
(``<target>__quarantine``) with the names of the rules they failed, the run id and the
time; rows failing only ``warn`` rules are kept and counted; any row failing a ``fail``
rule fails the run before anything is committed. Quarantined rows never hold the
watermark back: fixed rules or data are replayed into the target later (``replay``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from incremental_assets.engine.checks import CheckOutcome
from incremental_assets.engine.errors import IncrementalLoadError
from incremental_assets.specs.models import RuleSpec

FAILED = "_ia_failed_rules"
RUN_ID, QUARANTINED_AT = "_ia_run_id", "_ia_quarantined_at"
QUARANTINE_COLUMNS = (FAILED, RUN_ID, QUARANTINED_AT)


@dataclass(frozen=True)
class QualityReport:
    """Per run: rows checked, rows failing each rule, rows quarantined, and the score (the
    share of rows that passed every rule)."""

    rows_checked: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    rows_failing_any: int = 0
    rows_quarantined: int = 0

    @property
    def score(self) -> float:
        if not self.rows_checked:
            return 1.0
        return round(1 - self.rows_failing_any / self.rows_checked, 6)


def failed_rules(table: str, df: DataFrame, rules: Sequence[RuleSpec]) -> DataFrame:
    """Add ``_ia_failed_rules``: the names of the rules a row fails (empty when none).

    Raises:
        IncrementalLoadError: a rule is not valid Spark SQL for these columns.
    """
    checks = []
    for rule in rules:
        try:
            expression = F.expr(rule.check)
            df.select(expression.cast("boolean")).schema  # noqa: B018 - analyse now
        except (AnalysisException, ParseException) as exc:
            raise IncrementalLoadError(
                table,
                f"quality rule '{rule.name}' ({rule.check!r}) cannot be evaluated: "
                f"{str(exc).splitlines()[0]}",
                "correct the rule's check (a Spark SQL boolean expression over the source "
                f"columns: {', '.join(df.columns)})",
            ) from None
        passed = F.coalesce(expression.cast("boolean"), F.lit(False))
        checks.append(F.when(~passed, F.lit(rule.name)))
    return df.withColumn(FAILED, F.filter(F.array(*checks), lambda name: name.isNotNull()))


def counters(rules: Sequence[RuleSpec]) -> list[Column]:
    """Aggregates for a Spark observation: rows failing each rule, and any rule."""
    failed = F.col(FAILED)
    return [
        *[
            F.sum(F.array_contains(failed, r.name).cast("int")).alias(f"rule:{r.name}")
            for r in rules
        ],
        F.sum((F.size(failed) > 0).cast("int")).alias("rules:any"),
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
