"""The throwaway PostgreSQL server for tests and benchmarks (it lives in the package, in
:mod:`incremental_assets.demo.postgres_server`, because ``./dev demo --postgres`` starts
one too), and the rule the database tests follow when none can start: skip with the
reason, except on CI (``CI`` set), where a missing database is a failure.

Example:
    >>> with PostgresServer.start() as pg:  # doctest: +SKIP
    ...     pg.create_database("shop")
    ...     pg.sql("CREATE TABLE t (id int)", database="shop")
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from incremental_assets.demo.postgres_server import (
    JDBC_JAR,
    SUPERUSER,
    SUPERUSER_PASSWORD,
    PostgresServer,
    PostgresUnavailable,
    Statement,
    find_bin_dir,
    free_port,
    wait_until,
)

__all__ = [
    "JDBC_JAR",
    "SUPERUSER",
    "SUPERUSER_PASSWORD",
    "PostgresServer",
    "PostgresUnavailable",
    "Statement",
    "find_bin_dir",
    "free_port",
    "skip_or_fail_on_ci",
    "start_or_skip",
    "wait_until",
]


def skip_or_fail_on_ci(problem: str) -> None:
    """Skip the test with ``problem`` as the reason, or fail it when ``CI`` is set."""
    if os.environ.get("CI"):
        pytest.fail(f"{problem} (CI is set, so this fails instead of skipping)")
    pytest.skip(problem)


def start_or_skip(**kwargs: bool) -> PostgresServer:
    """A started throwaway server (with the JDBC driver jar present), or a skip (a failure
    on CI) that says what is missing."""
    if not Path(JDBC_JAR).exists():
        skip_or_fail_on_ci(
            f"PostgreSQL's JDBC driver is not at {JDBC_JAR} (libpostgresql-jdbc-java)"
        )
    try:
        return PostgresServer.start(**kwargs)
    except PostgresUnavailable as exc:
        skip_or_fail_on_ci(f"cannot start PostgreSQL: {exc}")
        raise  # not reached: skip and fail raise
