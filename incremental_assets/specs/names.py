"""Column names a spec may use: plain identifiers.

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
