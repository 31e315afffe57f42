"""What a declared layer reads and writes: its own Delta table, its upstream (with the
keys that identify the upstream's rows) and how Spark SQL names every table and layer of
the project, for the joins of a row layer's SELECT."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.catalog import sql_table
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import LayerError
from incremental_assets.specs.layers import LayerSpec
from incremental_assets.specs.models import ProjectSpec, SourceSpec


@dataclass(frozen=True)
class LayerInputs:
    layer: LayerSpec
    target: DeltaTarget
    upstream: DeltaTarget
    # What identifies an upstream row: a table's row identity, a layer's keys.
    upstream_keys: tuple[str, ...]
    # Every table, and every layer declared before this one, by its declared name -> its
    # name in Spark SQL.
    tables: Mapping[str, str]
    # The upstream is a landing table (its loads record each file version, rows or none).
    upstream_landing: bool = False
    # Where the upstream table's rows come from (None: the upstream is a layer): a
    # streaming layer reads its folder of files.
    source: SourceSpec | None = None

    def require_upstream(self) -> None:
        """Raise a :class:`LayerError` naming the fix when the upstream has no Delta table
        yet."""
        if not self.upstream.exists():
            raise LayerError(
                self.layer.name,
                "from",
                f"the upstream '{self.layer.upstream}' has no Delta table yet at "
                f"{self.upstream.path}",
                f"materialize '{self.layer.upstream}' first",
            )


def layer_inputs(
    project: ProjectSpec, layer: LayerSpec, storage_options: Mapping[str, str] | None = None
) -> LayerInputs:
    """``layer``'s inputs in ``project`` (``storage_options``: delta-rs's, to read logs)."""
    options = dict(storage_options or {})
    targets: dict[str, tuple[DeltaTarget, tuple[str, ...]]] = {}
    for spec in project.tables:
        target = DeltaTarget(
            spec.name, project.target_path(spec), options, catalog_table=spec.target.table
        )
        targets[spec.name] = (target, tuple(spec.row_identity))
    for other in project.layers:
        if other.name == layer.name:
            break  # a select names tables and the layers declared before it
        target = DeltaTarget(other.name, project.layer_path(other), options)
        targets[other.name] = (target, other.keys_of_layer)
    upstream, keys = targets[layer.upstream]
    landing = {spec.name for spec in project.tables if spec.landing is not None}
    table = next((t for t in project.tables if t.name == layer.upstream), None)
    return LayerInputs(
        layer=layer,
        target=DeltaTarget(layer.name, project.layer_path(layer), options),
        upstream=upstream,
        upstream_keys=keys,
        tables={
            name: sql_table(delta_io.spark_uri(t.path), t.catalog_table)
            for name, (t, _) in targets.items()
        },
        upstream_landing=layer.upstream in landing,
        source=table.source if table is not None else None,
    )
