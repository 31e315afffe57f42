"""Validated table specs: one model per source table, loaded from ``tables.yaml``.

Example:
    .. code-block:: yaml

        warehouse:
          root: ./data/warehouse
        tables:
          - name: orders
            source: {format: delta, path: ./data/source/orders}
            keys: [order_id]
            watermark: {column: updated_at, kind: timestamp, lookback: 2h}
            strategy: upsert
            partitioning: {granularity: daily, start: 2026-01-01}
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from incremental_assets.specs.durations import parse_duration
from incremental_assets.specs.strategies import StrategySpec

Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SourceSpec(_Spec):
    """Where a table's rows come from."""

    format: Literal["delta", "parquet", "csv", "json"] = Field(
        description="Reader: a Delta table, or a folder of Parquet, CSV or JSON-lines files."
    )
    path: str = Field(description="Local path (relative to the YAML file) or object-store URI.")
    options: dict[str, str] = Field(
        default_factory=dict, description="Spark reader options, e.g. {header: 'true'} for CSV."
    )
    schema_ddl: str | None = Field(
        default=None,
        alias="schema",
        description="Spark DDL schema for CSV/JSON sources, e.g. 'id BIGINT, ts TIMESTAMP'.",
    )
    timezone: str = Field(
        default="UTC",
        description="Zone in which the source's naive (zone-less) timestamps are written.",
    )

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r}; use an IANA name such as 'UTC' or 'Europe/Berlin'"
            ) from None
        return value


class WatermarkSpec(_Spec):
    """The column that orders changes, and how far back a run looks for late rows."""

    column: str
    kind: Literal["timestamp", "id", "sequence"] = Field(
        description="'timestamp' for a change time column, 'id' for a monotonic integer id, "
        "'sequence' for an insert-only log's integer id whose gaps are reported."
    )
    lookback: timedelta | int = Field(
        default=0,
        description="Re-read this much before the stored watermark on every run "
        "(a duration for timestamps, an integer for ids).",
    )
    settle_lag: Duration = Field(
        default=timedelta(0),
        description="Hold the window's upper bound this far behind the source clock, for "
        "sources whose transactions commit rows stamped in the past (timestamps only).",
    )

    @field_validator("lookback", mode="before")
    @classmethod
    def _lookback_matches_kind(cls, value: object, info: ValidationInfo) -> object:
        kind = info.data.get("kind")
        if kind in ("id", "sequence"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"{value!r}: an 'id' watermark looks back a whole number of ids "
                    "(e.g. lookback: 1000)"
                )
            return value
        return parse_duration(value)

    @field_validator("settle_lag")
    @classmethod
    def _settle_lag_only_for_timestamps(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        if info.data.get("kind") in ("id", "sequence") and value:
            raise ValueError("applies to 'timestamp' watermarks only; remove it")
        return value


class PartitioningSpec(_Spec):
    """Time partitions: each partition is a window of ``column``."""

    granularity: Literal["daily", "hourly"]
    start: datetime = Field(description="First partition start (UTC), e.g. 2026-01-01.")
    column: str | None = Field(
        default=None,
        description="Event-time column the partitions cut; defaults to the watermark column "
        "(required for 'id' watermarks).",
    )
    end_offset: int = Field(
        default=0,
        ge=0,
        description="Extra partitions past the last complete one (1 makes the open "
        "day/hour materializable).",
    )

    @field_validator("start", mode="before")
    @classmethod
    def _date_is_midnight(cls, value: object) -> object:
        if isinstance(value, date) and not isinstance(value, datetime):
            return datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
        return value

    @field_validator("start")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class TargetSpec(_Spec):
    """Where the Delta table lives."""

    path: str | None = Field(
        default=None, description="Delta table location; defaults to <warehouse.root>/<name>."
    )
    partition_by: list[str] = Field(default_factory=list, description="Delta partition columns.")


class TableSpec(_Spec):
    """One source table loaded incrementally into one Delta table (one Dagster asset)."""

    name: str
    description: str | None = None
    group: str = "incremental"
    source: SourceSpec
    keys: list[str] = Field(min_length=1, description="Columns that identify a row.")
    watermark: WatermarkSpec
    strategy: StrategySpec = Field(
        description="How increments land: append, upsert or cdc (a name, or a mapping "
        "with 'kind' and the strategy's options)."
    )
    partitioning: PartitioningSpec
    target: TargetSpec = Field(default_factory=TargetSpec)
    on_schema_change: Literal["fail", "append_new_columns"] = Field(
        default="fail",
        description="What a new source column does: fail the run, or add it to the target.",
    )

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"{value!r} is not a valid table name; use letters, digits and '_' "
                "and start with a letter"
            )
        return value

    @model_validator(mode="after")
    def _partition_column(self) -> TableSpec:
        if self.partitioning.column is None and self.watermark.kind != "timestamp":
            raise ValueError(
                "partitioning.column is required when watermark.kind is "
                f"'{self.watermark.kind}': name the event-time column whose days/hours the "
                "partitions cut"
            )
        return self

    @property
    def partition_column(self) -> str:
        return self.partitioning.column or self.watermark.column

    @property
    def partitions_cut_watermark(self) -> bool:
        """True when partitions are windows of the watermark column itself."""
        return self.partition_column == self.watermark.column


class WarehouseSpec(_Spec):
    root: str = Field(description="Folder or URI under which targets live by default.")


class SparkSpec(_Spec):
    """Spark settings for every run of the project."""

    master: str | None = Field(
        default=None,
        description="Spark master URL; default local[*] (or INCREMENTAL_ASSETS_SPARK_MASTER).",
    )
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Spark settings, e.g. spark.jars: /usr/share/java/postgresql.jar.",
    )


class ProjectSpec(_Spec):
    warehouse: WarehouseSpec
    tables: list[TableSpec]
    spark: SparkSpec = Field(default_factory=SparkSpec)

    def table(self, name: str) -> TableSpec:
        for spec in self.tables:
            if spec.name == name:
                return spec
        names = ", ".join(t.name for t in self.tables)
        raise KeyError(f"no table named {name!r}; tables are: {names}")

    def target_path(self, spec: TableSpec) -> str:
        if spec.target.path:
            return spec.target.path
        return f"{self.warehouse.root.rstrip('/')}/{spec.name}"
