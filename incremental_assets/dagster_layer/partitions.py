"""Time partitions from a table's partitioning spec, and how a run's range maps to a
load request."""

from __future__ import annotations

import dagster as dg

from incremental_assets.engine.windows import LoadRequest
from incremental_assets.specs import TableSpec

BACKFILL_TAG = "dagster/backfill"
# Set on a run (e.g. from the launchpad) to re-read its partitions' whole windows, as a
# backfill does, without a backfill record.
RELOAD_TAG = "incremental_assets/reload"


def partitions_for(spec: TableSpec) -> dg.TimeWindowPartitionsDefinition:
    part = spec.partitioning
    if part.granularity == "hourly":
        return dg.HourlyPartitionsDefinition(
            start_date=part.start.strftime("%Y-%m-%d-%H:%M"),
            timezone="UTC",
            end_offset=part.end_offset,
        )
    return dg.DailyPartitionsDefinition(
        start_date=part.start.strftime("%Y-%m-%d"), timezone="UTC", end_offset=part.end_offset
    )


def automation_for(spec: TableSpec) -> dg.AutomationCondition:
    """A table loads its latest partition once that partition's hour or day has ended
    (the cron tick at its end, UTC), as a schedule built from the partitions would."""
    cron = "0 * * * *" if spec.partitioning.granularity == "hourly" else "0 0 * * *"
    return dg.AutomationCondition.on_cron(cron, cron_timezone="UTC")


def load_request(context: dg.AssetExecutionContext) -> LoadRequest:
    """The run's partition range as a load request. A backfill (a Dagster backfill, a run
    tagged ``incremental_assets/reload``, or any run over more than one partition)
    re-reads whole partition windows; a run of one partition reads from the table's cursor
    (and re-reads it whole if it lies behind)."""
    window = context.partition_time_window
    keys = context.partition_key_range
    label = keys.start if keys.start == keys.end else f"{keys.start}...{keys.end}"
    return LoadRequest(
        partition_start=window.start,
        partition_end=window.end,
        backfill=bool({BACKFILL_TAG, RELOAD_TAG} & set(context.run.tags)) or keys.start != keys.end,
        run_id=context.run_id,
        partition_label=label,
    )
