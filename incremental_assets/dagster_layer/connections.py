"""Database connections in the Dagster layer: the resource that may hold their passwords,
the concurrency pool a connection's tables share, and their retry policy."""

from __future__ import annotations

import dagster as dg
from pydantic import Field, SecretStr

from incremental_assets.specs import TableSpec
from incremental_assets.specs.models import ConnectionSpec


class DatabaseConnections(dg.ConfigurableResource):
    """Passwords of the project's database connections given in Python, by connection name.

    A connection not named here reads its password from its ``password_env`` variable
    when the run starts (the default: nothing to configure), so a missing variable fails
    only the tables of that connection. Give a password here to take it from another
    variable (one a secret store fills, say), as ``dg.EnvVar``: the UI and run config show
    only the variable's name, and the definitions refuse a password written as a literal,
    which they would show (dagster_layer/resource_config.py). At run time it is kept as a
    SecretStr and never written to logs, messages or metadata.

    Example:
        .. code-block:: python

            DatabaseConnections(passwords={"shop": dg.EnvVar("SHOP_DB_PASSWORD")})
    """

    passwords: dict[str, str] = Field(
        default_factory=dict,
        description="Connection name -> password, as dg.EnvVar('NAME') (a literal is "
        "refused: the UI would show it).",
    )

    def bind(self, spec: TableSpec) -> TableSpec:
        """``spec`` with its connection's password filled in when one is given here."""
        connection = connection_of(spec)
        if connection is None or connection.name not in self.passwords:
            return spec
        password = SecretStr(self.passwords[connection.name])
        connection = connection.model_copy(update={"password": password})
        source = spec.source.model_copy(update={"connection": connection})
        return spec.model_copy(update={"source": source})


def connection_of(spec: TableSpec) -> ConnectionSpec | None:
    connection = spec.source.connection
    return connection if isinstance(connection, ConnectionSpec) else None


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
