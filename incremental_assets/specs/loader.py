"""Load ``tables.yaml`` into a validated :class:`ProjectSpec`, with errors that name the
table and the field to change."""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from incremental_assets.specs.landing import OBJECT_STORE_SCHEMES, quarantine_folder
from incremental_assets.specs.layers import (
    LAYER_KINDS,
    LAYER_MODELS,
    RETRACTABLE,
    AggregateLayerSpec,
    LayerSpec,
    RowLayerSpec,
    names_read,
)
from incremental_assets.specs.locations import (
    Storage,
    catalog_overlaps,
    conflicts,
    layer_folder_problems,
    readable_by_spark,
)
from incremental_assets.specs.models import (
    ConnectionSpec,
    ProjectSpec,
    SparkSpec,
    TableSpec,
    WarehouseSpec,
)
from incremental_assets.specs.strategies import (
    AppendStrategy,
    CdcStrategy,
    Scd2Strategy,
    SnapshotStrategy,
    UpsertStrategy,
)
from incremental_assets.specs.yaml_limits import LimitedComposer, yaml_problem

STRATEGY_MODELS: dict[str, type[BaseModel]] = {
    "append": AppendStrategy,
    "upsert": UpsertStrategy,
    "cdc": CdcStrategy,
    "snapshot": SnapshotStrategy,
    "scd2": Scd2Strategy,
}

_CONNECTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URI_SCHEMES = (*OBJECT_STORE_SCHEMES, "file://")


class LayerLabel(str):
    """A problem's owner that is a declared layer, not a table."""


class SpecError(ValueError):
    """A table spec is invalid. ``problems`` lists (table, field, message) triples (the
    table a :class:`LayerLabel` when the problem is a layer's)."""

    def __init__(self, source: str, problems: list[tuple[str | None, str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"invalid table spec in {source}:"]
        for table, field, message in problems:
            kind = "layer" if isinstance(table, LayerLabel) else "table"
            where = f"{kind} '{table}'" if table else "top level"
            lines.append(f"  - {where}, field '{field}': {message}")
        super().__init__("\n".join(lines))


class _UniqueKeyLoader(LimitedComposer, yaml.SafeLoader):
    """A YAML loader that refuses duplicate keys instead of silently keeping the last one,
    and files whose aliases expand, or whose values nest, past the limits of
    specs/yaml_limits.py."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node)
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# Dates stay text: the models parse them, so a bad date is reported with its table and field
# rather than as a bare YAML error.
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_project(path: str | os.PathLike[str]) -> ProjectSpec:
    """Read and validate a ``tables.yaml``; relative paths resolve against its folder.

    Raises:
        SpecError: naming each table and field that is wrong, and how to fix it.
    """
    path = Path(path)
    if not path.exists():
        raise SpecError(str(path), [(None, "file", "does not exist")])
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise SpecError(str(path), [(None, "yaml", yaml_problem(exc, str(path)))]) from None
    return parse_project(raw, source=str(path), base_dir=path.parent)


def _landing_read_in_place(spec: TableSpec, target: str) -> list[tuple[str | None, str, str]]:
    """An az:// landing folder without its account, where Spark reads its files in place:
    a target on an object store. Into a local warehouse delta-rs copies the new files
    first and finds the account in the storage options."""
    if spec.landing is None or "://" not in target:
        return []
    try:
        readable_by_spark(spec.source.path)
    except ValueError as error:
        why = "the target is on an object store, so Spark reads the landing files in place"
        return [(spec.name, "source.path", f"{error} ({why})")]
    return []


def parse_project(raw: Any, source: str, base_dir: Path) -> ProjectSpec:
    if not isinstance(raw, dict):
        raise SpecError(source, [(None, "file", "must be a mapping with 'warehouse' and 'tables'")])
    problems: list[tuple[str | None, str, str]] = []
    sections = ["warehouse", "tables", "spark", "connections", "layers"]
    unknown = set(raw) - set(sections)
    for key in sorted(unknown):
        problems.append((None, key, _unknown_field_message(key, sections)))

    warehouse = None
    try:
        warehouse = WarehouseSpec.model_validate(raw.get("warehouse") or {})
        warehouse = warehouse.model_copy(update={"root": _resolve(warehouse.root, base_dir)})
    except ValidationError as exc:
        problems.extend(_problems(None, exc, WarehouseSpec, prefix="warehouse"))

    spark = SparkSpec()
    try:
        spark = SparkSpec.model_validate(raw.get("spark") or {})
    except ValidationError as exc:
        problems.extend(_problems(None, exc, SparkSpec, prefix="spark"))

    connections, declared = _connections(raw.get("connections"), problems)

    tables_raw = raw.get("tables")
    if not isinstance(tables_raw, list) or not tables_raw:
        problems.append((None, "tables", "must be a non-empty list of table specs"))
        tables_raw = []

    tables: list[TableSpec] = []
    seen: dict[str, str] = {}
    for index, table_raw in enumerate(tables_raw):
        name = table_raw.get("name") if isinstance(table_raw, dict) else None
        label = name if isinstance(name, str) else f"#{index + 1}"
        if not isinstance(table_raw, dict):
            problems.append((label, "-", "each table must be a mapping"))
            continue
        try:
            spec = TableSpec.model_validate(table_raw)
        except ValidationError as exc:
            problems.extend(_problems(label, exc, TableSpec))
            continue
        other = seen.get(spec.name.casefold())
        seen.setdefault(spec.name.casefold(), spec.name)
        if other == spec.name:
            problems.append((spec.name, "name", "is used by another table; names must be unique"))
        elif other is not None:
            problems.append(
                (
                    spec.name,
                    "name",
                    f"differs from table '{other}' only in case; on a store or disk that "
                    "folds case their targets are one folder: rename one of them",
                )
            )
        spec = _with_connection(spec, connections, declared, table_raw, problems)
        tables.append(_resolve_paths(spec, base_dir))

    if warehouse is not None:
        root = warehouse.root.rstrip("/")
        problems.extend(conflicts(_storage(t, t.target.path or f"{root}/{t.name}") for t in tables))
        for t in tables:
            problems.extend(_landing_read_in_place(t, t.target.path or f"{root}/{t.name}"))
    problems.extend(catalog_overlaps((t.name, t.target.table) for t in tables))
    layers = _layers(raw.get("layers"), tables, problems)
    if warehouse is not None and layers:
        root = warehouse.root.rstrip("/")
        storages = [_storage(t, t.target.path or f"{root}/{t.name}") for t in tables]
        folders = [(layer.name, f"{root}/{layer.name}") for layer in layers]
        problems.extend(layer_folder_problems(storages, folders))

    if problems:
        raise SpecError(source, problems)
    assert warehouse is not None
    return ProjectSpec(
        warehouse=warehouse, tables=tables, spark=spark, connections=connections, layers=layers
    )


def _layers(
    raw: Any, tables: list[TableSpec], problems: list[tuple[str | None, str, str]]
) -> list[LayerSpec]:
    """The ``layers`` section: each layer after a table or an earlier layer."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.append((None, "layers", "must be a list of layers (name, from, ...)"))
        return []
    known: dict[str, str] = {t.name: "table" for t in tables}
    folded = {name.casefold(): name for name in known}
    out: list[LayerSpec] = []
    for index, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        label = LayerLabel(name if isinstance(name, str) else f"#{index + 1}")
        if not isinstance(item, dict):
            problems.append((label, "-", "each layer must be a mapping (name, from, ...)"))
            continue
        kind = item.get("kind", "row")
        model = LAYER_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            problems.append((label, "kind", f"got {kind!r}; use one of {', '.join(LAYER_KINDS)}"))
            continue
        try:
            layer = model.model_validate({**item, "kind": kind})
        except ValidationError as exc:
            problems.extend(_problems(label, exc, model))
            continue
        other = folded.get(layer.name.casefold())
        if other is not None:
            what = known[other]
            problems.append(
                (
                    label,
                    "name",
                    f"is already the name of a {what} ('{other}'); tables and layers need "
                    "names unique regardless of case (each is a folder and an asset)",
                )
            )
            continue
        if "__" in layer.name:
            problems.append(
                (label, "name", "holds '__', which names the loader's side tables; use one '_'")
            )
        _check_upstream(label, layer, known, problems)
        if layer.streaming and known.get(layer.upstream) in ("table", "layer"):
            _check_streamed_source(label, layer, tables, problems)
        known[layer.name] = "layer"
        folded[layer.name.casefold()] = layer.name
        out.append(layer)
    return out


def _check_upstream(
    label: LayerLabel,
    layer: LayerSpec,
    known: dict[str, str],
    problems: list[tuple[str | None, str, str]],
) -> None:
    if layer.upstream not in known:
        close = difflib.get_close_matches(layer.upstream, list(known), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        problems.append(
            (
                label,
                "from",
                f"unknown upstream {layer.upstream!r}{hint}: name a table or a layer declared "
                f"before this one ({', '.join(known)})",
            )
        )
    elif isinstance(layer, RowLayerSpec) and layer.upstream.lower() not in names_read(layer.select):
        problems.append(
            (
                label,
                "select",
                f"does not read its upstream '{layer.upstream}': name it in the FROM clause "
                "(each run binds that name to the upstream rows that changed)",
            )
        )


def _check_streamed_source(
    label: LayerLabel,
    layer: LayerSpec,
    tables: list[TableSpec],
    problems: list[tuple[str | None, str, str]],
) -> None:
    """A streaming layer reads its upstream table's folder of files as they arrive (with
    the declared schema, or one its first run infers and keeps), or,
    after a layer or a table whose source is not a folder of files, the upstream's Delta
    table: a layer's change data feed, whose updates and deletes the aggregates subtract
    (so only sum and count)."""
    spec = next((t for t in tables if t.name == layer.upstream), None)
    if isinstance(layer, RowLayerSpec):
        if layer.reads == "files" and (spec is None or not spec.source.streams_files):
            what = "a layer" if spec is None else f"a table read from {spec.source.format}"
            problems.append(
                (
                    label,
                    "reads",
                    f"reads: files streams the files of the upstream table's folder, but "
                    f"'{layer.upstream}' is {what}: follow a table whose source is a folder "
                    "of csv, json or parquet files, or remove reads (the query then reads "
                    "the upstream's Delta table)",
                )
            )
        return  # by default it reads the upstream's Delta table, whatever fills it
    if spec is None and isinstance(layer, AggregateLayerSpec):
        kept = [a.name for a in layer.aggregates if a.function not in RETRACTABLE]
        if kept:
            problems.append(
                (
                    label,
                    "aggregates",
                    f"{', '.join(kept)}: a streaming layer after the layer "
                    f"'{layer.upstream}' reads its change data feed and subtracts the "
                    "rows an update or a delete replaced; only sum and count can be "
                    "subtracted: use them, or set run: batch",
                )
            )


def _storage(spec: TableSpec, target: str) -> Storage:
    """Where ``spec`` writes and reads, for the check that no two tables share storage."""
    source, landing = spec.source.path, spec.source.landing
    return Storage(
        table=spec.name,
        target=target,
        source=source,
        source_is_delta=spec.source.format == "delta",
        landing=landing is not None,
        quarantine=quarantine_folder(source, landing) if source and landing else None,
    )


def _connections(
    raw: Any, problems: list[tuple[str | None, str, str]]
) -> tuple[dict[str, ConnectionSpec], set[str]]:
    """The top-level ``connections`` section: the valid connections by name, and every
    declared name (tables naming an invalid one get no second error)."""
    if raw is None:
        return {}, set()
    if not isinstance(raw, dict):
        problems.append((None, "connections", "must be a mapping of connection names"))
        return {}, set()
    out: dict[str, ConnectionSpec] = {}
    for name, settings in raw.items():
        where = f"connections.{name}"
        if not isinstance(name, str) or not _CONNECTION_NAME.match(name):
            problems.append(
                (None, where, "is not a valid connection name; use letters, digits and '_'")
            )
            continue
        if not isinstance(settings, dict):
            problems.append((None, where, "must be a mapping with url, driver, user, ..."))
            continue
        if "password" in settings:
            problems.append(
                (
                    None,
                    f"{where}.password",
                    "passwords are never written in tables.yaml; put it in an environment "
                    "variable and name that variable in password_env",
                )
            )
            continue
        if "name" in settings:
            problems.append((None, f"{where}.name", "a connection's name is its key; remove it"))
            continue
        try:
            out[name] = ConnectionSpec.model_validate({**settings, "name": name})
        except ValidationError as exc:
            problems.extend(_problems(None, exc, ConnectionSpec, prefix=where))
    return out, {str(name) for name in raw}


def _with_connection(
    spec: TableSpec,
    connections: dict[str, ConnectionSpec],
    declared: set[str],
    raw: dict[str, Any],
    problems: list[tuple[str | None, str, str]],
) -> TableSpec:
    """A jdbc table's connection name replaced by the declared connection."""
    if spec.source.format != "jdbc":
        return spec
    name = spec.source.connection
    if not isinstance(name, str) or not isinstance(raw.get("source", {}).get("connection"), str):
        problems.append(
            (
                spec.name,
                "source.connection",
                "must name a connection declared under the top-level 'connections'",
            )
        )
        return spec
    if name in declared and name not in connections:
        return spec  # the connection's own problem is reported
    if name not in connections:
        names = ", ".join(sorted(declared)) or "none declared"
        close = difflib.get_close_matches(name, list(connections), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        problems.append(
            (
                spec.name,
                "source.connection",
                f"unknown connection {name!r}{hint}; connections: {names}",
            )
        )
        return spec
    source = spec.source.model_copy(update={"connection": connections[name]})
    return spec.model_copy(update={"source": source})


def _resolve(location: str, base_dir: Path) -> str:
    if location.startswith(_URI_SCHEMES):
        return location
    location = os.path.expandvars(os.path.expanduser(location))
    return str((base_dir / location).resolve())


def _resolve_paths(spec: TableSpec, base_dir: Path) -> TableSpec:
    source = spec.source
    if source.path is not None:  # jdbc sources have none
        source = source.model_copy(update={"path": _resolve(source.path, base_dir)})
    target = spec.target
    if target.path:
        target = target.model_copy(update={"path": _resolve(target.path, base_dir)})
    return spec.model_copy(update={"source": source, "target": target})


def _problems(
    table: str | None, exc: ValidationError, model: type[BaseModel], prefix: str = ""
) -> list[tuple[str | None, str, str]]:
    out = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"] if not isinstance(part, int)]
        # pydantic reports union members and validators as path parts; keep field names only.
        loc = [part for part in loc if not part.startswith(("function-", "timedelta", "int"))]
        owner: type[BaseModel] = model
        within = loc[:-1]
        if len(loc) > 1 and loc[0] == "strategy" and loc[1] in STRATEGY_MODELS:
            # A strategy's options: the tag pydantic puts in the path is not a field (nor
            # is the tag of scd2's nested 'changes').
            owner, rest = STRATEGY_MODELS[loc[1]], loc[2:]
            if len(rest) > 1 and rest[0] == "changes" and rest[1] in STRATEGY_MODELS:
                owner, rest = STRATEGY_MODELS[rest[1]], ["changes", *rest[2:]]
                within = rest[1:-1]
            else:
                within = rest[:-1]
            loc = ["strategy", *rest]
        if error["type"].startswith("field:"):
            # A table-level rule about one field names that field.
            loc = error["type"].removeprefix("field:").split(".")
        field = ".".join([prefix, *loc] if prefix else loc) or "-"
        if error["type"] == "union_tag_invalid":
            expected = error.get("ctx", {}).get("expected_tags", "")
            tag = error.get("ctx", {}).get("tag")
            message = f"got {tag!r}; use one of {expected}"
        elif error["type"] == "extra_forbidden":
            message = _unknown_field_message(loc[-1], _fields_at(owner, within))
        elif error["type"] == "missing":
            message = "is required but missing"
        else:
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "literal_error":
                message = f"got {error.get('input')!r}; {message[0].lower()}{message[1:]}"
        out.append((table, field, message))
    return out


def _fields_at(model: type[BaseModel], path: list[str]) -> list[str]:
    current: Any = model
    for part in path:
        current = _model_in(current)
        if current is None:
            return []
        field = current.model_fields.get(part)
        if field is None:
            field = next((f for f in current.model_fields.values() if f.alias == part), None)
        if field is None:
            return []
        current = field.annotation
    current = _model_in(current)
    if current is None:
        return []
    return [f.alias or name for name, f in current.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation names, looking inside ``X | None`` and other unions."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for member in typing.get_args(annotation):
            found = _model_in(member)
            if found is not None:
                return found
    return None


def _unknown_field_message(name: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(name, allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    listed = f"; allowed: {', '.join(sorted(allowed))}" if allowed else ""
    return f"unknown field{hint}{listed}"
