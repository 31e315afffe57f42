"""Landing tables in Dagster: a sensor per landing folder, and the metadata and check that
report the files a run loaded, left waiting or quarantined.

(No ``from __future__ import annotations`` here: Dagster reads the sensor's resource
annotation.)
"""

import hashlib
import json

import dagster as dg

from incremental_assets.dagster_layer.partitions import partitions_for
from incremental_assets.dagster_layer.resources import DeltaWarehouse
from incremental_assets.engine.landing import FileIndex, LandingReport, list_files
from incremental_assets.engine.load import LoadResult
from incremental_assets.specs import ProjectSpec, TableSpec

FILES_QUARANTINED = "no_files_quarantined"


def sensor_name(spec: TableSpec) -> str:
    return f"{spec.name}_landing_files"


def landing_sensor(project: ProjectSpec, spec: TableSpec) -> dg.SensorDefinition:
    """Requests a run of the table's latest partition when the folder holds ready files
    that the table's file index does not know yet.

    The cursor is a digest of those pending files: the same pending set is requested once
    (a run that fails is retried when the set changes, or by the table's automation when its
    day ends). The run itself
    decides what to load from the bronze table's log, so a lagging index only costs a run
    that loads nothing.
    """
    landing = spec.landing
    assert landing is not None
    partitions = partitions_for(spec)

    @dg.sensor(
        name=sensor_name(spec),
        asset_selection=[spec.name],
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Watches {spec.source.path} for new or changed {spec.source.format} "
        f"files (settled for {landing.settle}) and loads them into {spec.name}.",
    )
    def _watch(context: dg.SensorEvaluationContext, warehouse: DeltaWarehouse):
        listing = list_files(str(spec.source.path), landing, None, warehouse.storage_options())
        known = FileIndex(warehouse.target(project, spec)).known()
        pending = [f for f in listing.ready if f.identity not in known]
        if not pending:
            return dg.SkipReason(
                f"no new files ({len(listing.ready)} ready and loaded, "
                f"{len(listing.waiting)} still settling)"
            )
        digest = hashlib.sha256(json.dumps([f.identity for f in pending]).encode()).hexdigest()[:32]
        if digest == context.cursor:
            return dg.SkipReason(f"a run was already requested for {len(pending)} new files")
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"{spec.name}:{digest}",
                    partition_key=partitions.get_last_partition_key(),
                    tags={"incremental_assets/new_files": str(len(pending))},
                )
            ],
            cursor=digest,
        )

    return _watch


def landing_check_specs(spec: TableSpec) -> list[dg.AssetCheckSpec]:
    if spec.landing is None:
        return []
    return [
        dg.AssetCheckSpec(
            FILES_QUARANTINED,
            asset=spec.name,
            description="No file of the run was malformed (malformed files are moved to "
            "the quarantine folder with a reason and do not stop the others).",
        )
    ]


def landing_check_results(result: LoadResult) -> list[dg.AssetCheckResult]:
    report = result.landing
    if not isinstance(report, LandingReport):
        return []
    bad = report.quarantined
    return [
        dg.AssetCheckResult(
            check_name=FILES_QUARANTINED,
            passed=not bad,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"{len(bad)} files quarantined" if bad else "no file quarantined",
            metadata={"files_quarantined": len(bad), "reasons": json.dumps(bad, indent=1)},
        )
    ]


def landing_metadata(result: LoadResult) -> dict[str, object]:
    report = result.landing
    if not isinstance(report, LandingReport):
        return {}
    metadata: dict[str, object] = {
        "files_ready": report.files_seen,
        "files_loaded": len(report.files_loaded),
        "files_already_loaded": report.files_already_loaded,
        "files_waiting": report.files_waiting,
        "files_changed_while_read": report.files_changed_while_read,
        "files_quarantined": len(report.quarantined),
    }
    if report.files_loaded:
        metadata["loaded"] = "\n".join(f.path for f in report.files_loaded[:100])
    if report.quarantined:
        metadata["quarantined"] = dg.MetadataValue.json(report.quarantined)
    return metadata
