"""Names a spec may use: plain identifiers for columns, and table names short enough for
the folders named after them.

A column a spec names (keys, watermark, partition and strategy columns) ends up in Spark
expressions, Delta merge predicates, statistics look-ups and asset checks. A dot reads as a
struct field, a backtick ends a quoted name and a space splits it, so such names are
refused when the specs load rather than failing a check after the data is committed.
Columns the spec does not name may be called anything the target format accepts.

A list of columns (keys, partition columns, tracked columns) names each column once:
Spark and Delta compare column names ignoring case, so ``[order_id, ORDER_ID]`` is a
repeat too, and a repeated column fails later in Spark (an ambiguous join or a duplicate
partition column) after the specs loaded.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from incremental_assets.specs.locations import SIDE_TABLES

# Letters (any script), digits and '_', not starting with a digit; '$' as SQL Server's CDC
# columns (__$operation) use it.
_PLAIN = re.compile(r"^[^\W\d][\w$]*$")


def plain_column(value: str) -> str:
    if not _PLAIN.match(value):
        raise ValueError(
            f"{value!r} is not a plain column name: a column the spec names uses letters, "
            "digits, '_' and '$' and does not start with a digit (dots, spaces, backticks "
            "and other marks are refused); rename the column in the source, e.g. in a view "
            "or with the export's column aliases"
        )
    return value


ColumnName = Annotated[str, AfterValidator(plain_column)]
"""A column the spec names: a plain identifier (see module docstring)."""


def distinct_columns(columns: list[str] | None) -> list[str] | None:
    seen: dict[str, str] = {}
    for column in columns or []:
        first = seen.get(column.lower())
        if first is not None:
            also = "" if first == column else f" (as {first!r}: Spark ignores case)"
            raise ValueError(f"{column!r} is listed twice{also}; name each column once")
        seen[column.lower()] = column
    return columns


ColumnList = Annotated[list[ColumnName], AfterValidator(distinct_columns)]
"""Columns the spec names, each once (see module docstring)."""


NAME_BYTES = 255
"""The longest file or folder name (bytes) that ext4, XFS, APFS and NTFS accept."""
# The longest names derived from a table's: its side table <name>__source_file_stamps (its
# staging root <name>__staging, Dagster's pool incremental_assets_<name> and the like are
# shorter). A round limit below leaves room for names the loader derives later.
_DERIVED = 2 + max(len(s) for s in SIDE_TABLES)
MAX_TABLE_NAME = 200
assert MAX_TABLE_NAME + _DERIVED <= NAME_BYTES


def short_table_name(value: str) -> str:
    """``value``, or ValueError when folders named after it would pass ``NAME_BYTES``."""
    if len(value.encode()) > MAX_TABLE_NAME:
        raise ValueError(
            f"is {len(value.encode())} characters long; a table name has at most "
            f"{MAX_TABLE_NAME}: the loader names folders after it (the side table "
            "<name>__source_file_stamps, the staging folder <name>__staging) and a file "
            f"system allows {NAME_BYTES} bytes per name. Choose a shorter name"
        )
    return value


def short_target_folder(path: str | None) -> str | None:
    """``path``, or ValueError when its last folder name leaves no room for the side tables'
    ``__<suffix>`` within ``NAME_BYTES``."""
    if path is None:
        return path
    last = path.rstrip("/").rsplit("/", 1)[-1]
    room = NAME_BYTES - 2 - max(len(s) for s in SIDE_TABLES)
    if len(last.encode()) > room:
        raise ValueError(
            f"its last folder name is {len(last.encode())} bytes long; at most {room} leave "
            f"room for the side tables beside it (<folder>__source_file_stamps) within the "
            f"{NAME_BYTES} bytes a file system allows per name. Choose a shorter folder name"
        )
    return path
