"""Where each table writes and reads, and the rule that every table owns its storage.

A table writes its target and, beside it, side tables ``<target>__<suffix>`` (CDC
tombstones, an SCD2 change log, quarantined rows, a landing folder's file index), its runs'
staging root (``<target>__staging``), its checkpoints, and a landing table's
quarantine folder. None of these may be, contain, or sit inside another table's source,
target, side tables, landing folder or quarantine folder: a write there would mix two
tables' files, and a VACUUM or a quarantine move would delete or move the other table's
data. A table's own target may not meet its own source either. Locations are compared in
one normal form (a trailing ``/``, ``./``, ``..``, a symlink, ``s3a://`` for ``s3://``) and
without regard to case, since a store or disk that folds case makes ``Orders`` and
``orders`` one folder.

One overlap is a layer, not a clash: a table may read another table's target as its Delta
source (``source: {format: delta, path: <the other's target>}``); only the other table
writes it.

Example:
    >>> same_location("s3a://bucket/wh/orders/", "s3://bucket/wh//orders")
    True
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from incremental_assets.specs.identifiers import catalog_key

SIDE_TABLES = ("tombstones", "changes", "quarantine", "files", "source_file_stamps")
"""Suffixes of the Delta tables the loader keeps beside a target, ``<target>__<suffix>``."""

STAGING = "_staging"
"""The folder beside local targets where earlier releases staged their runs: still refused
as a table name, so a warehouse that holds one is never mistaken for a table."""

STAGING_SUFFIX = "staging"
"""A table's runs stage under ``<target>__staging``, a folder the table owns alone."""

CHECKPOINT_SUFFIX = "checkpoint"
"""A streaming layer's query keeps its checkpoint in ``<target>__checkpoint``."""

RESERVED_NAMES = (STAGING, "_delta_log")
"""Table names that are folders the loader or Delta Lake keep (compared ignoring case)."""

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

# What each kind of place is called in a message, and the spec field that puts it there.
_NOUNS = {
    "target": "target",
    "staging": "staging folder",
    "landing_quarantine": "landing quarantine folder",
    "checkpoint": "checkpoint folder",
    "source": "source",
    "landing": "landing folder",
}
_FIELDS = {
    "target": "target.path",
    "staging": f"target.path (its staging folder __{STAGING_SUFFIX})",
    "landing_quarantine": "source.landing.quarantine",
    "checkpoint": "target.path (its checkpoint folder)",
    "source": "source.path",
    "landing": "source.path",
}
_FIXES = {
    "landing_quarantine": "change source.landing.quarantine",
    "staging": f"change target.path (the staging folder is <target>__{STAGING_SUFFIX})",
}


@dataclass(frozen=True)
class Place:
    """One location of a table. ``role`` is 'target', a side table's suffix, 'staging',
    'landing_quarantine', 'checkpoint', 'source' or 'landing'; ``location`` is in normal
    form."""

    table: str
    role: str
    location: str

    @property
    def noun(self) -> str:
        return _NOUNS.get(self.role, f"__{self.role} side table")

    @property
    def field(self) -> str:
        return _FIELDS.get(self.role, f"target.path (its __{self.role})")

    @property
    def fix(self) -> str:
        return _FIXES.get(self.role, "change target.path (or the table's name)")

    @property
    def key(self) -> str:
        # Compared without case: one folder on a store or disk that folds case.
        return self.location.casefold()


@dataclass(frozen=True)
class Storage:
    """Where one table writes and reads. ``source``: the folder or Delta table it reads
    (None for a database); ``quarantine``: its landing quarantine folder;
    ``checkpoints``: folders its streaming runs keep."""

    table: str
    target: str
    source: str | None = None
    source_is_delta: bool = False
    landing: bool = False
    quarantine: str | None = None
    checkpoints: Sequence[str] = field(default_factory=tuple)

    def owned(self) -> list[Place]:
        """The places the table writes."""
        root = normal_location(self.target)
        places = [Place(self.table, "target", root)]
        places += [Place(self.table, suffix, f"{root}__{suffix}") for suffix in SIDE_TABLES]
        places.append(Place(self.table, "staging", normal_location(staging_location(self.target))))
        places += [Place(self.table, "checkpoint", normal_location(c)) for c in self.checkpoints]
        if self.quarantine is not None:
            places.append(Place(self.table, "landing_quarantine", normal_location(self.quarantine)))
        return places

    def read(self) -> Place | None:
        if self.source is None:
            return None
        role = "landing" if self.landing else "source"
        return Place(self.table, role, normal_location(self.source))

    def guarded(self) -> list[Place]:
        """The places no other table may write: what this table reads and writes."""
        read = self.read()
        owned = self.owned()
        return [read, *owned] if read is not None else owned


def readable_by_spark(location: str | None) -> str | None:
    """``location``, or ValueError when Spark's Hadoop connectors cannot open it: an
    ``az://`` URI without its storage account (delta-rs finds the account in its storage
    options; hadoop-azure only in the URI, so Spark's first read would fail with "No
    FileSystem for scheme az")."""
    if location and location[:5].lower() == "az://":
        host = location[5:].split("/", 1)[0]
        if "@" not in host:
            raise ValueError(
                f"'{location}' names no storage account, which Spark's Azure connector "
                f"needs in the URI: write az://{host or '<container>'}@<account>"
                ".blob.core.windows.net/<path> (or abfss://<container>@<account>"
                ".dfs.core.windows.net/<path>)"
            )
    return location


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


def staging_location(target: str) -> str:
    """The staging root of a target, on the target's own file system (local, mounted or an
    object store): ``<target>__staging``, which only this table's runs write."""
    return f"{target.rstrip('/')}__{STAGING_SUFFIX}"


def checkpoint_folder(target: str) -> str:
    """Where a streaming layer's query keeps its checkpoint: ``<target>__checkpoint``, beside
    its Delta table (not inside it, where engines that guard a table's folder against other
    formats would refuse to read or empty it)."""
    return f"{target.rstrip('/')}__{CHECKPOINT_SUFFIX}"


def _inside(inner: str, outer: str) -> bool:
    return inner != outer and inner.startswith(outer.rstrip("/") + "/")


def _relation(a: Place, b: Place) -> str | None:
    """How ``a`` meets ``b``: 'is', 'lies inside', 'contains', or None."""
    if a.key == b.key:
        return "is"
    if _inside(a.key, b.key):
        return "lies inside"
    if _inside(b.key, a.key):
        return "contains"
    return None


def layer_folder_problems(
    tables: Iterable[Storage], layers: Iterable[tuple[str, str]]
) -> list[tuple[str, str, str]]:
    """Problems, as (table, field, message): a place a table writes (its target, side
    tables, staging, quarantine, checkpoints) that is, lies inside or contains the folder
    of a declared layer, given as (name, folder)."""
    problems = []
    folders = [Place(name, "target", normal_location(folder)) for name, folder in layers]
    for storage in tables:
        for mine in storage.owned():
            clash = next(((f, r) for f in folders if (r := _relation(mine, f)) is not None), None)
            if clash is not None:
                folder, relation = clash
                problems.append(
                    (
                        mine.table,
                        mine.field,
                        f"its {mine.noun} ({mine.location}) {relation} the folder of layer "
                        f"'{folder.table}' ({folder.location}): {mine.fix}, or rename the "
                        "layer",
                    )
                )
                break
    return problems


def conflicts(tables: Iterable[Storage]) -> list[tuple[str, str, str]]:
    """Problems, as (table, field, message): a place one table writes that meets a place
    another table reads or writes, and a table whose writes meet its own source or whose
    quarantine meets its own writes. One problem per pair of tables, given to the table
    whose write is at fault (the later one when both are)."""
    storages = list(tables)
    problems = [p for s in storages if (p := _own_problem(s)) is not None]
    for i, later in enumerate(storages):
        for earlier in storages[:i]:
            if later.table.casefold() == earlier.table.casefold():
                continue  # a repeated name (in any case) is reported as such
            found = _clash(later, earlier) or _clash(earlier, later)
            if found is not None:
                problems.append(found)
    return problems


def _clash(writer: Storage, other: Storage) -> tuple[str, str, str] | None:
    """The first place ``writer`` writes that meets a place of ``other``."""
    for mine in writer.owned():
        for theirs in other.guarded():
            relation = _relation(mine, theirs)
            if relation is None or _layer(mine, theirs, relation, other):
                continue
            return (mine.table, mine.field, _message(mine, theirs, relation))
    return None


def _layer(mine: Place, theirs: Place, relation: str, other: Storage) -> bool:
    """A target that another table reads as its Delta source: a layer after this table."""
    return (
        relation == "is"
        and mine.role == "target"
        and theirs.role == "source"
        and other.source_is_delta
    )


def _message(mine: Place, theirs: Place, relation: str) -> str:
    if relation == "is" and mine.role == theirs.role == "target":
        what = f"writes into the same Delta table as table '{theirs.table}' ({mine.location})"
    elif relation == "is":
        what = (
            f"its {mine.noun} is the {theirs.noun} of table '{theirs.table}' "
            f"({mine.location}, {theirs.field})"
        )
    else:
        what = (
            f"its {mine.noun} ({mine.location}) {relation} the {theirs.noun} of table "
            f"'{theirs.table}' ({theirs.location}, {theirs.field})"
        )
    return (
        f"{what}; each table writes only where no other table reads or writes (a write, "
        f"VACUUM or quarantine there would change the other table's files): {mine.fix}"
    )


def _own_problem(storage: Storage) -> tuple[str, str, str] | None:
    """A table whose writes meet its own source, or whose quarantine folder meets its own
    writes or holds its landing folder."""
    read = storage.read()
    owned = storage.owned()
    writes = [p for p in owned if p.role != "landing_quarantine"]
    quarantine = next((p for p in owned if p.role == "landing_quarantine"), None)
    if read is not None:
        for mine in writes:
            relation = _relation(mine, read)
            if relation is not None:
                return (
                    storage.table,
                    mine.field,
                    f"its {mine.noun} ({mine.location}) {relation} its own {read.noun} "
                    f"({read.location}, source.path): the table would read and rewrite its "
                    f"own output: {mine.fix}",
                )
    if quarantine is None:
        return None
    for other in writes:
        relation = _relation(quarantine, other)
        if relation is not None:
            return (
                storage.table,
                quarantine.field,
                f"its {quarantine.noun} ({quarantine.location}) {relation} its own "
                f"{other.noun} ({other.location}): quarantined files would land among the "
                f"table's own data: {quarantine.fix}",
            )
    if read is not None and _relation(quarantine, read) in ("is", "contains"):
        return (
            storage.table,
            quarantine.field,
            f"its {quarantine.noun} ({quarantine.location}) {_relation(quarantine, read)} "
            f"the landing folder ({read.location}): a quarantined file would be read again; "
            "use a folder inside the landing folder (the default is _quarantine) or one of "
            "its own outside it",
        )
    return None


def reserved_suffix(name: str) -> str | None:
    """The side-table, staging or checkpoint suffix a table name ends with
    (``orders__quarantine``, ``orders__staging``, in any case), else None."""
    folded = name.casefold()
    for suffix in (*SIDE_TABLES, STAGING_SUFFIX, CHECKPOINT_SUFFIX):
        if folded.endswith(f"__{suffix}"):
            return suffix
    return None


def reserved_name(name: str) -> str | None:
    """The reserved folder name a table name is (``_staging``, ``_delta_log``, in any case),
    else None."""
    return next((r for r in RESERVED_NAMES if name.casefold() == r.casefold()), None)


def catalog_overlaps(tables: Iterable[tuple[str, str | None]]) -> list[tuple[str, str, str]]:
    """Problems, as (table, field, message), for tables whose targets name one catalog
    table (however spelled: case, ``spark_catalog.``, a bare name in ``default``).
    ``tables`` holds (name, target.table or None)."""
    problems: list[tuple[str, str, str]] = []
    seen: dict[str, str] = {}
    for name, table in tables:
        if table is None:
            continue
        key = catalog_key(table)
        if key in seen:
            problems.append(
                (
                    name,
                    "target.table",
                    f"names catalog table {table!r}, the target of table '{seen[key]}'; "
                    "each table needs a catalog table of its own: change target.table",
                )
            )
        else:
            seen[key] = name
    return problems
