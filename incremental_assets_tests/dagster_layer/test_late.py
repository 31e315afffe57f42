"""A late file through Dagster: the load's metadata counts it, and the table's own
no_late_rows_waiting check fails while it waits and passes once the next run read it."""

import shutil

import dagster as dg

from incremental_assets.dagster_layer.late import LATE_ROWS
from incremental_assets_tests.builders import ParquetFolder, Project, at, feed, rows

FEED_YAML = """
warehouse:
  root: ./warehouse
tables:
  - name: orders
    source: {format: parquet, path: ./feed}
    keys: [id]
    watermark: {column: lsn, kind: id}
    strategy: {kind: cdc, deletes: hard}
    partitioning: {granularity: daily, start: 2026-01-01, column: changed_at}
"""


def _run_checks(
    project: Project, instance: dg.DagsterInstance, *tables: str
) -> dg.ExecuteInProcessResult:
    """One run of the late-rows checks of ``tables``, as the automation launches them."""
    keys = [dg.AssetCheckKey(dg.AssetKey(t), LATE_ROWS) for t in tables]
    job = dg.define_asset_job("late_check", selection=dg.AssetSelection.checks(*keys))
    defs = dg.Definitions(
        assets=project.defs.assets,
        asset_checks=project.defs.asset_checks,
        jobs=[job],
        resources=project.defs.resources,
    )
    return defs.resolve_job_def("late_check").execute_in_process(instance=instance)


def _check_only(project: Project, instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    (evaluation,) = _run_checks(project, instance, "orders").get_asset_check_evaluations()
    return evaluation


def test_the_late_rows_check_fails_until_the_next_run_reads_the_late_file(tmp_path):
    project = Project(tmp_path, FEED_YAML)
    folder = ParquetFolder(tmp_path / "feed")
    with dg.instance_for_test() as instance:
        folder.drop(feed((1, "a", "I", 1, at(1, 1))))
        project.materialize(instance, partition="2026-01-01")
        folder.drop(feed((2, "b", "I", 5, at(3, 1))))
        project.materialize(instance, partition="2026-01-03")
        assert _check_only(project, instance).passed

        folder.drop(feed((3, "c", "I", 3, at(2, 1)), (1, "a2", "U", 2, at(2, 2))))
        waiting = _check_only(project, instance)

        assert not waiting.passed
        assert waiting.severity == dg.AssetCheckSeverity.ERROR
        assert "2 row(s) at or below the cursor" in waiting.description
        assert "partition(s) 2026-01-02" in waiting.description
        assert "dg launch --assets orders --partition" in waiting.description

        result = project.materialize(instance, partition="2026-01-03")
        by_partition = {m.partition: m for m in result.asset_materializations_for_node("orders")}
        # The late rows are day 2's: that partition shows them, loaded by this run.
        assert set(by_partition) == {"2026-01-03", "2026-01-02"}
        assert by_partition["2026-01-02"].metadata["loaded_by_partition"].value == "2026-01-03"
        materialization = by_partition["2026-01-03"]
        assert materialization.metadata["rows_late"].value == 2
        assert materialization.metadata["files_late"].value == 1
        assert rows(project.target, "id", "name", "lsn") == [(1, "a2", 2), (2, "b", 5), (3, "c", 3)]
        assert _check_only(project, instance).passed


def test_rows_of_later_partitions_are_attributed_to_them(tmp_path):
    """An id watermark's run of day 1 reads every row above its cursor, so it loads day 2's
    rows too: its metadata counts rows by partition, and day 2 shows a materialization
    naming the run that loaded it."""
    project = Project(tmp_path, FEED_YAML)
    folder = ParquetFolder(tmp_path / "feed")
    folder.drop(
        feed((1, "a", "I", 1, at(1, 1)), (2, "b", "I", 2, at(2, 1)), (3, "c", "I", 3, at(2, 5)))
    )
    with dg.instance_for_test() as instance:
        result = project.materialize(instance, partition="2026-01-01")

        events = result.asset_materializations_for_node("orders")
        (own,) = [m for m in events if m.partition == "2026-01-01"]
        assert own.metadata["rows_by_partition"].value == {"2026-01-01": 1, "2026-01-02": 2}
        later = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("orders"), asset_partitions=["2026-01-02"]),
            limit=1,
        ).records
        assert later, "day 2 holds rows but shows no materialization"
        event = later[0].asset_materialization
        assert event.metadata["rows_loaded"].value == 2
        assert event.metadata["loaded_by_partition"].value == "2026-01-01"


def test_a_delta_sources_late_commit_fails_the_check_until_the_next_run_loads_it(tmp_path):
    """A Delta source's ledger is the version each load read: the check reads the files
    the source's commits appended since then, and the next run loads them."""
    project = Project(tmp_path)  # orders on a Delta source, timestamp watermark, lookback 1h
    with dg.instance_for_test() as instance:
        project.source.upsert([(1, "new", 10.0, at(1, 8)), (2, "new", 20.0, at(2, 9))])
        project.materialize(instance, partition="2026-01-02")
        assert _check_only(project, instance).passed

        project.source.upsert([(3, "late", 30.0, at(2, 2))])  # 7h behind the cursor
        waiting = _check_only(project, instance)

        assert not waiting.passed
        assert "1 row(s) at or below the cursor wait in 1 file(s)" in waiting.description
        assert "partition(s) 2026-01-02" in waiting.description
        result = project.materialize(instance, partition="2026-01-02")  # no backfill
        (event,) = result.asset_materializations_for_node("orders")
        assert (event.metadata["rows_late"].value, event.metadata["files_late"].value) == (1, 1)
        assert _check_only(project, instance).passed


def test_a_delta_rewrite_without_change_feed_is_checked_by_counts_and_named(tmp_path):
    """A MERGE that rewrote files cannot be read for late rows without the source's change
    data feed: the check counts the last partitions in source and target instead, and
    says why and what to set; a backfill repairs what it finds."""
    project = Project(tmp_path)
    with dg.instance_for_test() as instance:
        project.source.upsert([(1, "new", 10.0, at(1, 8)), (2, "new", 20.0, at(2, 9))])
        project.materialize(instance, partition="2026-01-02")

        project.source.upsert([(1, "moved", 10.0, at(2, 2))])  # an update: files rewritten
        waiting = _check_only(project, instance)

        assert not waiting.passed
        assert "1 row(s) the source holds at or below the cursor" in waiting.description
        assert "reconcile orders --from 2026-01-02 --to 2026-01-02 --backfill" in (
            waiting.description
        )
        assert "delta.enableChangeDataFeed = true" in waiting.description
        project.materialize(instance, partition_range=("2026-01-01", "2026-01-02"))  # backfill
        assert _check_only(project, instance).passed


def test_the_late_rows_checks_command_names_the_late_rows_own_partitions(tmp_path):
    """The fix command launches the partitions the late rows belong to (their partition
    column), not the latest partition: one partition by itself, several as one run over
    their range; running the command as written loads them, and the check passes."""
    project = Project(tmp_path, FEED_YAML)
    folder = ParquetFolder(tmp_path / "feed")
    with dg.instance_for_test() as instance:
        folder.drop(feed((1, "a", "I", 1, at(1, 1)), (2, "b", "I", 5, at(4, 1))))
        project.materialize(instance, partition="2026-01-04")

        folder.drop(feed((3, "c", "I", 3, at(2, 1))))
        waiting = _check_only(project, instance)
        assert not waiting.passed
        assert waiting.description.endswith(
            "to load them now: dg launch --assets orders --partition 2026-01-02"
        )
        project.materialize(instance, partition="2026-01-02")  # the command, as written
        assert _check_only(project, instance).passed

        folder.drop(feed((4, "d", "I", 2, at(1, 5)), (1, "a2", "U", 4, at(3, 2))))
        waiting = _check_only(project, instance)
        assert not waiting.passed
        assert "in partition(s) 2026-01-01, 2026-01-03" in waiting.description
        assert waiting.description.endswith(
            "dg launch --assets orders --partition-range 2026-01-01...2026-01-03"
        )
        project.materialize(instance, partition_range=("2026-01-01", "2026-01-03"))
        assert _check_only(project, instance).passed
        assert rows(project.target, "id", "name", "lsn") == [
            (1, "a2", 4),
            (2, "b", 5),
            (3, "c", 3),
            (4, "d", 2),
        ]


TWO_FEEDS_YAML = (
    FEED_YAML
    + """
  - name: customers
    source: {format: parquet, path: ./customers}
    keys: [id]
    watermark: {column: lsn, kind: id}
    strategy: {kind: cdc, deletes: hard}
    partitioning: {granularity: daily, start: 2026-01-01, column: changed_at}
"""
)


def test_the_checks_due_together_run_in_one_step_and_a_broken_table_fails_only_its_own(
    tmp_path,
):
    """Every table's late-rows check is one multi-check: the checks due at a tick run as
    one step of one run (one Spark session, not one per table). A table whose check
    cannot run (its source folder gone) fails its own check saying why; the other table's
    late rows are still found."""
    project = Project(tmp_path, TWO_FEEDS_YAML)
    orders, customers = ParquetFolder(tmp_path / "feed"), ParquetFolder(tmp_path / "customers")
    with dg.instance_for_test() as instance:
        orders.drop(feed((1, "a", "I", 1, at(2, 1))))
        customers.drop(feed((1, "x", "I", 1, at(2, 1))))
        assets = [project.defs.get_assets_def(n) for n in ("orders", "customers")]
        dg.materialize(
            assets, partition_key="2026-01-02", instance=instance, resources=project.defs.resources
        )
        orders.drop(feed((2, "b", "I", 0, at(1, 1))))  # late: below the cursor
        shutil.rmtree(customers.path)

        result = _run_checks(project, instance, "orders", "customers")

        steps = {e.step_key for e in result.all_events if e.step_key}
        assert len(steps) == 1, steps
        evaluations = {
            e.asset_key.to_user_string(): e for e in result.get_asset_check_evaluations()
        }
        assert set(evaluations) == {"orders", "customers"}
        assert not evaluations["orders"].passed
        assert "1 row(s) at or below the cursor" in evaluations["orders"].description
        assert not evaluations["customers"].passed
        assert evaluations["customers"].description.startswith("the check could not run: ")
        assert "customers" in evaluations["customers"].description
