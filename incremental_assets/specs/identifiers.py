"""Database table names a spec may use: identifiers, never SQL.

A jdbc source's ``source.table`` ends up in the SQL the loader sends to the database (the
``dbtable`` of Spark's JDBC reader and the probe queries), so it must name a table and do
nothing else. It is 1 to 3 dot-separated parts (``table``, ``schema.table`` or
``catalog.schema.table``), each

- plain: letters (any script), digits, ``_`` and ``$``, not starting with a digit. Sent as
  written, so the database folds its case as it does for any unquoted name (PostgreSQL to
  lower case: ``Public.Orders`` is ``public.orders``);
- or double-quoted: ``"Order Lines"``, a ``"`` inside written as ``""``. Matched exactly
  (case and spaces kept), and quoted again for the database's dialect when sent.

Anything else (a semicolon, a comment, a space outside quotes, parentheses, a subquery) is
refused when the specs load.

Example:
    >>> parse_table('sales."Order Lines"')
    (TablePart(name='sales', quoted=False), TablePart(name='Order Lines', quoted=True))
    >>> render_table(parse_table('sales."Order Lines"'), lambda n: "`" + n + "`")
    'sales.`Order Lines`'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, NamedTuple

from pydantic import AfterValidator

_PLAIN = re.compile(r"[^\W\d][\w$]*")
# A quoted part: any characters but a control character, a quote doubled.
_QUOTED = re.compile(r'"((?:[^"\x00-\x1f\x7f]|"")+)"')
MAX_PARTS = 3
_RULE = (
    "write 1 to 3 dot-separated names (table, schema.table or catalog.schema.table), each "
    "plain (letters, digits, '_' and '$', not starting with a digit) or double-quoted "
    '("Order Lines", a quote inside written as ""), e.g. public.orders or '
    'sales."Order Lines"; to read the result of a query, create a view in the database and '
    "name the view here"
)


class TablePart(NamedTuple):
    """One part of a table name: as the database stores it when ``quoted``, else as
    written (the database folds its case)."""

    name: str
    quoted: bool


def parse_table(text: str) -> tuple[TablePart, ...]:
    """The parts of a table name, or ValueError saying what is wrong and what to write."""
    parts: list[TablePart] = []
    pos = 0
    while True:
        plain = _PLAIN.match(text, pos)
        quoted = None if plain else _QUOTED.match(text, pos)
        if plain:
            parts.append(TablePart(plain.group(), False))
            pos = plain.end()
        elif quoted:
            parts.append(TablePart(quoted.group(1).replace('""', '"'), True))
            pos = quoted.end()
        else:
            raise ValueError(_refusal(text, _what_is_at(text, pos)))
        if pos == len(text):
            break
        if text[pos] != ".":
            raise ValueError(_refusal(text, _what_is_at(text, pos)))
        pos += 1
    if len(parts) > MAX_PARTS:
        raise ValueError(_refusal(text, f"{len(parts)} dot-separated parts, at most 3"))
    return tuple(parts)


def render_table(parts: tuple[TablePart, ...], quote: Callable[[str], str]) -> str:
    """The table name as SQL: plain parts as written (validated: no quoting needed), quoted
    parts through ``quote``, the dialect's identifier quoting."""
    return ".".join(quote(p.name) if p.quoted else p.name for p in parts)


def table_name(value: str) -> str:
    parse_table(value)
    return value


TableName = Annotated[str, AfterValidator(table_name)]
"""A database table a spec names: 1 to 3 identifiers (see module docstring)."""


def _what_is_at(text: str, pos: int) -> str:
    if pos >= len(text):
        return "an empty name" if not text else "a name missing after the last '.'"
    char = text[pos]
    if char == '"':
        return "a double quote that is not closed, encloses nothing, or holds a control character"
    if char.isspace():
        return f"a space at position {pos + 1}, outside double quotes"
    if char == ".":
        return f"an empty name before the '.' at position {pos + 1}"
    return f"{char!r} at position {pos + 1}, outside double quotes"


def _refusal(text: str, problem: str) -> str:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return f"{shown!r} is not a table name ({problem}): {_RULE}"


# Spark catalog names: plain parts only. Spark would take backquoted names too, but the
# metastores fold and restrict names (Hive: lower case, letters, digits and '_'), so a
# name outside that set would not be found under the spelling the spec gives.
_CATALOG_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The session catalog's own name: ``spark_catalog.sales.orders`` is ``sales.orders``.
SESSION_CATALOG = "spark_catalog"


def catalog_table_name(value: str) -> str:
    """A Spark catalog table name: ``table``, ``schema.table`` or ``catalog.schema.table``,
    each part letters, digits and ``_`` (not starting with a digit)."""
    parts = value.split(".")
    if len(parts) > MAX_PARTS or not all(_CATALOG_PART.fullmatch(p) for p in parts):
        raise ValueError(
            f"{value!r} is not a catalog table name: write 1 to 3 dot-separated names "
            "(table, schema.table or catalog.schema.table), each of letters, digits and '_' "
            "not starting with a digit, e.g. sales.orders or main.sales.orders"
        )
    return value


CatalogTableName = Annotated[str, AfterValidator(catalog_table_name)]
"""A table in Spark's catalog (Hive metastore, Unity Catalog): 1 to 3 plain names."""


def catalog_key(name: str) -> str:
    """One spelling per catalog table, for telling whether two names reach one table:
    lower case (catalogs fold names), the session catalog's prefix dropped, and a bare
    name in the ``default`` schema (the session's current one unless changed)."""
    parts = name.lower().split(".")
    if len(parts) == 3 and parts[0] == SESSION_CATALOG:
        parts = parts[1:]
    if len(parts) == 1:
        parts = ["default", *parts]
    return ".".join(parts)
