"""The late-rows check of every windowed table: rows at or below the cursor that the
target has not seen. Its own check, not one evaluated in the load's step: right after a
load it would pass; run on its own (hourly, by the automation sensor, or from the UI) it
notices late rows before a person has to.

- A folder source (Parquet, CSV, JSON) keeps a ledger of the files its loads covered, a
  Delta source the version its last load read (engine/late_files.py): the check reads
  only the files no load has read, or those the source's commits since then appended.
  Exact, at any age; the next run loads what it finds, so the check then passes.
- Where the ledger cannot tell (a database source; a Delta source whose commits since
  the last load rewrote files without a change data feed, or whose ledger has not begun)
  the check counts, for the last ``RECENT_PARTITIONS`` partitions its loads reached, the
  rows the source holds at or below the cursor against the target's (engine/
  reconcile.py). Rows later than the lookback in those partitions are found; a backfill
  of the partitions named repairs them. Older partitions: run
  ``incremental-assets reconcile`` over a longer range.
"""

from collections.abc import Iterator

import dagster as dg
from dagster_pyspark import PySparkResource
from pyspark.sql import SparkSession

from incremental_assets.dagster_layer.connections import DatabaseConnections
from incremental_assets.dagster_layer.partitions import partitions_for
from incremental_assets.dagster_layer.resources import DeltaWarehouse, spark_session
from incremental_assets.engine import late_files
from incremental_assets.engine.reconcile import recent_partitions, reconcile
from incremental_assets.engine.strategies import strategy_for
from incremental_assets.specs import ProjectSpec, TableSpec

LATE_ROWS = "no_late_rows_waiting"
CHECK_CRON = "30 * * * *"  # half past each hour, away from the loads at the hour
RECENT_PARTITIONS = 3
LEDGER_FORMATS = ("parquet", "csv", "json", "delta")


def checks_late_rows(spec: TableSpec) -> bool:
    """Tables read by watermark windows: not landing folders (loaded by file), not
    snapshots (the whole source each run); history tables only from a folder or Delta
    source (their target holds versions, which reconcile cannot count against source
    rows)."""
    if spec.landing is not None or strategy_for(spec).reads_whole_source:
        return False
    return spec.source.format in LEDGER_FORMATS or spec.history is None


def late_rows_checks(project: ProjectSpec, name: str) -> dg.AssetChecksDefinition | None:
    """One definition for the ``no_late_rows_waiting`` checks of every table that has one
    (None when none has): the checks due at a tick run as one step of one run, sharing
    one Spark session, instead of a run and a Spark start per table. A table whose check
    cannot run fails its own check, saying why; the others are still evaluated."""
    tables = [spec for spec in project.tables if checks_late_rows(spec)]
    if not tables:
        return None
    by_key = {dg.AssetCheckKey(dg.AssetKey(spec.name), LATE_ROWS): spec for spec in tables}

    @dg.multi_asset_check(
        name=name,
        specs=[_check_spec(spec) for spec in tables],
        can_subset=True,
        description="The no_late_rows_waiting checks of the project's tables: the ones due "
        "run together, one Spark session for all.",
    )
    def _late_rows(
        context: dg.AssetCheckExecutionContext,
        spark: PySparkResource,
        warehouse: DeltaWarehouse,
        databases: DatabaseConnections,
    ) -> Iterator[dg.AssetCheckResult]:
        session = spark_session(spark)
        for key in sorted(context.selected_asset_check_keys, key=lambda k: k.to_user_string()):
            spec = by_key[key]
            try:
                result = _evaluate(session, project, spec, warehouse, databases)
            except Exception as exc:  # one table's failure must not hide the others'
                context.log.exception(f"{spec.name}: the late-rows check could not run")
                result = dg.AssetCheckResult(
                    passed=False,
                    severity=dg.AssetCheckSeverity.ERROR,
                    description=f"the check could not run: {type(exc).__name__}: {exc}",
                )
            yield dg.AssetCheckResult(
                asset_key=key.asset_key,
                check_name=LATE_ROWS,
                passed=result.passed,
                severity=result.severity,
                description=result.description,
                metadata=result.metadata,
            )

    return _late_rows


def _check_spec(spec: TableSpec) -> dg.AssetCheckSpec:
    how = (
        "a read of the files no load has read (the folder's listing, or the Delta log's "
        "new versions)"
        if spec.source.format in LEDGER_FORMATS
        else f"a count of the last {RECENT_PARTITIONS} partitions' rows in source and target"
    )
    return dg.AssetCheckSpec(
        LATE_ROWS,
        asset=spec.name,
        description="No rows at or below the cursor wait in the source unseen by the "
        f"target (late rows). Costs {how}; evaluated at '{CHECK_CRON}' (UTC) while the "
        "automation sensor runs, with the other tables' checks due then, in one run and "
        "one Spark session.",
        automation_condition=dg.AutomationCondition.cron_tick_passed(
            CHECK_CRON, cron_timezone="UTC"
        ),
    )


def _evaluate(
    session: SparkSession,
    project: ProjectSpec,
    spec: TableSpec,
    warehouse: DeltaWarehouse,
    databases: DatabaseConnections,
) -> dg.AssetCheckResult:
    partitions = partitions_for(spec)
    ledger = spec.source.format in LEDGER_FORMATS
    run_spec = databases.bind(spec)
    target = warehouse.target(project, spec)
    found = None
    if ledger:
        found = late_files.pending(session, run_spec, target, warehouse.storage_options())
        if found is not None and (found.rows or _exact(found.ledger)):
            return _unread_files(spec, found, partitions)
        if found is None and spec.source.format != "delta":
            return dg.AssetCheckResult(passed=True, description="nothing loaded yet")
    unchecked = _unchecked(found.ledger) if found is not None else ""
    if spec.history is not None:
        return dg.AssetCheckResult(
            passed=found is None,
            severity=dg.AssetCheckSeverity.WARN,
            description=unchecked
            or "nothing to compare yet: the next load starts the source's ledger",
        )
    recent = recent_partitions(run_spec, target, RECENT_PARTITIONS)
    if recent is None:
        return dg.AssetCheckResult(passed=True, description="nothing loaded yet")
    # Rows gone from the source are reconcile's to report (they need every source
    # key); this check looks for rows missing from the target only.
    report = reconcile(
        session,
        run_spec,
        target,
        *recent,
        source_storage=warehouse.storage_options(),
        count_gone=False,
    )
    missing = [p for p in report.partitions if p.difference > 0]
    compared = f"{report.partitions[0].partition}...{report.partitions[-1].partition}"
    if not missing:
        return dg.AssetCheckResult(
            passed=True,
            description=f"no rows missing in partitions {compared} (cursor "
            f"{report.cursor}){'; ' + unchecked if unchecked else ''}",
            metadata={"rows_late_missing": 0, "partitions_compared": compared},
        )
    rows = sum(p.difference for p in missing)
    named = ", ".join(p.partition for p in missing)
    return dg.AssetCheckResult(
        passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{rows} row(s) the source holds at or below the cursor "
        f"({report.cursor}) are missing from the target in partition(s) {named}: rows "
        "that arrived after their window was loaded, beyond the lookback. A backfill "
        f"repairs them: incremental-assets reconcile {spec.name} --from "
        f"{missing[0].partition} --to {missing[-1].partition} --backfill"
        f"{'. ' + unchecked if unchecked else ''}",
        metadata={
            "rows_late_missing": rows,
            "partitions": named,
            "partitions_compared": compared,
        },
    )


def _exact(ledger: late_files.FileLedger) -> bool:
    return ledger.complete and not ledger.unchecked


def _unchecked(ledger: late_files.FileLedger) -> str:
    if not ledger.complete:
        what = "the source's log no longer holds every version since the last load"
    elif ledger.unchecked:
        what = (
            f"source version(s) {', '.join(str(v) for v in ledger.unchecked)} rewrote files "
            "(UPDATE, MERGE, overwrite) and the source has no change data feed"
        )
    else:
        return ""
    return (
        f"{what}: rows they wrote at or below the cursor cannot be told from copies. Set "
        "delta.enableChangeDataFeed = true on the source to have them read, or reconcile"
    )


def launch_command(
    table: str, late: tuple[str, ...], partitions: dg.TimeWindowPartitionsDefinition
) -> str:
    """The ``dg launch`` that loads late rows now: a run of their own partition, or one
    run over the range from the first to the last (a range is one run, as the assets'
    backfill policy is single-run, and re-reads those partitions whole). Every run reads
    the unread files whatever its partition, so naming the late rows' own partitions also
    re-reads their windows; keys outside the partitions (rows before the start) leave the
    latest partition, whose run reads the files too."""
    keys = [key for key in late if partitions.has_partition_key(key)]
    if not keys:
        keys = [partitions.get_last_partition_key() or ""]
    if len(keys) == 1:
        return f"dg launch --assets {table} --partition {keys[0]}"
    return f"dg launch --assets {table} --partition-range {keys[0]}...{keys[-1]}"


def _unread_files(
    spec: TableSpec, found: late_files.Pending, partitions: dg.TimeWindowPartitionsDefinition
) -> dg.AssetCheckResult:
    unchecked = _unchecked(found.ledger)
    if found.rows == 0:
        return dg.AssetCheckResult(
            passed=True,
            description=f"no late rows ({len(found.files)} unread file(s), none below the cursor)",
            metadata={"rows_late_waiting": 0, "files_unread": len(found.files)},
        )
    names = ", ".join(found.files[:5]) + (" ..." if len(found.files) > 5 else "")
    return dg.AssetCheckResult(
        passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{found.rows} row(s) at or below the cursor wait in "
        f"{len(found.files)} file(s) no load has read ({names}), in partition(s) "
        f"{', '.join(found.partitions)}. The next run of {spec.name} reads them; to load "
        f"them now: {launch_command(spec.name, found.partitions, partitions)}"
        f"{'. Also: ' + unchecked if unchecked else ''}",
        metadata={
            "rows_late_waiting": found.rows,
            "files_unread": len(found.files),
            "partitions": ", ".join(found.partitions),
        },
    )
