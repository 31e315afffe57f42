"""Declared layers: silver and gold tables after any table of the tables file, each
refreshed from what changed upstream (engine/declared_layers/).

A layer follows one upstream, ``from``: a table or an earlier layer. Two kinds:

- ``row`` (silver, the default): a SQL SELECT over the upstream (by its name) that
  filters, casts, flattens and joins other tables or layers by name, with the layer's
  ``keys``; with ``newest``, the newest row of a key wins and the newest version of a
  group (a landing table's file) replaces all the layer's rows of it;
- ``aggregate`` (gold): ``group_by`` columns of the upstream, ``aggregates`` (sum, count,
  count_distinct, min, max) and an optional tumbling ``window`` of a time column.

A layer runs in batch (``run: batch``, the default: each run reads what the upstream's
Delta table changed) or as a Structured Streaming query (``run: streaming``): an aggregate
layer with a window reads a folder table's new files, or the upstream Delta table's new
commits, with the window's ``watermark`` as the lateness it accepts
(engine/declared_layers/streaming_layer.py); a row layer reads the upstream Delta table's
new commits (or, with ``reads: files``, a folder table's new files) and merges its select's
rows by key (engine/declared_layers/streaming_rows.py).

Example:
    .. code-block:: yaml

        layers:
          - name: orders_silver
            from: orders
            select: |
              SELECT o.order_id, CAST(o.amount AS DECIMAL(12, 2)) AS amount,
                     o.updated_at, c.country
              FROM orders o JOIN customers c ON c.customer_id = o.customer_id
              WHERE o.status <> 'test'
            keys: [order_id]
          - name: revenue_hourly
            kind: aggregate
            from: orders_silver
            group_by: [country]
            window: {column: updated_at, size: 1h}
            aggregates:
              - {name: revenue, function: sum, column: amount}
              - {name: orders, function: count}
          - name: invoice_totals_hourly
            kind: aggregate
            from: invoices_bronze          # a table whose source is a folder of files
            run: streaming
            group_by: [CustomerID]
            window: {column: InvoiceDate, size: 1h, watermark: 1h}
            aggregates:
              - {name: total_amount, function: sum, column: TotalAmount}
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from incremental_assets.specs.durations import format_duration, parse_duration
from incremental_assets.specs.expressions import (
    RuleExpressionError,
    Token,
    select_function_refusal,
    tokenize,
)
from incremental_assets.specs.names import ColumnList, ColumnName
from incremental_assets.specs.sql_text import SqlText

WINDOW_START = "window_start"
WINDOW_END = "window_end"
"""The columns an aggregate layer with a window adds: each group's window bounds (UTC)."""
LAYER_KINDS = ("row", "aggregate")
# Words that make a text something other than a query (Spark refuses them inside one too,
# but a declaration should fail when it loads, naming the layer).
_STATEMENTS = frozenset(
    {"insert", "update", "delete", "merge", "create", "drop", "alter", "truncate", "optimize"}
)


class _Layer(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True
    )

    name: str = Field(description="The layer's table and asset name (letters, digits, '_').")
    upstream: str = Field(
        alias="from",
        description="The table or earlier layer this layer follows: each run reads only "
        "what it changed since the version the layer last covered.",
    )
    description: str | None = None
    group: str | None = Field(
        default=None, description="The Dagster asset group; default the upstream's group."
    )
    run: Literal["batch", "streaming"] = Field(
        default="batch",
        description="'batch': each run reads what the upstream's Delta table changed; "
        "'streaming': each run is a Structured Streaming query, with its checkpoint beside "
        "the layer's table: an aggregate layer (with a window and its watermark) over the "
        "new files of the upstream table's folder (a table whose source is a folder of "
        "files) or the new commits of the upstream's Delta table (its change data feed "
        "where it records one); a row layer over the upstream's Delta table's new commits "
        "(its change data feed where it records one, else its appended rows), or with "
        "reads: files over the new files of the upstream table's folder.",
    )

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not value or not (value[0].isalpha() and value.replace("_", "a").isalnum()):
            raise ValueError(
                f"{value!r} is not a valid layer name; use ASCII letters, digits and '_' "
                "and start with a letter"
            )
        if not value.isascii() or len(value) > 200:
            raise ValueError(f"{value!r}: use at most 200 ASCII letters, digits and '_'")
        return value


class NewestSpec(BaseModel):
    """Which of several versions of a row a row layer keeps, for an upstream that keeps
    them all (an append-only bronze table: a landing table keeps every version of a file).

    ``by``: the select's columns that order versions, the greatest newest; among the
    select's rows of one key the newest wins, and it replaces the layer's row only when
    it is newer (so runs in any order converge).
    ``replaces``: the select's columns naming a group (e.g. ``_ia_source_file``, the file a
    landing row came from) whose newest version replaces all the layer's rows of that
    group: a run keeps of each group only the rows of its newest version (those sharing
    the group's greatest first ``by`` column: a landing table's ingestion time, one per
    load) and deletes the layer's older rows of the group that version no longer gives.

    Example (invoice lines after a landing table, tables.yaml's ``invoices_silver``):
        .. code-block:: yaml

            keys: [InvoiceNumber, ItemCode]
            newest:
              by: [_ia_ingested_at, _ia_file_version, _ia_file_row]
              replaces: [_ia_source_file]
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    by: ColumnList = Field(
        min_length=1,
        description="Columns of the select ordering a row's versions, greatest newest, e.g. "
        "[_ia_ingested_at, _ia_file_version, _ia_file_row] over a landing table.",
    )
    replaces: ColumnList = Field(
        default_factory=list,
        description="Columns of the select naming a group whose newest version replaces all "
        "the layer's rows of it, e.g. [_ia_source_file]: lines that vanish from a file "
        "rewritten in place leave the layer.",
    )


class RowLayerSpec(_Layer):
    """A silver layer: one SQL SELECT over the upstream, merged by ``keys`` (with
    ``newest``, the newest version of a row or group wins)."""

    kind: Literal["row"] = "row"
    select: SqlText = Field(
        description="One Spark SQL SELECT (or WITH ... SELECT) reading the upstream by its "
        "name; it may filter, cast, flatten (explode) and join other tables and layers "
        "of the project by name. Every run applies it to the upstream rows that changed."
    )
    keys: ColumnList = Field(min_length=1, description="Columns of the SELECT that identify a row.")
    newest: NewestSpec | None = Field(
        default=None,
        description="Over an upstream that keeps every version of a row: the columns "
        "ordering versions (by) and the group a newest version replaces whole (replaces).",
    )
    reads: Literal["table", "files"] = Field(
        default="table",
        description="run: streaming only. 'table': the query reads the upstream's Delta "
        "table's new commits (its change data feed where it records one); 'files': it "
        "reads the new files of the upstream table's folder (a table whose source is a "
        "folder of CSV, JSON or Parquet files; with its source.schema, or the schema the "
        "first run infers and keeps) straight into the layer, before (or instead of) any "
        "load of that table.",
    )

    @field_validator("select")
    @classmethod
    def _one_select(cls, value: str) -> str:
        problem = select_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _newest_apart_from_keys(self) -> RowLayerSpec:
        if self.newest is None:
            return self
        keys = {k.lower() for k in self.keys}
        clash = [c for c in self.newest.by if c.lower() in keys]
        if clash:
            # The rows of one key share its key columns: they cannot order its versions.
            raise PydanticCustomError(
                "field:newest.by",
                "{names}: a key column cannot order a key's versions; name columns of the "
                "select that change from one version to the next (a time, a version number)",
                {"names": ", ".join(clash)},
            )
        return self

    @model_validator(mode="after")
    def _newest_in_batch(self) -> RowLayerSpec:
        if self.run == "streaming" and self.newest is not None:
            # A stream hands each batch's changes once: the versions of a group that
            # arrived in earlier batches are no longer there to compare with.
            raise PydanticCustomError(
                "field:newest",
                "a streaming row layer keeps the newest change of each key in the order the "
                "upstream committed them; newest (ordering versions by columns) runs in "
                "batch only: remove newest, or set run: batch",
            )
        return self

    @model_validator(mode="after")
    def _files_streamed(self) -> RowLayerSpec:
        if self.reads == "files" and self.run != "streaming":
            raise PydanticCustomError(
                "field:reads",
                "only a streaming query reads the upstream's files as they arrive; a batch "
                "layer reads the upstream's Delta table: set run: streaming, or remove reads",
            )
        return self

    @property
    def keys_of_layer(self) -> tuple[str, ...]:
        return tuple(self.keys)

    @property
    def streaming(self) -> bool:
        return self.run == "streaming"


class AggregateSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    name: ColumnName = Field(description="The output column.")
    function: Literal["sum", "count", "count_distinct", "min", "max"]
    column: ColumnName | None = Field(
        default=None,
        description="The upstream column aggregated; count without one counts rows; "
        "count_distinct counts the distinct values of one.",
    )


def _positive(value: object) -> timedelta:
    size = parse_duration(value)
    if size < timedelta(seconds=1):
        raise ValueError(f"{value!r}: a window is at least 1s long; write e.g. '1h'")
    return size


def _lateness(value: object) -> timedelta:
    delay = parse_duration(value)
    if delay < timedelta(0):
        raise ValueError(f"{value!r}: a watermark is a delay, 0s or more; write e.g. '1h'")
    return delay


class WindowSpec(BaseModel):
    """A tumbling window of a time column: each row counts in the window holding it."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    column: ColumnName = Field(description="The upstream timestamp column, e.g. InvoiceDate.")
    size: Annotated[timedelta, BeforeValidator(_positive)] = Field(
        description="The window's length, e.g. 1h or 1d (windows start at UTC midnight "
        "multiples of it)."
    )
    watermark: Annotated[timedelta, BeforeValidator(_lateness)] | None = Field(
        default=None,
        description="run: streaming only: how late a row may arrive, behind the latest "
        "time the query has seen in the column (e.g. 1h). A row later than that is dropped "
        "and counted (its window is final); earlier late rows update their window.",
    )

    @property
    def spark_duration(self) -> str:
        return f"{int(self.size.total_seconds())} seconds"

    @property
    def spark_delay(self) -> str:
        """The watermark's delay as Spark's ``withWatermark`` takes it."""
        assert self.watermark is not None
        return f"{int(self.watermark.total_seconds())} seconds"

    def __str__(self) -> str:
        return f"{format_duration(self.size)} of {self.column}"


class AggregateLayerSpec(_Layer):
    """A gold layer: ``aggregates`` per ``group_by`` (and window); a run recomputes only
    the groups the upstream's changes touched."""

    kind: Literal["aggregate"]
    group_by: ColumnList = Field(default_factory=list, description="Upstream columns grouped by.")
    window: WindowSpec | None = Field(default=None, description="An optional tumbling window.")
    aggregates: list[AggregateSpec] = Field(min_length=1)

    @field_validator("aggregates")
    @classmethod
    def _unique_outputs(cls, value: list[AggregateSpec]) -> list[AggregateSpec]:
        names = [a.name.lower() for a in value]
        twice = sorted({a.name for a in value if names.count(a.name.lower()) > 1})
        if twice:
            raise ValueError(f"output names must be unique; repeated: {', '.join(twice)}")
        return value

    @model_validator(mode="after")
    def _grouped(self) -> AggregateLayerSpec:
        columnless = [a.name for a in self.aggregates if a.column is None and a.function != "count"]
        if columnless:
            raise PydanticCustomError(
                "field:aggregates.column",
                "{names}: only count works without a column; name the upstream column to aggregate",
                {"names": ", ".join(columnless)},
            )
        if not self.group_by and self.window is None:
            raise PydanticCustomError(
                "field:group_by",
                "is empty and there is no window: give the columns to group by, a window, or both",
            )
        keys = {k.lower() for k in self.keys_of_layer}
        clash = [a.name for a in self.aggregates if a.name.lower() in keys]
        if clash:
            raise PydanticCustomError(
                "field:aggregates",
                "{names}: an output has the name of a group column; rename it",
                {"names": ", ".join(clash)},
            )
        self._check_run()
        return self

    def _check_run(self) -> None:
        """A streaming aggregate keeps each open window in the query's state until the
        watermark passes it, so it needs both; a batch one recomputes from the upstream
        and has no use for a watermark."""
        if self.run == "batch":
            if self.window is not None and self.window.watermark is not None:
                raise PydanticCustomError(
                    "field:window.watermark",
                    "only a streaming layer drops late rows: remove watermark, or set "
                    "run: streaming",
                )
            return
        if self.window is None:
            raise PydanticCustomError(
                "field:window",
                "a streaming layer needs a window with a watermark (e.g. {column: "
                "InvoiceDate, size: 1h, watermark: 1h}): without one its state would keep "
                "every group forever",
            )
        if self.window.watermark is None:
            raise PydanticCustomError(
                "field:window.watermark",
                "a streaming layer needs the window's watermark: how late a row may arrive "
                "and still update its window (e.g. watermark: 1h)",
            )

    @property
    def keys_of_layer(self) -> tuple[str, ...]:
        bounds = (WINDOW_START, WINDOW_END) if self.window else ()
        return (*self.group_by, *bounds)

    @property
    def streaming(self) -> bool:
        """Whether the layer runs as a Structured Streaming query."""
        return self.run == "streaming"


LayerSpec = RowLayerSpec | AggregateLayerSpec
# Aggregates a streaming layer can keep over a Delta change data feed: a replaced or
# deleted row is subtracted from its group (min, max and count_distinct cannot be).
RETRACTABLE = frozenset({"sum", "count"})
LAYER_MODELS: dict[str, type[_Layer]] = {"row": RowLayerSpec, "aggregate": AggregateLayerSpec}


def select_problem(text: str) -> str | None:
    """Why ``text`` is not one SELECT a layer may run; None when it is (Spark may still
    find it invalid for the upstream's columns, which the layer's run reports)."""
    try:
        tokens = tokenize(text, what="a layer's select")
    except RuleExpressionError as exc:
        return exc.reason
    words = [t for t in tokens if t.kind == "word"]
    if not words or words[0].key not in ("select", "with"):
        first = words[0].text if words else "nothing"
        return (
            f"starts with {first!r}: a layer's select is one query, SELECT ... or WITH ... SELECT"
        )
    for index, token in enumerate(tokens):
        if token.kind != "word":
            continue
        if token.key in _STATEMENTS and _statement_word(tokens, index):
            return (
                f"{token.text.upper()} at position {token.pos + 1} is a statement: a layer's "
                "select only reads (the layer's run writes its rows)"
            )
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        if after is not None and after.kind == "op" and after.text == "(":
            reason = select_function_refusal(token.text)
            if reason:
                return reason
    return None


def _statement_word(tokens: list[Token], index: int) -> bool:
    """Whether the word at ``index`` can start a statement: it follows nothing, a ')' (the
    end of a WITH's query) or another statement word, and is not a column (``t.update``),
    a function call or an alias."""
    before = tokens[index - 1] if index else None
    after = tokens[index + 1] if index + 1 < len(tokens) else None
    if before is not None and before.kind == "op" and before.text == ".":
        return False
    if after is not None and after.kind == "op" and after.text in ("(", ".", ","):
        return False
    if before is None:
        return True
    return (before.kind == "op" and before.text == ")") or (
        before.kind == "word" and before.key in ("into", "table")
    )


def names_read(text: str) -> set[str]:
    """The words of a SELECT (lower case): the tables and layers it may name among them."""
    return {t.key for t in tokenize(text) if t.kind in ("word", "quoted")}
