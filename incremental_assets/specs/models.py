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

import posixpath
import re
from datetime import date, datetime, timedelta, timezone
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from incremental_assets.specs.durations import format_duration, parse_duration
from incremental_assets.specs.expressions import validate_check
from incremental_assets.specs.identifiers import CatalogTableName, TableName, catalog_table_name
from incremental_assets.specs.landing import (
    FILE_KEYS,
    INGESTED_AT,
    OBJECT_STORE_SCHEMES,
    LandingSpec,
)
from incremental_assets.specs.layers import LayerSpec
from incremental_assets.specs.locations import (
    readable_by_spark,
    reserved_name,
    reserved_suffix,
    same_location,
)
from incremental_assets.specs.names import (
    ColumnList,
    ColumnName,
    short_table_name,
    short_target_folder,
)
from incremental_assets.specs.options import (
    DATABASE_SECRET,
    OBJECT_STORE_SECRET,
    SPARK_SECRET,
    database_options,
    jdbc_url_secret,
    refuse_class_loading,
    refuse_jdbc_options,
    refuse_secret_values,
    refuse_secrets,
    refuse_substitution_setting,
    url_parameters,
)
from incremental_assets.specs.sql_text import SqlText
from incremental_assets.specs.strategies import (
    CdcStrategy,
    Scd2Strategy,
    SnapshotStrategy,
    StrategySpec,
)

Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


_SETTING_KINDS = {type(None): "no value", list: "a list", dict: "a mapping"}


def _settings_as_text(value: object) -> object:
    # YAML reads `200` and `true` as numbers and booleans; Spark settings are text. A list,
    # mapping or empty value is refused, not turned into its Python text ("['a', 'b']"):
    # that is never what the option means, and the text of an aliased list can be huge.
    if not isinstance(value, dict):
        return value
    for key, setting in value.items():
        if not isinstance(setting, (str, int, float)):  # bool is an int
            what = _SETTING_KINDS.get(type(setting), f"a {type(setting).__name__}")
            raise ValueError(
                f"{str(key)!r} has {what}; a setting is one text, number or true/false: write "
                "it as the text the option expects (e.g. 'a,b' for a list), or remove it"
            )
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


Settings = Annotated[dict[str, str], BeforeValidator(_settings_as_text)]
ID_LOOKBACK_MAX = 2**63 - 1
"""The largest id lookback: ids, and the bounds a lookback gives, are Spark longs."""
SNAPSHOT_AT = "_ia_snapshot_at"
"""The time a snapshot was taken: the order column of snapshot tables, added by the loader."""
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_FOR = {
    "_staging": "where earlier releases staged the runs of the tables beside it",
    "_delta_log": "a Delta table's transaction log",
}


class _Spec(BaseModel):
    # Inputs stay out of a ValidationError's text: an option's value may be a secret.
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True
    )


_LONGEST_RETRY_WAIT = timedelta(days=1)


class ConnectionSpec(_Spec):
    """A database reached over JDBC: declared once under ``connections``, named by tables.

    The password never appears in the YAML: ``password_env`` names the environment
    variable that holds it (read through Dagster's ``EnvVar`` in the Dagster layer).
    """

    url: str = Field(description="JDBC URL, e.g. jdbc:postgresql://db.internal:5432/shop.")
    driver: str | None = Field(
        default=None, description="JDBC driver class, e.g. org.postgresql.Driver."
    )
    user: str | None = Field(default=None, description="Database user.")
    password_env: str | None = Field(
        default=None, description="Environment variable that holds the user's password."
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="Extra JDBC connection properties, e.g. {sslmode: require}. No "
        "secrets, and none of the options the loader sets (url, user, dbtable, ...).",
    )
    max_retries: int = Field(
        default=3,
        ge=0,
        le=20,
        description="Dagster retries of a load whose connection failed (exponential backoff; "
        "the last retry waits retry_delay * (2**max_retries - 1), at most a day).",
    )
    retry_delay: Duration = Field(
        default=timedelta(seconds=10), description="Wait before the first retry; doubles after."
    )
    name: str = Field(default="", description="Set from the key under 'connections'.")
    password: SecretStr | None = Field(
        default=None,
        exclude=True,
        description="Filled in at run time from password_env; never written in YAML.",
    )

    @field_validator("url")
    @classmethod
    def _jdbc_url_without_secret(cls, value: str) -> str:
        if not value.startswith("jdbc:"):
            raise ValueError(
                f"{value!r} is not a JDBC URL; write it like jdbc:postgresql://host:5432/db"
            )
        secret = jdbc_url_secret(value)
        if secret:
            # The URL is shown in descriptions and errors: no user-info, no secret parameter.
            raise ValueError(
                f"the URL holds {secret} (the URL is not shown); remove it: name the user in "
                "user, and the environment variable that holds the password in password_env"
            )
        refuse_class_loading(url_parameters(value))
        return value

    @field_validator("properties")
    @classmethod
    def _no_secret_or_sql(cls, value: dict[str, str]) -> dict[str, str]:
        database_options(value)
        return value

    @field_validator("password_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
            raise ValueError(
                f"{value!r} is not an environment variable name (e.g. SHOP_DB_PASSWORD)"
            )
        return value

    @model_validator(mode="after")
    def _retries_within_a_day(self) -> ConnectionSpec:
        # Dagster waits retry_delay * (2**n - 1) before retry n: a run that keeps its pool
        # slot for days is a run that looks hung.
        last_wait = self.retry_delay.total_seconds() * (2**self.max_retries - 1)
        if last_wait > _LONGEST_RETRY_WAIT.total_seconds():
            raise PydanticCustomError(
                "field:max_retries",
                "the last of {retries} retries would wait about {hours} hours (retry_delay, "
                "doubling each time); keep it within a day: lower max_retries or retry_delay",
                {"retries": self.max_retries, "hours": f"{last_wait / 3600:,.0f}"},
            )
        return self


class SliceSpec(_Spec):
    """Parallel reads of a JDBC window: ``count`` range slices of an integer, date or
    timestamp column, bounded by the column's MIN/MAX inside the window."""

    column: ColumnName
    count: int = Field(ge=1, le=256, description="Number of slices (parallel connections).")


_JDBC_ONLY = ("connection", "table", "slices", "fetch_size")


class SourceSpec(_Spec):
    """Where a table's rows come from."""

    format: Literal["delta", "parquet", "csv", "json", "jdbc"] = Field(
        description="Reader: a Delta table, a folder of Parquet, CSV or JSON-lines files, "
        "or a database table over JDBC."
    )
    path: str | None = Field(
        default=None,
        validate_default=True,
        description="Local path (relative to the YAML file) or object-store URI (not for jdbc).",
    )
    connection: str | ConnectionSpec | None = Field(
        default=None,
        validate_default=True,
        description="jdbc: name of a connection under the top-level 'connections'.",
    )
    table: TableName | None = Field(
        default=None,
        validate_default=True,
        description="jdbc: the table as the database names it, e.g. public.orders or "
        'sales."Order Lines" (1 to 3 plain or double-quoted names; see specs/identifiers.py). '
        "delta: the table's name in Spark's catalog (e.g. sales.orders), instead of path.",
    )
    slices: SliceSpec | None = Field(
        default=None, description="jdbc: read the window in parallel range slices."
    )
    fetch_size: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="jdbc: rows per round trip (default 10000); the driver holds that many "
        "rows in memory.",
    )
    options: Settings = Field(
        default_factory=dict,
        description="Spark reader options, e.g. {header: 'true'} for CSV. No secrets; for "
        "jdbc, none of the options the loader sets (dbtable, query, url, ...).",
    )
    schema_ddl: SqlText | None = Field(
        default=None,
        alias="schema",
        description="Spark DDL schema for CSV/JSON sources, e.g. 'id BIGINT, ts TIMESTAMP' "
        "(no '${': Spark would substitute environment variables into it).",
    )
    timezone: str = Field(
        default="UTC",
        description="Zone in which the source's naive (zone-less) timestamps are written.",
    )
    landing: LandingSpec | None = Field(
        default=None,
        description="A landing folder: each new or changed file is loaded once into an "
        "append-only bronze table (json, csv, parquet; see specs/landing.py).",
    )

    @field_validator("path")
    @classmethod
    def _path_for_files_only(cls, value: str | None, info: ValidationInfo) -> str | None:
        fmt = info.data.get("format")
        if fmt == "jdbc" and value is not None:
            raise ValueError(
                "a jdbc source reads a table, not a path: name it in source.table and the "
                "database in source.connection"
            )
        # A Delta source may be named in the catalog instead (checked with source.table).
        if fmt not in (None, "jdbc", "delta") and value is None:
            raise PydanticCustomError("missing", "Field required")
        return value

    @field_validator("options")
    @classmethod
    def _no_secret_or_sql(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if info.data.get("format") == "jdbc":
            refuse_jdbc_options(refuse_secrets(value, DATABASE_SECRET))
        else:
            refuse_secrets(value, OBJECT_STORE_SECRET)
        return value

    @field_validator("connection", "table")
    @classmethod
    def _required_for_jdbc(cls, value: object, info: ValidationInfo) -> object:
        fmt = info.data.get("format")
        if fmt == "jdbc" and value is None:
            raise PydanticCustomError("missing", "Field required")
        return value

    @model_validator(mode="after")
    def _jdbc_settings_only_for_jdbc(self) -> SourceSpec:
        if self.format == "delta":
            self._path_or_catalog_table()
        if self.format != "jdbc":
            given = [name for name in _JDBC_ONLY if getattr(self, name) is not None]
            if self.format == "delta":
                given = [name for name in given if name != "table"]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: only for format: jdbc; remove for format: {self.format}"
                )
        elif self.schema_ddl is not None:
            raise ValueError("a jdbc source takes its schema from the database; remove schema")
        if self.landing is None:  # a landing folder: see ProjectSpec
            try:
                readable_by_spark(self.path)
            except ValueError as error:
                raise ValueError(f"source.path: {error}") from None
        else:
            if self.format not in ("json", "csv", "parquet"):
                raise ValueError(
                    f"landing: a landing folder holds json, csv or parquet files, not "
                    f"{self.format}; remove landing or change format"
                )
            if self.format != "parquet" and not self.schema_ddl:
                raise ValueError(
                    f"landing: {self.format} files need source.schema (Spark DDL), so a "
                    "malformed row is detected instead of inferred"
                )
            quarantine = self.landing.quarantine or "_quarantine"
            inside = posixpath.normpath(quarantine)
            outside = quarantine.startswith(("/", *OBJECT_STORE_SCHEMES))
            if str(self.path).startswith(OBJECT_STORE_SCHEMES) and (
                outside or inside == "." or inside.startswith("..")
            ):
                raise ValueError(
                    f"landing.quarantine: {quarantine!r}: for a landing folder on an object "
                    "store the quarantine is a folder inside it, e.g. '_quarantine'"
                )
            if "://" in quarantine:
                raise PydanticCustomError(
                    "field:source.landing.quarantine",
                    "{value}: a local landing folder's files are moved to a local folder; "
                    "use a folder inside it, e.g. '_quarantine'",
                    {"value": repr(quarantine)},
                )
            if inside == ".":
                raise PydanticCustomError(
                    "field:source.landing.quarantine",
                    "{value} is the landing folder itself, where a quarantined file would be "
                    "read again; use a folder inside it, e.g. '_quarantine'",
                    {"value": repr(quarantine)},
                )
        return self

    def _path_or_catalog_table(self) -> None:
        """A Delta source is a path or a catalog table, one of the two."""
        if self.path is None and self.table is None:
            raise ValueError(
                "a delta source needs source.path (its location) or source.table (its "
                "name in Spark's catalog, e.g. sales.orders)"
            )
        if self.path is not None and self.table is not None:
            raise ValueError(
                "a delta source is read by source.path or by source.table, not both: remove one"
            )
        if self.table is not None:
            catalog_table_name(self.table)

    @property
    def streams_files(self) -> bool:
        """Whether a streaming layer reads this source's folder of files (csv, json or
        parquet) rather than its table's Delta commits."""
        return self.format in ("csv", "json", "parquet") and self.path is not None

    @property
    def location(self) -> str:
        """Where the rows are, for descriptions: a path, a catalog table, or connection
        and table."""
        if self.format == "delta" and self.table is not None:
            return self.table
        if self.format == "jdbc":
            conn = self.connection
            name = conn if isinstance(conn, str) else (conn.name or conn.url) if conn else "?"
            return f"{name}:{self.table}"
        return str(self.path)

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

    column: ColumnName
    kind: Literal["timestamp", "id", "sequence", "hybrid"] = Field(
        description="'timestamp' for a change time column, 'id' for a monotonic integer id, "
        "'sequence' for an insert-only log's integer id whose gaps are reported, 'hybrid' "
        "for a timestamp with a tie-breaking integer id (many rows sharing one time)."
    )
    tiebreak: ColumnName | None = Field(
        default=None,
        description="hybrid: the integer column that orders rows sharing one timestamp.",
    )
    max_rows: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,  # Spark's LIMIT takes a 32-bit int
        description="hybrid: stop a run after this many new rows; the next run continues "
        "from the exact (timestamp, id) it stopped at.",
    )
    lookback: timedelta | int = Field(
        default=0,
        validate_default=True,
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
            if value > ID_LOOKBACK_MAX:
                raise ValueError(
                    f"{value}: an id lookback is at most {ID_LOOKBACK_MAX} (ids are 64-bit "
                    "integers in Spark and Delta); set a smaller one"
                )
            return value
        return parse_duration(value)

    @field_validator("settle_lag")
    @classmethod
    def _settle_lag_only_for_timestamps(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        if info.data.get("kind") in ("id", "sequence") and value:
            raise ValueError("applies to 'timestamp' watermarks only; remove it")
        return value

    @model_validator(mode="after")
    def _hybrid_settings(self) -> WatermarkSpec:
        if self.kind == "hybrid" and not self.tiebreak:
            raise ValueError(
                "watermark.tiebreak is required when kind is 'hybrid': name the integer "
                "column that orders rows sharing one timestamp"
            )
        if self.kind != "hybrid" and (self.tiebreak or self.max_rows):
            raise ValueError(
                "watermark.tiebreak and watermark.max_rows apply to kind 'hybrid' only"
            )
        return self

    @property
    def is_time(self) -> bool:
        """Whether the watermark's (leading) column is a timestamp."""
        return self.kind in ("timestamp", "hybrid")


_RELATIVE_DAY = re.compile(r"today(?:\s*-\s*(\d+)\s*d)?", re.IGNORECASE)
EARLIEST_START = datetime(1900, 1, 1, tzinfo=timezone.utc)
"""The earliest ``partitioning.start``: Dagster's partition keys are written with a
four-digit year (the year 1 is written '1-01-01' and cannot be read back, which broke the
whole code location), and each day since is a partition every listing of the asset's
partitions walks."""


def relative_day(text: str, now: datetime | None = None) -> datetime:
    """``today`` or ``today-Nd``: midnight UTC of today, or of N days before."""
    match = _RELATIVE_DAY.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"{text!r} is not a date: write a date (2026-01-01), 'today' or 'today-Nd' "
            "(e.g. today-4d)"
        )
    now = now or datetime.now(timezone.utc)
    midnight = now.astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    days = int(match.group(1) or 0)
    if days > (midnight - EARLIEST_START).days:
        raise ValueError(
            f"{text!r} is before {EARLIEST_START.date().isoformat()}, the earliest start; "
            "write a later date or a smaller N"
        )
    return midnight - timedelta(days=days)


class PartitioningSpec(_Spec):
    """Time partitions: each partition is a window of ``column``."""

    granularity: Literal["daily", "hourly"]
    start: datetime = Field(
        description="First partition start (UTC), e.g. 2026-01-01; or 'today-Nd', midnight "
        "UTC N days before the definitions load (for a demo or a sandbox: the partitions "
        "then move with the calendar)."
    )
    column: ColumnName | None = Field(
        default=None,
        description="Event-time column the partitions cut; defaults to the watermark column "
        "(required for 'id' watermarks).",
    )
    end_offset: int = Field(
        default=0,
        ge=0,
        le=366,
        description="Extra partitions past the last complete one (1 makes the open "
        "day/hour materializable).",
    )

    @field_validator("start", mode="before")
    @classmethod
    def _date_is_midnight(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip()[:1].isdigit():
            return relative_day(value)  # today, today-Nd, or a message saying so
        if isinstance(value, date) and not isinstance(value, datetime):
            return datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
        return value

    @field_validator("start")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        too_early = ValueError(
            f"{value.date().isoformat()} is before {EARLIEST_START.date().isoformat()}, the "
            "earliest start (Dagster writes partition keys with four-digit years, and lists "
            "every partition since the start): set it to the first day of the source's data"
        )
        try:
            value = (
                value.replace(tzinfo=timezone.utc)
                if value.tzinfo is None
                else value.astimezone(timezone.utc)
            )
        except OverflowError:  # an offset that moves the year 1 out of range
            raise too_early from None
        if value < EARLIEST_START:
            raise too_early
        if value > datetime.now(timezone.utc):
            raise ValueError(
                f"{value:%Y-%m-%d %H:%M} UTC is in the future: no partition exists before "
                "then, so every materialization would fail with 'Could not find a partition'. "
                "Set it to the first day of the source's data (today at the latest)"
            )
        return value


_SIZE = TypeAdapter(ByteSize)
# A size as bytes or a number and its unit, nothing after it (pydantic's ByteSize reads
# "32MiB per file" as 32MiB).
_SIZE_TEXT = re.compile(r"\s*\d+(\.\d+)?\s*[A-Za-z]*\s*")


def _bytes(value: object) -> int:
    """``value`` (bytes, or text such as 16MiB) as bytes; -1 when it is not a size."""
    if isinstance(value, bool) or (isinstance(value, str) and not _SIZE_TEXT.fullmatch(value)):
        return -1
    try:
        return int(_SIZE.validate_python(value))
    except Exception:
        return -1


# What target.file_size may set (its default, None, is the engine's: 128 MiB,
# store.BYTES_PER_FILE).
MIN_FILE_SIZE, MAX_FILE_SIZE = 2**20, 2**30


class TargetSpec(_Spec):
    """Where the Delta table lives."""

    path: str | None = Field(
        default=None, description="Delta table location; defaults to <warehouse.root>/<name>."
    )
    table: CatalogTableName | None = Field(
        default=None,
        description="The table's name in Spark's catalog (Hive metastore, Unity Catalog), "
        "e.g. sales.orders or main.sales.orders: created there as an external Delta table "
        "at the location (target.path, else <warehouse.root>/<name>) and written by name.",
    )
    partition_by: ColumnList = Field(default_factory=list, description="Delta partition columns.")
    deletion_vectors: bool = Field(
        default=False,
        description="Create the table with Delta's deletion vectors: a merge then marks the "
        "rows it replaces or deletes instead of rewriting their files (it writes about the "
        "rows it changes, not whole files). Spark's Delta reads such tables; delta-rs 1.x "
        "(and tools built on it) cannot read their data. Applies when the table is created; "
        "turn it on for an existing table with ALTER TABLE ... SET TBLPROPERTIES "
        "('delta.enableDeletionVectors' = 'true') (docs/runs.md).",
    )
    file_size: ByteSize | None = Field(
        default=None,
        description="About the most bytes one of the table's Parquet files holds (128MiB "
        "unless set; e.g. 32MiB or 512MB, between 1MiB and 1GiB), besides at most 1M rows: "
        "where rows are wide, a file holds fewer of them. Without deletion vectors a merge "
        "rewrites every file its keys fall in, so smaller files make an increment cheaper "
        "and a full scan a little dearer. Followed by a merge's rewrite in key order and "
        "the maintenance's compaction (at the table's own bytes per row), and by the first "
        "write where it knows its rows' size (a Delta source's log, a Parquet folder's "
        "footers, a staged increment's files, a sample of a CSV or JSON folder's rows where "
        "its increment is written once). "
        "Changed later, it applies to the files written from "
        "then on; raised, compaction also packs the smaller files written before (docs/"
        "runs.md).",
    )
    compact_after: int | None = Field(
        default=None,
        description="Compact the table's small files (under half the size compaction aims "
        "for, in partitions holding two or more) after a load that leaves at least this many "
        "(e.g. 8): the run runs the maintenance job's compaction (Delta's OPTIMIZE) right "
        "after its commit, in a commit of its own that changes no row; a compaction that "
        "fails fails the run, the load staying committed. Keeps full scans fast between "
        "maintenance runs, at the price of an occasional slower load. Unset (the default): "
        "only the maintenance job compacts (docs/operations.md).",
    )
    purge_after: float | None = Field(
        default=None,
        description="Purge the table's deletion vectors (Delta's REORG ... APPLY (PURGE)) "
        "after a load that leaves at least this share of the table's rows marked deleted by "
        "them (e.g. 0.02: 2%): the run rewrites the files that carry vectors without their "
        "deleted rows, right after its commit, in a commit of its own that changes no row; "
        "a purge that fails fails the run, the load staying committed. Keeps full scans "
        "fast on tables with deletion vectors, which otherwise filter every row of those "
        "files, at the price of an occasional slower load. Unset (the default), and on "
        "tables without deletion vectors: only the maintenance job purges (docs/"
        "operations.md).",
    )
    one_pass_below: ByteSize = Field(
        default=ByteSize(16 * 2**20),
        description="A merge whose increment's keys fall in files of the table totalling "
        "at most this size (e.g. 16MiB, the default; 0 turns it off) reads the increment in "
        "one pass, even when it re-reads rows that change nothing (a lookback): Delta then "
        "rewrites those files whole, which on a small table costs less than finding the rows "
        "that act first, a pass of its own. Larger tables keep that pass, so no file is "
        "rewritten only for rows that change nothing (docs/runs.md).",
    )

    @field_validator("one_pass_below", mode="before")
    @classmethod
    def _a_size(cls, value: object) -> object:
        size = _bytes(value)
        if size < 0:
            raise ValueError(
                f"{value!r} is not a size: write bytes or a size with its unit, e.g. "
                "16MiB, 64MB or 0 (off)"
            )
        return size

    @field_validator("file_size", mode="before")
    @classmethod
    def _a_file_size(cls, value: object) -> object:
        if value is None:
            return None
        size = _bytes(value)
        if not MIN_FILE_SIZE <= size <= MAX_FILE_SIZE:
            raise ValueError(
                f"{value!r} is not a file size between 1MiB and 1GiB: write bytes or a size "
                "with its unit, e.g. 128MiB (the default), 32MiB or 512MB"
            )
        return size

    @field_validator("compact_after", mode="before")
    @classmethod
    def _a_file_count(cls, value: object) -> object:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= 10_000:
            raise ValueError(
                f"{value!r} is not a count of small files between 2 and 10000: e.g. 8 (a load "
                "leaving 8 or more compacts them); leave it out to compact only in the "
                "maintenance job"
            )
        return value

    @field_validator("purge_after", mode="before")
    @classmethod
    def _a_share(cls, value: object) -> object:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
            raise ValueError(
                f"{value!r} is not a share of the table's rows between 0 and 1: e.g. 0.02 "
                "(a load after which deletion vectors mark 2% or more of the rows deleted "
                "purges them); leave it out to purge only in the maintenance job"
            )
        return float(value)

    @field_validator("path")
    @classmethod
    def _leaves_room_for_side_tables(cls, value: str | None) -> str | None:
        return short_target_folder(readable_by_spark(value))


class RuleSpec(_Spec):
    """A data-quality rule: a Spark SQL boolean expression every row should satisfy."""

    name: str = Field(description="Reported in metadata and in the quarantine.")
    check: str = Field(description="Spark SQL, true for a good row, e.g. 'amount >= 0'.")
    action: Literal["warn", "quarantine", "fail"] = Field(
        default="warn",
        description="warn: keep the row, count it; quarantine: divert it to the table's "
        "quarantine; fail: fail the run, commit nothing. A check that is null counts as "
        "failed.",
    )

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r}: use letters, digits and '_' (e.g. amount_positive)")
        return value

    @field_validator("check")
    @classmethod
    def _row_expression(cls, value: str, info: ValidationInfo) -> str:
        # An expression over the row only: no statements, subqueries, tables, Java calls or
        # functions outside the allowlist (specs/expressions.py).
        return validate_check(info.data.get("name"), value)


# A rule time limit longer than this is no limit (and past what a timer can wait for).
_MAX_RULE_TIMEOUT = timedelta(days=1)


class QualitySpec(_Spec):
    rules: list[RuleSpec] = Field(default_factory=list)
    min_score: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="The quality_score asset check fails below this share of rows passing "
        "every rule.",
    )
    rule_timeout: Duration = Field(
        default=timedelta(minutes=30),
        description="Time limit of the Spark job that evaluates the rules (with the reading "
        "and staging of the window it does): past it the job is cancelled and the run fails "
        "naming the rules, with nothing committed, e.g. 10m.",
    )

    @field_validator("rule_timeout")
    @classmethod
    def _timeout_in_range(cls, value: timedelta) -> timedelta:
        if not timedelta(seconds=1) <= value <= _MAX_RULE_TIMEOUT:
            raise ValueError(
                f"{format_duration(value)}: a rule time limit is between 1s and "
                f"{format_duration(_MAX_RULE_TIMEOUT)}; write e.g. '30m'"
            )
        return value

    @field_validator("rules")
    @classmethod
    def _unique_names(cls, rules: list[RuleSpec]) -> list[RuleSpec]:
        names = [r.name for r in rules]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"rule names must be unique; repeated: {', '.join(twice)}")
        return rules


class TableSpec(_Spec):
    """One source table loaded incrementally into one Delta table (one Dagster asset)."""

    name: str
    description: str | None = None
    group: str = "incremental"
    source: SourceSpec
    keys: ColumnList = Field(min_length=1, description="Columns that identify a row.")
    watermark: WatermarkSpec = Field(
        description="The column that orders changes (not for snapshot tables, which are "
        "ordered by the time each snapshot was taken)."
    )
    strategy: StrategySpec = Field(
        description="How increments land: append, upsert, cdc, snapshot or scd2 (a name, "
        "or a mapping with 'kind' and the strategy's options)."
    )
    partitioning: PartitioningSpec
    target: TargetSpec = Field(default_factory=TargetSpec)
    quality: QualitySpec = Field(
        default_factory=QualitySpec, description="Data-quality rules and the minimum score."
    )
    max_lag: Duration | None = Field(
        default=None,
        description="Freshness: the watermark_fresh check fails when the watermark lags the "
        "source clock by more than this (time watermarks and snapshots), e.g. 26h.",
    )
    on_schema_change: Literal["fail", "append_new_columns"] = Field(
        default="fail",
        description="What a new source column does: fail the run, or add it to the target.",
    )

    @field_validator("name")
    @classmethod
    def _fits_file_names(cls, value: str) -> str:
        return short_table_name(value)

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"{value!r} is not a valid table name; use letters, digits and '_' "
                "and start with a letter"
            )
        reserved = reserved_name(value)
        if reserved:
            raise ValueError(
                f"{value!r} is the name of a folder the loader or Delta Lake keeps "
                f"({reserved}: {_RESERVED_FOR[reserved]}); a table of that name would write "
                f"into it: choose another name, e.g. {value.strip('_')}_table"
            )
        suffix = reserved_suffix(value)
        if suffix:
            stem = value[: -len(suffix) - 2]
            raise ValueError(
                f"{value!r} ends in '__{suffix}', which the loader reserves for the side "
                f"table, staging or checkpoint folder it keeps beside a target ({stem}'s "
                f"__{suffix}); "
                f"choose another name, e.g. {value.replace('__', '_')}"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _snapshot_time_is_the_watermark(cls, data: object) -> object:
        # A snapshot has no change column: runs are ordered by the time each was taken.
        if not isinstance(data, dict) or not _takes_snapshots(data.get("strategy")):
            return data
        if data.get("watermark") is not None:
            raise PydanticCustomError(
                "field:watermark",
                "a snapshot table has no watermark: each run reads the whole source and is "
                "ordered by the time it was taken; remove watermark",
            )
        return {**data, "watermark": {"column": SNAPSHOT_AT, "kind": "timestamp"}}

    @model_validator(mode="before")
    @classmethod
    def _landing_defaults(cls, data: object) -> object:
        # A landing table's rows are identified by where they came from, and cut by when
        # they were ingested: keys and watermark are the loader's, not the user's.
        source = data.get("source") if isinstance(data, dict) else None
        if not isinstance(source, dict) or source.get("landing") is None:
            return data
        given = [name for name in ("keys", "watermark") if data.get(name) is not None]
        if given:
            raise PydanticCustomError(
                "landing_keys",
                "a landing table is keyed by file, file version and row number and ordered "
                "by ingestion time; remove {given}",
                {"given": ", ".join(given)},
            )
        strategy = data.get("strategy", "append")
        kind = strategy.get("kind") if isinstance(strategy, dict) else strategy
        if kind != "append":
            raise PydanticCustomError(
                "landing_strategy",
                "a landing table is append-only bronze; use strategy: append (got {kind!r})",
                {"kind": kind},
            )
        partitioning = data.get("partitioning")
        if isinstance(partitioning, dict):
            # The open day is where today's files land.
            partitioning = {"end_offset": 1, **partitioning}
        return {
            **data,
            "strategy": strategy,
            "partitioning": partitioning,
            "keys": list(FILE_KEYS),
            "watermark": {"column": INGESTED_AT, "kind": "timestamp"},
        }

    @model_validator(mode="after")
    def _strategy_columns(self) -> TableSpec:
        strategy = self.strategy
        if isinstance(strategy, Scd2Strategy):
            reserved = {strategy.valid_from, strategy.valid_to, strategy.is_current}
            clash = reserved & {*self.keys, self.watermark.column}
            if clash:
                raise ValueError(
                    f"{sorted(clash)}: a key or the watermark cannot be a validity column; "
                    "rename strategy.valid_from / valid_to / is_current"
                )
            if strategy.tracked and set(strategy.tracked) & set(self.keys):
                raise ValueError("strategy.tracked lists key columns; keys never change")
        if self.max_lag is not None and not self.watermark.is_time:
            raise PydanticCustomError(
                "field:max_lag",
                "max_lag needs a time watermark; '{kind}' watermarks have no lag in time: "
                "remove max_lag",
                {"kind": self.watermark.kind},
            )
        diverting = [r.name for r in self.quality.rules if r.action == "quarantine"]
        if diverting and (self.takes_snapshots or self.history):
            raise PydanticCustomError(
                "field:quality.rules",
                "quality rules {rules}: 'quarantine' is not available for {kind} tables (a "
                "row held back would read as deleted or rewrite history); use action 'warn' "
                "or 'fail'",
                {"rules": diverting, "kind": self.strategy.kind},
            )
        return self

    @model_validator(mode="after")
    def _partition_column(self) -> TableSpec:
        if self.partitioning.column is None and not self.watermark.is_time:
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
    def row_identity(self) -> list[str]:
        """What identifies a target row: the keys, and for history tables the version's
        start."""
        history = self.history
        return [*self.keys, history.valid_from] if history else list(self.keys)

    @property
    def takes_snapshots(self) -> bool:
        """True when each run reads the source's whole current state (no watermark)."""
        return self.watermark.column == SNAPSHOT_AT

    @property
    def history(self) -> Scd2Strategy | None:
        """The SCD2 settings of a history table, else None."""
        return self.strategy if isinstance(self.strategy, Scd2Strategy) else None

    @property
    def change_strategy(self):
        """How the source delivers rows (for scd2: its ``changes``)."""
        history = self.history
        return history.changes if history else self.strategy

    @property
    def effective_column(self) -> str:
        """scd2: the timestamp column giving valid_from."""
        history = self.history
        if history and history.effective:
            return history.effective
        return self.watermark.column if self.watermark.is_time else self.partition_column

    @property
    def feed(self) -> CdcStrategy | None:
        """The CDC settings when the source is a change feed (directly or under scd2)."""
        strategy = self.change_strategy
        return strategy if isinstance(strategy, CdcStrategy) else None

    @property
    def landing(self) -> LandingSpec | None:
        """The landing settings when the source is a landing folder of files, else None."""
        return self.source.landing

    @property
    def partitions_cut_watermark(self) -> bool:
        """True when partitions are windows of the watermark column itself."""
        return self.partition_column == self.watermark.column


def _takes_snapshots(strategy: object) -> bool:
    if isinstance(strategy, str):
        return strategy == "snapshot"
    if isinstance(strategy, SnapshotStrategy):
        return True
    if isinstance(strategy, Scd2Strategy):
        return isinstance(strategy.changes, SnapshotStrategy)
    if isinstance(strategy, dict):
        changes = strategy.get("changes")
        return strategy.get("kind") == "snapshot" or (
            strategy.get("kind") == "scd2" and _takes_snapshots(changes)
        )
    return False


class WarehouseSpec(_Spec):
    root: str = Field(description="Folder or URI under which targets live by default.")
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="delta-rs storage options for targets, Delta sources and landing "
        "folders on object stores, e.g. {region: eu-west-1} or, for MinIO, {endpoint: "
        "'http://minio:9000', allow_http: 'true'}. No secrets: delta-rs reads those from "
        "the environment (AWS_SECRET_ACCESS_KEY, AZURE_STORAGE_ACCOUNT_KEY, ...).",
    )

    @field_validator("root")
    @classmethod
    def _root_readable_by_spark(cls, value: str) -> str:
        located = readable_by_spark(value)
        assert located is not None
        return located

    @field_validator("storage_options")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        refuse_secrets(
            value,
            "delta-rs reads credentials from the environment (e.g. AWS_SECRET_ACCESS_KEY, "
            "AZURE_STORAGE_ACCOUNT_KEY)",
        )
        return value


class SparkSpec(_Spec):
    """Spark settings for every run of the project."""

    master: str | None = Field(
        default=None,
        description="Spark master URL; default local[*] (or INCREMENTAL_ASSETS_SPARK_MASTER).",
    )
    remote: str | None = Field(
        default=None,
        description="A Spark Connect server, sc://HOST:PORT, instead of a JVM in each run "
        "(INCREMENTAL_ASSETS_SPARK_REMOTE wins). Jars and connectors are the server's. A "
        "URL with a token (Databricks) goes in the environment variable, not here.",
    )
    conf: Settings = Field(
        default_factory=dict,
        description="Extra Spark settings, e.g. spark.jars: /usr/share/java/postgresql.jar. "
        "No secrets, by key (fs.s3a.secret.key, fs.azure.account.key.*, "
        "spark.executorEnv.DB_PW, ...) or in a value (-Ddb.password=..., user:pw@ in a URL).",
    )

    @field_validator("conf")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        refuse_secret_values(refuse_secrets(value, SPARK_SECRET), SPARK_SECRET)
        refuse_substitution_setting(value)
        return value

    @field_validator("remote")
    @classmethod
    def _connect_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.startswith("sc://"):
            raise ValueError(f"{value!r} is not a Spark Connect URL; write it as sc://HOST:PORT")
        if "token=" in value.lower():
            raise ValueError(
                "the URL holds a token, a secret: set the whole URL in the environment "
                "variable INCREMENTAL_ASSETS_SPARK_REMOTE instead"
            )
        return value

    @model_validator(mode="after")
    def _master_or_remote(self) -> SparkSpec:
        if self.master and self.remote:
            raise ValueError(
                "set spark.master (a JVM in each run) or spark.remote (a Spark Connect "
                "server), not both; the server's own master decides where a Connect "
                "session's work runs"
            )
        return self


class ProjectSpec(_Spec):
    warehouse: WarehouseSpec
    tables: list[TableSpec]
    spark: SparkSpec = Field(default_factory=SparkSpec)
    connections: dict[str, ConnectionSpec] = Field(
        default_factory=dict, description="Databases that jdbc sources name, by name."
    )
    layers: list[LayerSpec] = Field(
        default_factory=list,
        description="Declared layers after the tables (specs/layers.py), in order: each "
        "follows a table or an earlier layer.",
    )

    def table(self, name: str) -> TableSpec:
        for spec in self.tables:
            if spec.name == name:
                return spec
        names = ", ".join(t.name for t in self.tables)
        raise KeyError(f"no table named {name!r}; tables are: {names}")

    def layer(self, name: str) -> LayerSpec:
        for layer in self.layers:
            if layer.name == name:
                return layer
        names = ", ".join(x.name for x in self.layers) or "none declared"
        raise KeyError(f"no layer named {name!r}; layers are: {names}")

    def layer_path(self, layer: LayerSpec) -> str:
        """Where a layer's Delta table lives: <warehouse.root>/<name>."""
        return f"{self.warehouse.root.rstrip('/')}/{layer.name}"

    def target_path(self, spec: TableSpec) -> str:
        if spec.target.path:
            return spec.target.path
        return f"{self.warehouse.root.rstrip('/')}/{spec.name}"

    def readers_of(self, spec: TableSpec) -> list[str]:
        """The tables that read ``spec``'s target as their Delta source (layers after it)."""
        target = self.target_path(spec)
        return [
            t.name
            for t in self.tables
            if t.name != spec.name
            and t.source.format == "delta"
            and t.source.path is not None
            and same_location(t.source.path, target)
        ]
