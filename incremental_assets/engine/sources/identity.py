"""What a table reads, as one line: each load records it in its commit (the record's
``source_identity``, delta_lake/commits.py) and a run whose source is another one fails
before it reads or writes anything.

An identity is a location, never a credential:

- a Delta table: ``delta <path>``; a folder of files: ``<format> <path>``; the path in the
  normal form of specs/locations.py (absolute, symlinks resolved, ``s3a://`` as ``s3://``).
  A Delta table dropped and created again at the same path keeps its identity: the next
  run reads it whole (engine/late_files.py), which is right for a table rebuilt in place.
- a database table: the JDBC URL without user, password or parameters, with the host in
  lower case and the driver's default port filled in, then the table, names in the case
  the database folds them to (unquoted ones in lower case). Parameters that choose the
  database or the schema an unqualified name is read from (``databaseName``,
  ``currentSchema``, ...) are kept, from the URL or the connection's properties.

Example:
    >>> database_identity("jdbc:postgresql://DB.internal/shop?ssl=true", "Public.Orders")
    'jdbc:postgresql://db.internal:5432/shop table public.orders'
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from incremental_assets.engine.errors import SourceSwitchedError
from incremental_assets.specs.identifiers import parse_table
from incremental_assets.specs.locations import normal_location

_DEFAULT_PORTS = {
    "postgresql": 5432,
    "redshift": 5439,
    "mysql": 3306,
    "mariadb": 3306,
    "sqlserver": 1433,
    "db2": 50000,
    "oracle": 1521,
}
# Parameters that choose what a table name reads (lower case); the others (SSL, timeouts,
# the application name, the user) change how it is read, not what.
_CHOOSING = {
    "database",
    "databasename",
    "dbname",
    "pgdbname",
    "currentschema",
    "searchpath",
    "service",
    "servicename",
}


def location_identity(fmt: str, path: str) -> str:
    """A Delta table's or a folder's identity: its format and normal location."""
    return f"{fmt} {normal_location(path)}"


def database_identity(url: str, table: str, properties: Mapping[str, str] | None = None) -> str:
    """A database table's identity: the normal URL and the table as the database names it."""
    return f"{normal_url(url, properties)} table {_table(table)}"


def normal_url(url: str, properties: Mapping[str, str] | None = None) -> str:
    """``url`` without credentials or parameters (but those in ``_CHOOSING``, also taken
    from the connection's ``properties``), host in lower case, default port filled in."""
    found = re.match(r"jdbc:([A-Za-z0-9]+):(.*)", url.strip(), re.DOTALL)
    if found is None:
        return url.split("?", 1)[0]
    driver, rest = found.group(1).lower(), found.group(2)
    if driver == "postgresql" and not rest.startswith("//"):
        rest = "//localhost/" + rest.lstrip("/")  # jdbc:postgresql:shop is on localhost
    if not rest.startswith("//"):
        # Another form (Oracle's thin:@host:port:sid, a file database): kept as written,
        # without credentials before '@' and without parameters.
        rest = re.sub(r"^(\w+:)[^@/]*/[^@]*@", r"\1@", rest)
        return f"jdbc:{driver}:{re.split(r'[?;]', rest, maxsplit=1)[0]}"
    body = rest[2:]
    cut = re.search(r"[/?;]", body)
    authority, tail = (body[: cut.start()], body[cut.start() :]) if cut else (body, "")
    hosts = ",".join(_host(h, _DEFAULT_PORTS.get(driver)) for h in authority.split(","))
    path_end = re.search(r"[?;]", tail)
    path, params = (tail[: path_end.start()], tail[path_end.start() :]) if path_end else (tail, "")
    chosen = {**_choosing(properties or {}), **_choosing(_pairs(params))}
    query = "&".join(f"{k}={v}" for k, v in sorted(chosen.items()))
    return f"jdbc:{driver}://{hosts}{path.rstrip('/')}" + (f"?{query}" if query else "")


def _host(text: str, default_port: int | None) -> str:
    host = text.rpartition("@")[2].strip().lower()  # user info is never part of it
    ipv6 = host.startswith("[")
    has_port = re.search(r":\d+$", host) if not ipv6 else re.search(r"]:\d+$", host)
    if not has_port and default_port is not None and host:
        host = f"{host}:{default_port}"
    return host


def _pairs(params: str) -> dict[str, str]:
    pairs = {}
    for item in re.split(r"[?&;]", params):
        name, eq, value = item.partition("=")
        if eq and name.strip():
            pairs[name.strip()] = value.strip()
    return pairs


def _choosing(pairs: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in pairs.items() if k.lower() in _CHOOSING}


def _table(table: str) -> str:
    try:
        parts = parse_table(table)
    except ValueError:
        return table  # refused when the specs load; shown as written
    return ".".join(
        '"' + p.name.replace('"', '""') + '"' if p.quoted else p.name.lower() for p in parts
    )


def check_unchanged(
    table: str,
    recorded: str | None,
    recorded_version: int | None,
    current: str,
    *,
    fields: str,
    rewindable: bool,
) -> None:
    """Refuse a run whose source identity ``current`` is not the ``recorded`` one (that
    of the newest load or rewind that recorded one, at Delta version
    ``recorded_version``). Nothing recorded (loads of earlier releases): accepted, and
    recorded by this run. ``fields`` names the spec fields that choose the source;
    ``rewindable``: whether the table has a watermark to reset."""
    if recorded is None or recorded == current:
        return
    accept = f"`incremental-assets rewind {table} --accept-source --reason TEXT`"
    if rewindable:
        how = (
            f"`incremental-assets rewind {table} --reset --reason TEXT` reloads the table "
            f"from it, {accept} keeps the watermark and goes on from there"
        )
    else:
        how = f"{accept} records it, and the next run reads it"
    raise SourceSwitchedError(
        table,
        recorded,
        current,
        f"the source is not the one the table was loaded from: Delta version "
        f"{recorded_version} recorded {recorded}, the spec now names {current}. Loading it "
        "would merge another source's rows into the table; nothing was read or written.",
        f"if {current} is the table's source now, {how}; otherwise restore {fields} in the spec",
    )
