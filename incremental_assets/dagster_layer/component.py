"""``IncrementalTables``: the project's tables as a Dagster Component.

Declared in ``defs/<name>/defs.yaml``, either pointing at a tables file::

    type: incremental_assets.IncrementalTables
    attributes:
      tables_file: tables.yaml            # relative to this defs.yaml's folder

or with the tables inline, in the same shape as ``tables.yaml``::

    type: incremental_assets.IncrementalTables
    attributes:
      warehouse: {root: ./data/warehouse}
      tables:
        - name: orders
          ...

Either way the specs go through the same loader as ``tables.yaml`` (so a bad spec fails
with the same table-and-field message) and the same ``build_definitions``. ``dg check
yaml`` validates against a JSON schema generated from the spec models, so it points at the
field and line before anything loads; the loader's checks that need more than a schema
(unique names, known connections, overlapping targets) run when the definitions load
(``dg check defs``, ``dg list defs``).
"""

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import dagster as dg
from pydantic import BaseModel, Field, TypeAdapter, WithJsonSchema

from incremental_assets.dagster_layer.build import AUTOMATION_SENSOR, build_definitions
from incremental_assets.specs import ProjectSpec, load_project
from incremental_assets.specs.layers import LayerSpec
from incremental_assets.specs.loader import SpecError, parse_project
from incremental_assets.specs.models import ConnectionSpec, SparkSpec, TableSpec, WarehouseSpec
from incremental_assets.specs.strategies import STRATEGY_KINDS
from incremental_assets.specs.yaml_limits import value_problem


def _schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a spec type, as ``dg check yaml`` should apply it to YAML.

    Pydantic describes the models' *output*; the loader accepts more (a strategy by name,
    dates and durations as YAML gives them, watermark and keys filled in for snapshot and
    landing tables, settings of any scalar type), so those places are loosened here and
    left to the loader. ``$ref``s are inlined: the schema is embedded in dg's manifest,
    where references to ``$defs`` would dangle.
    """
    schema = TypeAdapter(annotation).json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, list):
            return [inline(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = inline(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {**target, **{k: inline(v) for k, v in node.items() if k != "$ref"}}
        # A discriminator's mapping names $defs; jsonschema ignores the keyword anyway.
        out = {k: inline(v) for k, v in node.items() if k != "discriminator"}
        if out.get("format") in ("date-time", "date", "duration"):
            # YAML reads 2026-01-01 as a date and 300 as a number: the loader parses both.
            out = {k: v for k, v in out.items() if k not in ("type", "format")}
        if out.get("additionalProperties") == {"type": "string"}:
            out["additionalProperties"] = {"type": ["string", "number", "boolean"]}
        if out.get("title") == "TableSpec":
            # Snapshot tables take their watermark, landing tables their keys and
            # watermark from the loader.
            out["required"] = [r for r in out["required"] if r not in ("keys", "watermark")]
            strategy = out["properties"]["strategy"]
            out["properties"]["strategy"] = {
                "description": strategy.get("description", ""),
                "anyOf": [{"enum": list(STRATEGY_KINDS)}, *strategy.get("oneOf", [strategy])],
            }
        return out

    return inline(schema)


# The attributes are kept as plain mappings (templates rendered) and validated by the
# project's own loader, whose messages name the table and field; the JSON schema is the
# spec models', for dg check yaml and editors (an omitted section is simply absent, so
# the schema is not made nullable: that would turn every field's error into one
# "not valid under any of the given schemas" on the whole section).
Tables = Annotated[list[dict[str, Any]] | None, WithJsonSchema(_schema(list[TableSpec]))]
Warehouse = Annotated[dict[str, Any] | None, WithJsonSchema(_schema(WarehouseSpec))]
Spark = Annotated[dict[str, Any] | None, WithJsonSchema(_schema(SparkSpec))]
Layers = Annotated[list[dict[str, Any]] | None, WithJsonSchema(_schema(list[LayerSpec]))]
_CONNECTION = _schema(ConnectionSpec)
_CONNECTION["properties"].pop("name", None)  # the key under connections is the name
_CONNECTION["properties"].pop("password", None)  # refused: passwords come from password_env
Connections = Annotated[
    dict[str, dict[str, Any]] | None,
    WithJsonSchema(
        {
            "type": "object",
            "additionalProperties": _CONNECTION,
            "description": "JDBC connections by name; tables name one in "
            "source.connection. Passwords come from password_env, never from here.",
        }
    ),
]


STARTER = """\
# A starter IncrementalTables component, written by `dg scaffold defs`. Change the table
# below to one of yours (the tables reference lists every field), or replace the inline
# spec with `tables_file: path/to/tables.yaml`. Then: dg check yaml, dg list defs.
type: {type_name}
attributes:
  warehouse:
    root: "{{{{ context.project_root }}}}/data/warehouse"
  tables:
    - name: {name}
      description: Rows of {name}, upserted by id when updated_at moves.
      source:
        format: parquet
        path: "{{{{ context.project_root }}}}/data/source/{name}"
      keys: [id]
      watermark:
        column: updated_at
        kind: timestamp
      strategy: upsert
      partitioning:
        granularity: daily
        start: "{start}"
"""


def _identifier(folder_name: str) -> str:
    """A folder's name as a table or job name: lower case, letters, digits and '_'."""
    name = re.sub(r"\W", "_", folder_name).lower()
    return name if name and not name[0].isdigit() else f"t_{name}"


class IncrementalTablesScaffolder(dg.Scaffolder):
    """``dg scaffold defs incremental_assets.IncrementalTables <name>``: a defs.yaml with one
    inline table named after the folder, partitioned from the day it was written."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        name = _identifier(request.target_path.name)
        start = datetime.now(timezone.utc).date().isoformat()
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(
            STARTER.format(type_name=request.type_name, name=name, start=start)
        )


@dg.scaffold_with(IncrementalTablesScaffolder)
class IncrementalTables(dg.Component, dg.Model, dg.Resolvable):
    """Source tables loaded incrementally into Delta Lake: one partitioned asset per table,
    with its checks, automation, landing sensors, the maintenance job and the resources.

    Give ``tables_file`` (a tables.yaml, relative to this defs.yaml's folder) or the tables
    inline (``warehouse``, ``tables``, and optionally ``spark`` and ``connections``), not
    both.
    """

    tables_file: str | None = Field(
        default=None,
        description="A tables.yaml to load, relative to this defs.yaml's folder (or "
        "absolute). Its relative paths resolve against its own folder.",
    )
    warehouse: Warehouse = Field(
        default=None, description="Inline: where targets live (as in tables.yaml)."
    )
    tables: Tables = Field(default=None, description="Inline: the table specs.")
    spark: Spark = Field(default=None, description="Inline: Spark settings.")
    connections: Connections = Field(default=None, description="Inline: JDBC connections.")
    layers: Layers = Field(
        default=None, description="Inline: declared layers after the tables (as in tables.yaml)."
    )

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext):
        """The component from its parsed attributes, once they are known to be cheap to
        resolve (see :func:`_refuse_costly`)."""
        if attributes is not None:
            _refuse_costly(attributes, context)
        return super().load(attributes, context)

    def project(self, folder: Path) -> ProjectSpec:
        """The validated specs; ``folder`` is the defs.yaml's (relative paths start there)."""
        inline = {
            key: value
            for key, value in (
                ("warehouse", self.warehouse),
                ("tables", self.tables),
                ("spark", self.spark),
                ("connections", self.connections),
                ("layers", self.layers),
            )
            if value is not None
        }
        source = str(folder / "defs.yaml")
        if self.tables_file and inline:
            raise ValueError(
                f"{source}: give either tables_file or the tables inline "
                f"({', '.join(sorted(inline))}), not both"
            )
        if self.tables_file:
            path = Path(self.tables_file)
            return load_project(path if path.is_absolute() else folder / path)
        if not inline:
            raise ValueError(
                f"{source}: IncrementalTables needs tables_file (a tables.yaml) or "
                "warehouse and tables inline"
            )
        return parse_project(inline, source=source, base_dir=folder)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        folder = context.path
        # Each component's tables get a maintenance job: maintain_tables for the shipped
        # defs/tables, maintain_tables_<folder> for others (ops are maintain_<table>).
        name = _identifier(folder.name)
        job = "maintain_tables" if name == "tables" else f"maintain_tables_{name}"
        defs = build_definitions(self.project(folder), maintenance_job_name=job)
        return _sharing_resources(defs, folder)


def _refuse_costly(attributes: BaseModel, context: dg.ComponentLoadContext) -> None:
    """Refuse attributes past the spec files' limits (specs/yaml_limits.py), naming the
    defs.yaml line.

    dg parses defs.yaml itself, before any code of this package runs: what aliases name is
    parsed once and shared. Resolving the attributes next renders every text value as a
    template, once per place it is used, so an alias bomb would run for minutes there.
    Measuring the shared values first costs as much as the file's text. (A file nested
    past Python's recursion limit fails inside dg's own parser, before this.)
    """
    values = {name: getattr(attributes, name) for name in type(attributes).model_fields}
    found = value_problem(values)
    if found is None:
        return
    path, problem = found
    key_path = ["attributes", *path]
    # A mapping entry's position is its key's line; a list item that is an alias has the
    # position of its anchor, so the line of the list holding it is the one to name.
    at = key_path[:-1] if isinstance(key_path[-1], int) else key_path
    tree = getattr(context.resolution_context, "source_position_tree", None)
    position = tree.lookup_closest_and_path(at, None)[0] if tree is not None else None
    if position is not None:
        source = position.filename
        where = f"{source}, line {position.start.line}, column {position.start.col}"
    else:
        source = str(context.path / "defs.yaml")
        where = ".".join(str(part) for part in key_path)
    raise SpecError(source, [(None, "yaml", f"{where}: {problem}")])


# Resources built by every IncrementalTables in this process, by key. Several components
# in one project share a resource when its settings are equal (Dagster merges definitions
# only when a key holds the same object); they cannot differ, for one Spark session serves
# a run whatever table it loads.
_RESOURCES: dict[str, tuple[Any, Path]] = {}
_AUTOMATION_OWNER: dict[str, Path] = {}


def _sharing_resources(defs: dg.Definitions, folder: Path) -> dg.Definitions:
    resources = {}
    for key, resource in (defs.resources or {}).items():
        seen, seen_folder = _RESOURCES.setdefault(key, (resource, folder))
        if seen is not resource and seen != resource and seen_folder != folder:
            raise ValueError(
                f"{folder / 'defs.yaml'} and {seen_folder / 'defs.yaml'} set different "
                f"'{key}' settings ({'spark' if key == 'spark' else 'warehouse'} section); "
                "the project's components share one: make them equal, or load both "
                "folders' tables from one tables file"
            )
        if seen_folder == folder:
            _RESOURCES[key] = (resource, folder)  # a reload of the same component
            seen = resource
        resources[key] = seen
    # The project's one automation sensor comes with the first component built.
    owner = _AUTOMATION_OWNER.setdefault("folder", folder)
    sensors = [s for s in defs.sensors or [] if owner == folder or s.name != AUTOMATION_SENSOR]
    return dg.Definitions(
        assets=defs.assets,
        asset_checks=defs.asset_checks,
        jobs=defs.jobs,
        schedules=defs.schedules,
        sensors=sensors,
        resources=resources,
        executor=defs.executor,
    )
