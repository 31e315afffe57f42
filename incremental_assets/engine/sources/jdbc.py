"""Database tables over JDBC: the window's rows read by Spark's JDBC source with the window
predicate executed by the database, and the probe queries (MAX, COUNT, MIN/MAX of a slice
column, the clock) executed by the database as well.

Spark's JDBC source (``format("jdbc")``) pushes simple filters and the selected columns
into the SQL it sends, but computes aggregates itself. So the probes are written here as
SQL and sent through the same JDBC source as a ``query``: the database answers with one
row. The table is sent as identifiers, never as the spec's text: ``source.table`` is parsed
into 1 to 3 names (specs/identifiers.py) and each quoted one is quoted again for the
dialect; the options that carry SQL or override the connection are never taken from the
spec (specs/options.py). The password comes from the connection spec (filled in by the
Dagster layer) or the environment variable it names, and is removed from every message
this module raises.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta, timezone

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ByteType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from incremental_assets.engine import predicates, transforms
from incremental_assets.engine.errors import (
    ConnectionSettingError,
    IncrementalLoadError,
    SchemaMismatchError,
    SourceAccessError,
    SourceNotFoundError,
    SourceUnavailableError,
)
from incremental_assets.engine.predicates import Part, Range
from incremental_assets.engine.sources.base import Source
from incremental_assets.engine.sources.identity import database_identity
from incremental_assets.engine.spark.failures import is_spark_failure
from incremental_assets.engine.watermarks import (
    WatermarkKind,
    WatermarkValue,
    from_transaction_version,
    to_utc,
)
from incremental_assets.specs import SourceSpec
from incremental_assets.specs.identifiers import parse_table, render_table
from incremental_assets.specs.models import ConnectionSpec
from incremental_assets.specs.options import loads_classes, url_parameters, without_reserved

DEFAULT_FETCH_SIZE = 10_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_SLICEABLE = (ByteType, ShortType, IntegerType, LongType, DateType, TimestampType)
# SQLSTATE classes of failures that a retry may cure: connection exceptions (08),
# the server shutting down or starting (57P01..57P03), too many connections (53300).
_TRANSIENT_STATES = ("08", "57P01", "57P02", "57P03", "53300")
_TRANSIENT_TEXT = re.compile(
    r"connection.*refused|connection attempt failed|i/o error|this connection has been closed"
    r"|terminating connection|an i/o error occurred|connection reset|broken pipe"
    r"|the database system is (starting up|shutting down)",
    re.IGNORECASE,
)
# Failures of the connection's SSL settings, not of the network: a retry meets the same.
_SSL_FAILURES = (
    ("no_ssl", re.compile(r"does not support SSL", re.IGNORECASE)),
    ("ssl_only", re.compile(r"no encryption|SSL (connection )?(is )?required", re.IGNORECASE)),
    ("mode", re.compile(r"invalid sslmode", re.IGNORECASE)),
    (
        "certificate",
        re.compile(
            r"root certificate|hostnameverifier|could not be verified|PKIX|certification path"
            r"|SSLHandshakeException",
            re.IGNORECASE,
        ),
    ),
)


class JdbcSource(Source):
    """One table of a database, opened once per run (its schema is read at open)."""

    remote = True
    identity_fields = "source.connection (its url) and source.table"

    @classmethod
    def open(cls, spark: SparkSession, table: str, spec: SourceSpec, storage: dict) -> Source:
        return cls(spark, table, spec)

    @classmethod
    def identity_of(cls, spec: SourceSpec) -> str:
        connection = spec.connection
        if not isinstance(connection, ConnectionSpec):
            return f"jdbc connection {connection!r} table {spec.table}"  # refused at open
        return database_identity(connection.url, spec.table or "", connection.properties)

    def __init__(self, spark: SparkSession, table: str, spec: SourceSpec):
        super().__init__(table, spec)
        self._spark = spark
        self.connection = _connection(table, spec)
        _refuse_class_loading(table, self.connection, spec)
        self._password = _password(table, self.connection)
        self._quote = _quoter(self.connection.url)
        self.relation = _relation(table, spec, self._quote)
        """The table as SQL: the validated names, quoted ones quoted for the dialect."""
        with self.failures("opening"):
            self._schema = self._reader().option("dbtable", self.relation).load().schema
        self._types = {f.name: f.dataType for f in self._schema.fields}
        self._check_slices()

    # -- Source -----------------------------------------------------------------------

    @property
    def schema(self) -> StructType:
        return self._schema

    def read(self, raw_parts: list[Part] | None = None) -> DataFrame:
        """The table, lazily: Spark sends the caller's filter to the database as WHERE.

        With ``slices``, the window's rows are read by that many parallel queries over
        even ranges of the slice column between its MIN and MAX inside ``raw_parts``
        (rows outside those bounds, inserted meanwhile, still land in the outer slices).
        """
        reader = self._reader().option("dbtable", self.relation)
        if self.spec.slices is not None and self.spec.slices.count > 1 and raw_parts != []:
            bounds = self._slice_bounds(raw_parts)
            if bounds is not None:
                reader = reader.options(
                    partitionColumn=self.spec.slices.column,
                    lowerBound=bounds[0],
                    upperBound=bounds[1],
                    numPartitions=str(self.spec.slices.count),
                )
        with self.failures("reading"):
            return reader.load()

    def count_nulls(self, column: str) -> int:
        """Rows whose ``column`` is null, counted by the database."""
        sql = f"SELECT COUNT(*) AS n FROM {self.relation} WHERE {self._quote(column)} IS NULL"
        return int(self._query_row(sql)["n"])

    def clock(self) -> datetime:
        """The database's ``CURRENT_TIMESTAMP``: settle lag is measured on the source's
        clock, not on the machine that runs Spark."""
        row = self._query_row("SELECT CURRENT_TIMESTAMP AS now", micros=("now",))
        return _EPOCH + timedelta(microseconds=int(row["now"]))

    def high_water(
        self, part: Part, kind: WatermarkKind, max_rows: int | None = None
    ) -> WatermarkValue | None:
        """The highest watermark among the rows in ``part`` (a probe part of exact UTC
        ranges on one column), computed by the database: ``SELECT MAX(column) ... WHERE``,
        or for (time, id) watermarks the last row in (time, id) order (of the first
        ``max_rows``).

        Zone-less timestamps in a zone other than UTC do not map monotonically to instants
        (DST), so there the database's MAX of the wall-clock values only narrows the search:
        the exact maximum is taken by Spark over the rows within two DST margins below it.
        """
        (probe,) = part
        column, tiebreak = probe.column, probe.tiebreak
        raw = predicates.to_source_ranges([part], self._types, self.spec.timezone)
        local = isinstance(self._types.get(column), TimestampNTZType)
        if tiebreak:
            if local and self.spec.timezone != "UTC":
                return self._spark_high_water(part, kind, max_rows)
            return self._last_pair(raw, column, tiebreak, local, max_rows)
        micros = (column,) if isinstance(self._types.get(column), TimestampType) else ()
        sql = (
            f"SELECT MAX({self._quote(column)}) AS {self._quote(column)} "
            f"FROM {self.relation} WHERE {self._where(raw)}"
        )
        if local:
            top = self._query_row(sql, wall_clock=(column,))[column]
            if top is None:
                return None
            if self.spec.timezone == "UTC":
                return to_utc(top)
            return self._exact_max_near(part, column, top)
        value = self._query_row(sql, micros=micros)[column]
        if value is None:
            return None
        return from_transaction_version(int(value), kind)

    def describe(self) -> str:
        return (
            f"jdbc {self.connection.name or _redacted_url(self.connection.url)} {self.spec.table}"
        )

    # -- errors -------------------------------------------------------------------------

    @contextmanager
    def failures(self, doing: str) -> Iterator[None]:
        """Turn a JDBC failure into an error that names the table and says what to change,
        without the password."""
        try:
            yield
        except Exception as exc:
            if not is_spark_failure(exc):
                raise
            raise explain_failure(exc, self.table, self.spec, doing, self._password) from None

    # -- internals ----------------------------------------------------------------------

    def _reader(self) -> DataFrameReader:
        return self._spark.read.format("jdbc").options(
            **reader_options(self._spark, self.connection, self.spec, self._password)
        )

    def _query_row(
        self, sql: str, micros: tuple[str, ...] = (), wall_clock: tuple[str, ...] = ()
    ) -> dict:
        """One row of a query the database executes. Timestamps come back as microseconds
        (``micros``: instants; ``wall_clock``: zone-less values, returned naive), since
        PySpark would turn them into datetimes in the Python process's local zone."""
        with self.failures("querying"):
            df = self._reader().option("query", sql).load()
            columns = [
                F.unix_micros(F.col(transforms.quote(c))).alias(c)
                if c in micros
                else F.unix_micros(F.col(transforms.quote(c)).cast("timestamp")).alias(c)
                if c in wall_clock
                else F.col(transforms.quote(c))
                for c in df.columns
            ]
            row = df.select(*columns).collect()[0].asDict()
        for c in wall_clock:
            if row[c] is not None:
                row[c] = (_EPOCH + timedelta(microseconds=int(row[c]))).replace(tzinfo=None)
        return row

    def _last_pair(
        self, raw: list[Part], column: str, tiebreak: str, local: bool, max_rows: int | None
    ) -> WatermarkValue | None:
        t, i = self._quote(column), self._quote(tiebreak)
        rows = f"SELECT {t} AS t, {i} AS i FROM {self.relation} WHERE {self._where(raw)}"
        if max_rows:
            rows = f"SELECT t, i FROM ({rows} ORDER BY t, i LIMIT {int(max_rows)}) AS first_rows"
        sql = f"SELECT t, i FROM ({rows}) AS window_rows ORDER BY t DESC, i DESC LIMIT 1"
        with self.failures("querying"):
            df = self._reader().option("query", sql).load()
            time = F.col("t").cast("timestamp") if local else F.col("t")
            found = df.select(F.unix_micros(time).alias("t"), "i").collect()
        if not found or found[0]["t"] is None:
            return None
        moment = from_transaction_version(int(found[0]["t"]), "hybrid")
        assert isinstance(moment, datetime)
        return (moment, int(found[0]["i"]))

    def _spark_high_water(
        self, part: Part, kind: WatermarkKind, max_rows: int | None
    ) -> WatermarkValue | None:
        """The engine's own definition, computed by Spark over the pushed-down window."""
        (probe,) = part
        column, tiebreak = probe.column, probe.tiebreak
        zone = self.spec.timezone
        df = (
            self.read(predicates.to_source_ranges([part], self._types, zone))
            .select(column, *([tiebreak] if tiebreak else []))
            .filter(predicates.to_source_filter([part], self._types, zone))
            .transform(transforms.to_utc_instants(zone))
            .filter(predicates.to_filter([part]))
        )
        value = F.unix_micros(F.col(transforms.quote(column)))
        with self.failures("querying"):
            if tiebreak:
                if max_rows:
                    df = df.orderBy(column, tiebreak).limit(max_rows)
                pair = F.struct(value.alias("t"), F.col(transforms.quote(tiebreak)).alias("i"))
                high = df.agg(F.max(pair).alias("hw")).collect()[0]["hw"]
                if high is None:
                    return None
                moment = from_transaction_version(int(high["t"]), "hybrid")
                assert isinstance(moment, datetime)
                return (moment, int(high["i"]))
            high = df.agg(F.max(value).alias("hw")).collect()[0]["hw"]
        return None if high is None else from_transaction_version(int(high), kind)

    def _exact_max_near(self, part: Part, column: str, top: datetime) -> WatermarkValue | None:
        """Exact max instant of a zone-less column: first among raw values within two DST
        margins below the database's MAX (any such row beats every row further down), else
        over the whole part."""
        zone = self.spec.timezone
        (raw,) = predicates.to_source_ranges([part], self._types, zone)
        # Wall-clock bounds, already in the source's value space (hence zone "UTC" below).
        near = Range(column, top - 2 * predicates._DST_MARGIN, True, top, True)
        for extra in ((near,), ()):
            df = (
                self.read([(*raw, *extra)])
                .select(transforms.quote(column))
                .filter(predicates.to_source_filter([part], self._types, zone))
                .filter(predicates.to_source_filter([extra], self._types, "UTC"))
                .transform(transforms.to_utc_instants(zone))
                .filter(predicates.to_filter([part]))
            )
            with self.failures("querying"):
                high = df.agg(F.max(F.unix_micros(transforms.quote(column))).alias("hw"))
                value = high.collect()[0]["hw"]
            if value is not None:
                return from_transaction_version(int(value), "timestamp")
        return None

    def _slice_bounds(self, raw_parts: list[Part] | None) -> tuple[str, str] | None:
        assert self.spec.slices is not None
        column = self.spec.slices.column
        dtype = self._types[column]
        where = self._where(raw_parts) if raw_parts is not None else "1=1"
        quoted = self._quote(column)
        sql = f"SELECT MIN({quoted}) AS lo, MAX({quoted}) AS hi FROM {self.relation} WHERE {where}"
        timestamps = ("lo", "hi") if isinstance(dtype, TimestampType) else ()
        row = self._query_row(sql, micros=timestamps)
        if row["lo"] is None or row["lo"] == row["hi"]:
            return None
        if timestamps:
            # Spark parses timestamp bounds in the session zone, which is UTC.
            return tuple(  # type: ignore[return-value]
                _sql_time(_EPOCH + timedelta(microseconds=int(row[k]))) for k in ("lo", "hi")
            )
        return str(row["lo"]), str(row["hi"])

    def _check_slices(self) -> None:
        slices = self.spec.slices
        if slices is None:
            return
        dtype = self._types.get(slices.column)
        if dtype is None:
            raise SchemaMismatchError(
                self.table,
                slices.column,
                f"slice column '{slices.column}' (source.slices.column) is not in "
                f"{self.spec.table}; columns: {', '.join(self._types)}.",
                "name an integer, date or timestamp column in source.slices.column",
            )
        if not isinstance(dtype, _SLICEABLE):
            raise SchemaMismatchError(
                self.table,
                slices.column,
                f"slice column '{slices.column}' (source.slices.column) is "
                f"{dtype.simpleString()}; slices need an integer, date or timestamp column.",
                "name an integer, date or timestamp column in source.slices.column",
            )

    def _where(self, parts: list[Part]) -> str:
        return sql_condition(parts, self._types, self._quote)


# -- reader options --------------------------------------------------------------------


def reader_options(
    spark: SparkSession, connection: ConnectionSpec, spec: SourceSpec, password: str | None
) -> dict[str, str]:
    """Spark JDBC options: connection, fetch size, zone-less ``timestamp`` columns as
    TIMESTAMP_NTZ (so the source's ``timezone`` setting applies), and for PostgreSQL a
    session time zone equal to the one Spark writes timestamp literals in. The options that
    carry SQL or override the connection are refused when the specs load, and left out of
    the spec's mappings here as well."""
    options: dict[str, str] = {
        **without_reserved(connection.properties),
        "fetchsize": str(spec.fetch_size or DEFAULT_FETCH_SIZE),
        "preferTimestampNTZ": "true",
        **without_reserved(spec.options),
        "url": connection.url,
    }
    if connection.driver:
        options["driver"] = connection.driver
    if connection.user:
        options["user"] = connection.user
    if password is not None:
        options["password"] = password
    if connection.url.startswith("jdbc:postgresql:"):
        # Spark renders a pushed-down timestamp filter as a zone-less literal in the JVM's
        # zone (or the session zone with the Java 8 time API), and PostgreSQL reads it in
        # the session's TimeZone; a TimeZone set on the server, the database, the role or
        # in the URL would shift every window bound. Pin the session to Spark's zone.
        options["sessionInitStatement"] = f"SET TIME ZONE {_postgres_zone(_literal_zone(spark))}"
    return options


def _postgres_zone(java_zone: str) -> str:
    """A Java zone id as PostgreSQL's SET TIME ZONE argument. Offsets become an interval:
    PostgreSQL reads 'GMT+01:00' POSIX-style, i.e. one hour west."""
    offset = re.fullmatch(r"(?:GMT|UTC|UT)?([+-])(\d{1,2})(?::?(\d{2}))?", java_zone)
    if offset:
        sign, hours, minutes = offset.group(1), int(offset.group(2)), int(offset.group(3) or 0)
        return f"INTERVAL '{sign}{hours:02d}:{minutes:02d}' HOUR TO MINUTE"
    return "'" + java_zone.replace("'", "''") + "'"


def _literal_zone(spark: SparkSession) -> str:
    """The zone Spark renders a pushed-down timestamp literal in: the session's, since the
    engine requires the Java 8 time API (engine/spark_session.py REQUIRED_CONF); without it
    Spark would use the driver JVM's default zone, which no public API reads."""
    return spark.conf.get("spark.sql.session.timeZone") or "UTC"


# -- SQL of a window -------------------------------------------------------------------


def sql_condition(parts: list[Part], types: dict[str, DataType], quote) -> str:
    """Raw ranges as a SQL condition (OR of ANDs). Ranges on columns the table lacks are
    left out, as in the Spark filter; no parts means no row."""
    if not parts:
        return "1=0"
    ors = []
    for part in parts:
        ands = []
        for r in part:
            if r.column not in types:
                continue
            column = quote(r.column)
            ands.append(f"{column} IS NOT NULL")
            for bound, inclusive, above in (
                (r.lower, r.lower_inclusive, True),
                (r.upper, r.upper_inclusive, False),
            ):
                if bound is not None:
                    ands.append(_bound_sql(column, r.tiebreak, quote, bound, inclusive, above))
        ors.append("(" + " AND ".join(ands) + ")" if ands else "(1=1)")
    return " OR ".join(ors)


def _bound_sql(column: str, tiebreak, quote, bound, inclusive: bool, above: bool) -> str:
    strict = ">" if above else "<"
    if isinstance(bound, tuple):
        # (time, id) order: past the instant, or at it and past the id.
        time, ident = sql_literal(bound[0]), sql_literal(bound[1])
        at_id = f"{quote(tiebreak)} {strict}{'=' if inclusive else ''} {ident}"
        return f"({column} {strict} {time} OR ({column} = {time} AND {at_id}))"
    return f"{column} {strict}{'=' if inclusive else ''} {sql_literal(bound)}"


def sql_literal(value: object) -> str:
    """A bound as SQL: instants carry their UTC offset (so the session zone cannot shift
    them); zone-less wall-clock values do not."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            return "'" + _sql_time(to_utc(value)) + "+00:00'"
        return "'" + _sql_time(value) + "'"
    if isinstance(value, date):
        return f"'{value.isoformat()}'"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "'" + str(value).replace("'", "''") + "'"
    return str(value)


def _sql_time(value: datetime) -> str:
    """``YYYY-MM-DD HH:MM:SS.ffffff`` with a four-digit year: strftime's ``%Y`` writes year
    1 as ``1``, and PostgreSQL reads '1-01-02' as 2002-01-01."""
    return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def _quoter(url: str):
    mark = "`" if url.startswith(("jdbc:mysql:", "jdbc:mariadb:")) else '"'

    def quote(name: str) -> str:
        return mark + name.replace(mark, mark * 2) + mark

    return quote


def _relation(table: str, spec: SourceSpec, quote) -> str:
    """``source.table`` as SQL, from its parsed names (a spec built without validation is
    refused here, before anything is sent)."""
    try:
        parts = parse_table(spec.table or "")
    except ValueError as exc:
        raise SourceAccessError(
            table,
            f"source.table: {exc}.",
            "correct source.table; nothing was sent to the database",
        ) from None
    return render_table(parts, quote)


# -- connection and password -----------------------------------------------------------


def _connection(table: str, spec: SourceSpec) -> ConnectionSpec:
    if not isinstance(spec.connection, ConnectionSpec):
        raise SourceAccessError(
            table,
            f"source.connection {spec.connection!r} is a name that was never resolved.",
            "load the project with incremental_assets.specs.load_project, which replaces "
            "it with the connection declared under 'connections'",
        )
    return spec.connection


def _refuse_class_loading(table: str, connection: ConnectionSpec, spec: SourceSpec) -> None:
    """Driver parameters that load a class (refused when the specs load) refused again
    here, before anything is sent, for a spec built without validation."""
    places = (
        (f"the url of connection '{connection.name}'", url_parameters(connection.url)),
        (f"the properties of connection '{connection.name}'", list(connection.properties)),
        ("source.options", list(spec.options)),
    )
    for where, keys in places:
        for key in keys:
            if loads_classes(key):
                raise ConnectionSettingError(
                    table,
                    key,
                    f"the JDBC parameter '{key}' in {where} makes the driver load a Java "
                    "class the spec names, on every Spark machine; it is refused.",
                    "remove it (for TLS set sslmode and sslrootcert in the connection's "
                    "properties); nothing was sent to the database",
                )


def _password(table: str, connection: ConnectionSpec) -> str | None:
    if connection.password is not None:
        return connection.password.get_secret_value()
    if connection.password_env is None:
        return None
    value = os.environ.get(connection.password_env)
    if value is None:
        raise SourceAccessError(
            table,
            f"environment variable {connection.password_env} (password_env of connection "
            f"'{connection.name}') is not set.",
            f"set {connection.password_env} to the password of user '{connection.user}'",
        )
    return value


# -- failures --------------------------------------------------------------------------


def explain_failure(
    exc: BaseException,
    table: str,
    spec: SourceSpec,
    doing: str = "reading",
    password: str | None = None,
) -> IncrementalLoadError:
    """A JDBC failure as an engine error: which table and database, what the database
    said (first line, password removed), whether a retry can help, and what to change."""
    connection = spec.connection if isinstance(spec.connection, ConnectionSpec) else None
    where = (
        f"database connection '{connection.name}' ({_redacted_url(connection.url)})"
        if connection
        else "the database"
    )
    state, detail = _sql_failure(exc)
    detail = _redact(detail, password)
    if _missing_driver(exc, connection.driver if connection else None):
        driver = connection.driver if connection and connection.driver else "the JDBC driver"
        return SourceAccessError(
            table,
            f"Spark found no JDBC driver for {where}: {driver} ({detail}).",
            "name the driver class in the connection's driver (e.g. org.postgresql.Driver) "
            "and put its jar on Spark's classpath: spark.conf in tables.yaml, spark.jars: "
            "/path/driver.jar or spark.jars.packages: <maven coordinates>",
        )
    ssl = _ssl_failure(detail)
    if ssl is not None:
        return _ssl_error(table, where, ssl, detail, connection, spec)
    if state.startswith("28"):
        env = connection.password_env if connection else None
        user = connection.user if connection else None
        return SourceAccessError(
            table,
            f"{where} refused the login of user '{user}': {detail}.",
            f"check the user in connections and the password in environment variable {env}",
        )
    if state in ("42P01", "42S02") or ("relation" in detail and "does not exist" in detail):
        return SourceNotFoundError(
            table,
            f"table {spec.table} does not exist in {where}: {detail}.",
            "correct source.table (schema.table), or create the table",
        )
    if state == "42501":
        return SourceAccessError(
            table,
            f"{where} does not let user '{connection.user if connection else None}' read "
            f"{spec.table}: {detail}.",
            f"GRANT SELECT ON {spec.table} TO the connection's user",
        )
    if state == "42703":
        return SchemaMismatchError(
            table,
            "-",
            f"a column is missing from {spec.table} in {where}: {detail}.",
            "correct the column names in the table spec, or add the column",
        )
    if state == "3D000":
        return SourceNotFoundError(
            table, f"{where}: {detail}.", "correct the database name in the connection's url"
        )
    if state.startswith(_TRANSIENT_STATES) or _TRANSIENT_TEXT.search(detail):
        return SourceUnavailableError(
            table,
            f"lost {where} while {doing} {spec.table}: {detail}. Nothing was committed.",
            "check that the database is up and reachable; the run is retried with backoff",
        )
    return SourceAccessError(
        table,
        f"{where} failed while {doing} {spec.table}: {detail}.",
        "see the database's message; correct the table spec or the database",
    )


def _ssl_failure(detail: str) -> str | None:
    """Which SSL setting the database's message says is wrong (see ``_SSL_FAILURES``)."""
    for kind, pattern in _SSL_FAILURES:
        if pattern.search(detail):
            return kind
    return None


def _ssl_error(
    table: str,
    where: str,
    kind: str,
    detail: str,
    connection: ConnectionSpec | None,
    spec: SourceSpec,
) -> ConnectionSettingError:
    """An SSL mismatch between the connection's settings and the server, named as such:
    a configuration error, not a lost connection (no retry can cure it)."""
    mode = _ssl_mode(connection, spec)
    if kind == "no_ssl":
        message = f"{where} does not offer SSL, and the connection's {mode} requires it"
        fix = (
            "enable SSL on the database server, or, on a network you trust, set sslmode: "
            "prefer (or disable) in the connection's properties"
        )
    elif kind == "ssl_only":
        message = (
            f"{where} accepts only SSL connections, and the connection's {mode} does not use SSL"
        )
        fix = (
            "set sslmode: verify-full (with sslrootcert: the CA's certificate file) or "
            "require in the connection's properties"
        )
    elif kind == "mode":
        message = f"{where}: the connection's {mode} is not an SSL mode"
        fix = (
            "set sslmode to one of disable, allow, prefer, require, verify-ca, verify-full "
            "in the connection's properties"
        )
    else:
        message = f"{where} sent a certificate the connection's {mode} does not accept"
        fix = (
            "name the CA's certificate file in the connection's sslrootcert property, and "
            "use the host name the certificate names in the url (sslmode verify-ca does not "
            "check the host)"
        )
    return ConnectionSettingError(
        table, "sslmode", f"{message} ({detail}); not retried.", fix + "; nothing was committed"
    )


def _ssl_mode(connection: ConnectionSpec | None, spec: SourceSpec) -> str:
    """The sslmode (or ssl) setting in effect and where it is set, as text."""
    places = [("source.options", spec.options)]
    if connection is not None:
        query = dict(re.findall(r"[?&;]\s*([^=&;?\s]+)\s*=([^&;]*)", connection.url))
        places = [("properties", connection.properties), ("url", query), *places]
    for name in ("sslmode", "ssl"):
        for place, settings in places:
            for key, value in settings.items():
                if key.strip().lower() == name:
                    return f"{name} '{value}' (in its {place})"
    return "sslmode (not set: the driver's default, prefer)"


@contextmanager
def failures_explained(table: str, spec: SourceSpec) -> Iterator[None]:
    """Around a whole load of a jdbc table: a JDBC failure inside Spark's work (e.g. the
    server going away mid-extraction) becomes an error that names table and database."""
    if spec.format != "jdbc":
        yield
        return
    try:
        yield
    except Exception as exc:
        if not is_spark_failure(exc):
            raise
        password = None
        if isinstance(spec.connection, ConnectionSpec) and spec.connection.password:
            password = spec.connection.password.get_secret_value()
        state, detail = _sql_failure(exc)
        if not state and not _TRANSIENT_TEXT.search(detail) and "SQLException" not in detail:
            raise
        raise explain_failure(exc, table, spec, "reading", password) from None


def _java_throwables(exc: BaseException) -> Iterator[object]:
    """The Java exception behind a PySpark error, and its causes."""
    seen: set[int] = set()
    python: BaseException | None = exc
    while python is not None and id(python) not in seen:
        seen.add(id(python))
        throwable = getattr(python, "java_exception", None) or getattr(python, "_origin", None)
        # On a classic session, py4j's error holds the Java exception (Connect has none).
        if type(throwable).__name__ == "Py4JJavaError":
            throwable = throwable.java_exception  # type: ignore[union-attr]
        depth = 0
        while throwable is not None and depth < 20:
            yield throwable
            try:
                throwable = throwable.getCause()  # type: ignore[attr-defined]
            except Exception:
                break
            depth += 1
        python = python.__cause__ or getattr(python, "_cause", None)


def _sql_failure(exc: BaseException) -> tuple[str, str]:
    """(SQLSTATE, message) of the innermost SQLException behind ``exc``, else ('', text)."""
    found: tuple[str, str] | None = None
    try:
        for throwable in _java_throwables(exc):
            name = throwable.getClass().getName()  # type: ignore[attr-defined]
            if "SQLException" in name or name.endswith("PSQLException"):
                found = (
                    throwable.getSQLState() or "",  # type: ignore[attr-defined]
                    _first_line(throwable.getMessage() or name),  # type: ignore[attr-defined]
                )
    except Exception:  # the JVM is gone: fall back to the Python text
        found = None
    if found is not None:
        return found
    text = str(exc)
    match = re.search(r"(?:PSQLException|SQLException|ConnectException): ([^\n]*)", text)
    return "", _first_line(match.group(1) if match else text)


def _missing_driver(exc: BaseException, driver: str | None) -> bool:
    """No driver for the URL, or the driver class itself missing (another missing class,
    such as one a driver parameter names, is not a missing driver)."""
    text = str(exc)
    if "No suitable driver" in text:
        return True
    if not driver:
        return False
    return re.search(rf"ClassNotFoundException: {re.escape(driver)}\b", text) is not None


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line.rstrip(".")


def _redact(text: str, password: str | None) -> str:
    if password:
        text = text.replace(password, "***")
    return re.sub(r"(password\s*[=:]\s*)[^\s;&,)]+", r"\1***", text, flags=re.IGNORECASE)


def _redacted_url(url: str) -> str:
    """The URL without user info or query parameters (which may carry credentials)."""
    url = re.sub(r"//[^/@]*@", "//", url)
    return url.split("?", 1)[0]
