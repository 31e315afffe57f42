"""The demo's silver and gold assets after an invoices bronze table (``landing.refine:
invoices``): each materializes by itself once its upstream has new data (Dagster
automation).

(No ``from __future__ import annotations`` here: Dagster reads the context and resource
annotations.)
"""

import dagster as dg
from dagster_pyspark import PySparkResource

from incremental_assets.dagster_layer.checks import layer_check_results, layer_check_specs
from incremental_assets.dagster_layer.declared import AUTOMATION
from incremental_assets.dagster_layer.metadata import table_metadata
from incremental_assets.dagster_layer.pools import mark_worker
from incremental_assets.dagster_layer.resources import DeltaWarehouse, spark_session
from incremental_assets.demo.invoices import (
    GOLD_KEYS,
    SILVER_KEYS,
    gold_from_silver,
    silver_from_bronze,
)
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.specs import ProjectSpec, TableSpec


def layer_names(spec: TableSpec) -> tuple[str, str]:
    base = spec.name.removesuffix("_bronze")
    return f"{base}_silver", f"{base}_gold"


def _target(project: ProjectSpec, warehouse: DeltaWarehouse, name: str) -> DeltaTarget:
    return DeltaTarget(
        name, f"{project.warehouse.root.rstrip('/')}/{name}", warehouse.storage_options()
    )


def invoice_layers(project: ProjectSpec, spec: TableSpec) -> list[dg.AssetsDefinition]:
    silver_name, gold_name = layer_names(spec)
    bronze_key = dg.AssetKey(spec.name)

    @dg.asset(
        name=silver_name,
        group_name=spec.group,
        deps=[bronze_key],
        automation_condition=AUTOMATION,
        kinds={"spark", "delta"},
        pool=f"incremental_assets_{silver_name}",
        check_specs=layer_check_specs(silver_name, SILVER_KEYS),
        description=f"One row per invoice line of {spec.name}, upserted by (InvoiceNumber, "
        "ItemCode), reading only the bronze versions committed since its last run.",
    )
    def _silver(
        context: dg.AssetExecutionContext, spark: PySparkResource, warehouse: DeltaWarehouse
    ) -> dg.MaterializeResult:
        mark_worker(context)
        silver = _target(project, warehouse, silver_name)
        session = spark_session(spark)
        step = silver_from_bronze(session, warehouse.target(project, spec), silver)
        return dg.MaterializeResult(
            metadata=_metadata(step, silver, "bronze", SILVER_KEYS),
            check_results=layer_check_results(session, silver, SILVER_KEYS, step.version),
        )

    @dg.asset(
        name=gold_name,
        group_name=spec.group,
        deps=[dg.AssetKey(silver_name)],
        automation_condition=AUTOMATION,
        kinds={"spark", "delta"},
        pool=f"incremental_assets_{gold_name}",
        check_specs=layer_check_specs(gold_name, GOLD_KEYS),
        description=f"Daily sales per store and payment method from {silver_name}; a run "
        "recomputes only the days its new silver rows touch.",
    )
    def _gold(
        context: dg.AssetExecutionContext, spark: PySparkResource, warehouse: DeltaWarehouse
    ) -> dg.MaterializeResult:
        mark_worker(context)
        gold = _target(project, warehouse, gold_name)
        silver = _target(project, warehouse, silver_name)
        session = spark_session(spark)
        step = gold_from_silver(session, silver, gold)
        metadata = _metadata(step, gold, "silver", GOLD_KEYS)
        metadata["days_recomputed"] = ", ".join(d.isoformat() for d in step.days) or "-"
        return dg.MaterializeResult(
            metadata=metadata,
            check_results=layer_check_results(session, gold, GOLD_KEYS, step.version),
        )

    return [_silver, _gold]


def _metadata(step, target: DeltaTarget, upstream: str, keys: tuple[str, ...]) -> dict:
    return {
        f"{upstream}_version_from": step.upstream_from,
        f"{upstream}_version_to": step.upstream_to if step.upstream_to is not None else -1,
        "rows_read": step.rows_read,
        "rows_written": step.rows_written,
        "rows_deleted": step.rows_deleted,
        "committed": step.version is not None,
        "delta_version": step.version if step.version is not None else -1,
        **table_metadata(target.open() if target.exists() else None, dict.fromkeys(keys, "key")),
    }


def refined_layers(project: ProjectSpec) -> list[dg.AssetsDefinition]:
    """Silver and gold assets of every landing table that asks for them."""
    return [
        asset
        for spec in project.tables
        if spec.landing is not None and spec.landing.refine == "invoices"
        for asset in invoice_layers(project, spec)
    ]
