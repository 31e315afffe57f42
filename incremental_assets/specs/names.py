"""Column names a spec may use: plain identifiers.

A column a spec names (keys, watermark, partition and strategy columns) ends up in Spark
expressions, Delta merge predicates, statistics look-ups and asset checks. A dot reads as a
struct field, a backtick ends a quoted name and a space splits it, so such names are
refused when the specs load rather than failing a check after the data is committed.
Columns the spec does not name may be called anything the target format accepts.
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
