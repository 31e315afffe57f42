"""The demo's PostgreSQL database (``./dev demo --postgres``): the shop's ``orders`` table,
which the simulator updates in place as an application would and the loader reads over
JDBC.

By default the demo starts a throwaway server (:mod:`postgres_server`: its own data folder
and port, removed at the end). With ``INCREMENTAL_ASSETS_DEMO_PG_URL`` set to
``postgresql://user@host:port/database`` it uses that server instead, logging in with the
password in ``DEMO_SHOP_PASSWORD``; there it drops and re-creates the schema
``incremental_assets_demo`` and touches nothing else. Statements go through ``psql``, so
the demo needs no Python database driver.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

from incremental_assets.demo.postgres_server import (
    JDBC_JAR,
    PostgresServer,
    PostgresUnavailable,
    find_bin_dir,
)

URL_ENV = "INCREMENTAL_ASSETS_DEMO_PG_URL"
PASSWORD_ENV = "DEMO_SHOP_PASSWORD"
JAR_ENV = "INCREMENTAL_ASSETS_PG_JDBC_JAR"
SCHEMA = "incremental_assets_demo"
ORDERS_TABLE = f"{SCHEMA}.orders"
_DATABASE = "shop"
_USER = "demo_loader"
_INSTALL = (
    "install PostgreSQL and its JDBC driver (Debian/Ubuntu: apt-get install postgresql "
    "libpostgresql-jdbc-java; elsewhere PostgreSQL's server package with pg_ctl on PATH, "
    f"and the driver jar in {JAR_ENV}), or point "
    f"{URL_ENV}=postgresql://user@host:5432/database at a running server (password in "
    f"{PASSWORD_ENV})"
)


class DemoDatabaseUnavailable(RuntimeError):
    """``--postgres`` cannot run here; the message says what to install or set."""


def jdbc_jar() -> str:
    """PostgreSQL's JDBC driver for Spark: ``INCREMENTAL_ASSETS_PG_JDBC_JAR`` or Debian's."""
    jar = os.environ.get(JAR_ENV, JDBC_JAR)
    if not Path(jar).is_file():
        raise DemoDatabaseUnavailable(
            f"the demo's --postgres switch needs PostgreSQL's JDBC driver, not found at {jar}: "
            "apt-get install libpostgresql-jdbc-java (Debian/Ubuntu), or download "
            f"postgresql-<version>.jar from jdbc.postgresql.org and set {JAR_ENV} to its path"
        )
    return jar


@dataclass
class ShopDatabase:
    """A database the demo may write to, reached over TCP with a password."""

    host: str
    port: int
    database: str
    user: str
    password: str
    psql: Path
    server: PostgresServer | None = None  # set when the demo started the server itself

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.database}"

    def describe(self) -> str:
        kind = "a throwaway PostgreSQL server" if self.server else "PostgreSQL"
        return f"{kind} at {self.host}:{self.port}, database {self.database}"

    def sql(self, statement: str) -> list[list[str]]:
        """Run SQL (one transaction) as the demo's user; rows as lists of text."""
        done = subprocess.run(
            [
                str(self.psql), "-X", "-q", "-A", "-t", "-F", "\t", "-1",
                "-v", "ON_ERROR_STOP=1",
                "-h", self.host, "-p", str(self.port), "-U", self.user, "-d", self.database,
            ],
            input=statement,
            capture_output=True,
            text=True,
            env={**os.environ, "PGPASSWORD": self.password, "PGCONNECT_TIMEOUT": "10"},
        )  # fmt: skip
        if done.returncode != 0:
            message = done.stderr.strip()
            if self.password:
                message = message.replace(self.password, "***")
            raise RuntimeError(f"psql failed ({done.returncode}): {message}")
        return [line.split("\t") for line in done.stdout.splitlines() if line]

    def create_orders_table(self) -> None:
        """A fresh ``incremental_assets_demo.orders``, indexed on the watermark column so
        each run's window is an index range scan."""
        self.sql(
            f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}; "
            f"CREATE TABLE {ORDERS_TABLE} (order_id bigint PRIMARY KEY, customer_id bigint "
            "NOT NULL, status text NOT NULL, amount numeric(12, 2) NOT NULL, "
            "created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL); "
            f"CREATE INDEX orders_updated_at ON {ORDERS_TABLE} (updated_at);"
        )

    def write_orders(self, inserts: list[dict], updates: list[dict]) -> None:
        """The simulator's orders sink: new orders, then status updates of existing ones,
        in one transaction."""
        statements = []
        if inserts:
            values = ",\n".join(
                f"({r['order_id']}, {r['customer_id']}, '{r['status']}', {r['amount']}, "
                f"{_instant(r['created_at'])}, {_instant(r['updated_at'])})"
                for r in inserts
            )
            statements.append(f"INSERT INTO {ORDERS_TABLE} VALUES\n{values};")
        if updates:
            values = ",\n".join(
                f"({r['order_id']}, '{r['status']}', {_instant(r['updated_at'])})" for r in updates
            )
            statements.append(
                f"UPDATE {ORDERS_TABLE} AS o SET status = u.status, updated_at = u.updated_at "
                f"FROM (VALUES\n{values}) AS u (order_id, status, updated_at) "
                "WHERE o.order_id = u.order_id;"
            )
        if statements:
            self.sql("\n".join(statements))

    def log_position(self) -> int | None:
        """Where the server's statement log ends now (None on a server the demo did not
        start: its log is not ours to read)."""
        return self.server.log_position() if self.server else None

    def window_filters(self, since: int | None) -> list[str]:
        """The WHERE clauses of the loader's reads of orders rows logged after ``since``:
        the window's bounds as the database received them."""
        if self.server is None or since is None:
            return []
        found = []
        for statement in self.server.statements(since, database=self.database):
            text = " ".join(statement.text.split())
            if (
                statement.user == self.user
                and text.upper().startswith("SELECT")
                and ORDERS_TABLE in text
                and '"status"' in text
                and '"updated_at" >' in text
            ):
                found.append(text[text.find(" WHERE ") + 1 :])
        return found


@contextmanager
def shop_database() -> Iterator[ShopDatabase]:
    """The demo's database: a throwaway server (stopped and removed on exit), or the one
    ``INCREMENTAL_ASSETS_DEMO_PG_URL`` names.

    Raises:
        DemoDatabaseUnavailable: saying what to install or set.
    """
    url = os.environ.get(URL_ENV)
    if url:
        database = _external(url)
        try:
            database.sql("SELECT 1")
        except RuntimeError as exc:
            raise DemoDatabaseUnavailable(f"cannot connect to {url} ({URL_ENV}): {exc}") from exc
        yield database
        return
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        raise DemoDatabaseUnavailable(
            f"the demo's --postgres switch needs a PostgreSQL server; none could be started:\n"
            f"  {exc}\nTo fix: {_INSTALL}."
        ) from exc
    try:
        password = secrets.token_urlsafe(18)
        server.create_user(_USER, password)
        server.create_database(_DATABASE)
        server.sql(f'ALTER DATABASE {_DATABASE} OWNER TO "{_USER}"')
        yield ShopDatabase(
            "127.0.0.1", server.port, _DATABASE, _USER, password, server.bin_dir / "psql", server
        )
    finally:
        server.close()


def _external(url: str) -> ShopDatabase:
    parts = urlsplit(url)
    database = parts.path.lstrip("/")
    if parts.scheme not in ("postgresql", "postgres") or not parts.username or not database:
        raise DemoDatabaseUnavailable(
            f"{URL_ENV} must look like postgresql://user@host:5432/database, got {url!r}"
        )
    if parts.password is not None:
        raise DemoDatabaseUnavailable(
            f"{URL_ENV} must not carry the password; put it in {PASSWORD_ENV}"
        )
    password = os.environ.get(PASSWORD_ENV)
    if password is None:
        raise DemoDatabaseUnavailable(
            f"set {PASSWORD_ENV} to the password of user {parts.username!r} ({URL_ENV} is set)"
        )
    return ShopDatabase(
        parts.hostname or "localhost",
        parts.port or 5432,
        unquote(database),
        unquote(parts.username),
        password,
        _psql(),
    )


def _psql() -> Path:
    on_path = shutil.which("psql")
    if on_path:
        return Path(on_path)
    try:
        return find_bin_dir() / "psql"
    except PostgresUnavailable as exc:
        raise DemoDatabaseUnavailable(
            "the demo writes to PostgreSQL with psql, which is not installed: apt-get install "
            "postgresql-client (Debian/Ubuntu) or brew install libpq (macOS)"
        ) from exc


def _instant(value: datetime) -> str:
    """A timestamptz literal with its UTC offset, so no session time zone can shift it."""
    return f"timestamptz '{value.isoformat(sep=' ')}'"
