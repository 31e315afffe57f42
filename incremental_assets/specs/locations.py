"""Where each table writes, and the rule that no two tables share storage.

A table writes its target and, beside it, side tables ``<target>__<suffix>`` (CDC
tombstones, an SCD2 change log, quarantined rows, a landing folder's file index). Two
tables that reach one location, however it is spelled (a trailing ``/``, ``./``, a
symlink, ``s3a://`` for ``s3://``), would commit into one Delta table and read each
other's cursors and rows; so locations are compared in one normal form when the specs load.

Example:
    >>> same_location("s3a://bucket/wh/orders/", "s3://bucket/wh//orders")
    True
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

SIDE_TABLES = ("tombstones", "changes", "quarantine", "files", "source_file_stamps")
"""Suffixes of the Delta tables the loader keeps beside a target, ``<target>__<suffix>``."""

# Schemes that name one store under several spellings.
_SCHEME_FAMILIES = {
    "s3": "s3",
    "s3a": "s3",
    "s3n": "s3",
    "gs": "gs",
    "gcs": "gs",
    "az": "az",
    "abfs": "az",
    "abfss": "az",
    "adl": "az",
    "wasb": "az",
    "wasbs": "az",
    "file": "file",
}


@dataclass(frozen=True)
class Occupied:
    """One location a table writes: ``role`` is 'target' or the side table's suffix."""

    table: str
    role: str
    location: str

    @property
    def field(self) -> str:
        return "target.path" if self.role == "target" else f"target.path (its __{self.role})"


def normal_location(location: str) -> str:
    """``location`` in one form per place: local paths absolute with symlinks resolved and
    no trailing ``/``; URIs with the scheme's family (``s3a`` -> ``s3``, ``abfss`` with
    ``container@account.dfs.core.windows.net`` -> ``az://container@account``), a lower-case
    host and a normalised path."""
    if "://" not in location:
        return os.path.realpath(os.path.expanduser(location)).rstrip("/") or "/"
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    family = _SCHEME_FAMILIES.get(scheme, scheme)
    if family == "file":
        return normal_location(parts.path or "/")
    host = parts.netloc.lower()
    if family == "az" and "@" in host:
        container, _, account = host.partition("@")
        host = f"{container}@{account.split('.', 1)[0]}"
    path = posixpath.normpath("/" + parts.path.lstrip("/")) if parts.path else "/"
    return f"{family}://{host}{path.rstrip('/')}"


def same_location(a: str, b: str) -> bool:
    return normal_location(a) == normal_location(b)


def _inside(inner: str, outer: str) -> bool:
    return inner != outer and inner.startswith(outer.rstrip("/") + "/")


def occupied(table: str, target: str) -> list[Occupied]:
    """Every location a table with ``target`` writes: the target and its side tables."""
    root = normal_location(target)
    return [
        Occupied(table, "target", root),
        *[Occupied(table, suffix, f"{root}__{suffix}") for suffix in SIDE_TABLES],
    ]


def overlaps(tables: Iterable[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """Problems, as (table, field, message), for tables whose locations collide: the same
    location, or a target inside another table's folder (a VACUUM of the outer table
    would delete the inner one's files). ``tables`` holds (name, target location)."""
    spots = [spot for name, target in tables for spot in occupied(name, target)]
    problems: list[tuple[str, str, str]] = []
    reported: set[tuple[str, str]] = set()
    for i, spot in enumerate(spots):
        for other in spots[:i]:
            if other.table == spot.table or (other.table, spot.table) in reported:
                continue
            if spot.location == other.location:
                what = (
                    f"writes into the same Delta table as table '{other.table}'"
                    if spot.role == other.role == "target"
                    else f"its {_role(spot)} is {_role(other)} of table '{other.table}'"
                )
                problems.append(
                    (
                        spot.table,
                        spot.field,
                        f"{what} ({spot.location}); each table needs a location of its "
                        "own: change target.path (or the table's name)",
                    )
                )
                reported.add((other.table, spot.table))
            elif spot.role == other.role == "target" and (
                _inside(spot.location, other.location) or _inside(other.location, spot.location)
            ):
                inner, outer = (
                    (spot, other) if _inside(spot.location, other.location) else (other, spot)
                )
                problems.append(
                    (
                        spot.table,
                        "target.path",
                        f"the target of table '{inner.table}' ({inner.location}) lies inside "
                        f"the target of table '{outer.table}' ({outer.location}); a Delta "
                        "table's folder holds one table: move one of them",
                    )
                )
                reported.add((other.table, spot.table))
    return problems


def _role(spot: Occupied) -> str:
    return "the target" if spot.role == "target" else f"the __{spot.role} side table"


def reserved_suffix(name: str) -> str | None:
    """The side-table suffix a table name ends with (``orders__quarantine``), else None."""
    for suffix in SIDE_TABLES:
        if name.endswith(f"__{suffix}"):
            return suffix
    return None
