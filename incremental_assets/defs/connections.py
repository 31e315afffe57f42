"""Database connections in the Dagster layer: one resource per connection holding its
password (read with ``dg.EnvVar`` when a run starts, so the value is never part of run
config, logs or metadata), the concurrency pool its tables share, and their retry policy.
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field, SecretStr

from incremental_assets.specs import ProjectSpec, TableSpec
from incremental_assets.specs.models import ConnectionSpec


class JdbcConnection(dg.ConfigurableResource):
    """The secret of one database connection (the rest is in tables.yaml).

    Example:
        .. code-block:: python

            JdbcConnection(password=dg.EnvVar("SHOP_DB_PASSWORD"))
    """

    password: str | None = Field(
        default=None, description="The user's password; pass dg.EnvVar('NAME')."
    )

    def bind(self, spec: TableSpec) -> TableSpec:
        """``spec`` with its connection's password filled in (kept as a SecretStr, which
        prints as '**********')."""
        connection = spec.source.connection
        if self.password is None or not isinstance(connection, ConnectionSpec):
            return spec
        connection = connection.model_copy(update={"password": SecretStr(self.password)})
        source = spec.source.model_copy(update={"connection": connection})
        return spec.model_copy(update={"source": source})


def connection_of(spec: TableSpec) -> ConnectionSpec | None:
    connection = spec.source.connection
    return connection if isinstance(connection, ConnectionSpec) else None


def resource_key(connection: ConnectionSpec) -> str:
    return f"jdbc_{connection.name}"


def pool_name(connection: ConnectionSpec) -> str:
    """One pool per database: its limit (default 1, see dagster.yaml and
    ``dagster instance concurrency set jdbc_<name> N``) caps how many of the database's
    tables load at once, across runs."""
    return f"jdbc_{connection.name}"


def retry_policy(connection: ConnectionSpec) -> dg.RetryPolicy:
    """Retries with exponential backoff for loads whose connection failed; a load that
    failed for a reason a retry cannot fix (bad password, missing table) is not retried."""
    return dg.RetryPolicy(
        max_retries=connection.max_retries,
        delay=connection.retry_delay.total_seconds(),
        backoff=dg.Backoff.EXPONENTIAL,
    )


def connection_resources(project: ProjectSpec) -> dict[str, JdbcConnection]:
    """``jdbc_<name>`` for every declared connection; only the tables on a connection
    require its resource, so a missing variable fails those tables alone."""
    return {
        resource_key(connection): JdbcConnection(
            password=dg.EnvVar(connection.password_env) if connection.password_env else None
        )
        for connection in project.connections.values()
    }
