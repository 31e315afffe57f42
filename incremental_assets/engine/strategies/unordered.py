"""Source rows no window can place: a null watermark, or a null tie-break of a hybrid
watermark. A run refuses them, naming some of them, before it reads a row.

Why a null tie-break is refused rather than ordered: a hybrid cursor is (time, id), and a
run's window ends at (instant, id) inside a burst of rows sharing one instant. A row whose
id is null has no place in that order that later rows respect. Ordered first, it is skipped
by every run after the cursor reached its instant; ordered last, the cursor could stop at
(instant, +infinity) and skip every row of that instant still to come; either way a page
(``max_rows``) may end between rows that compare equal. Only the source can give the row
its id; until it does, loading around it would lose it silently (exactly-once means no row
is skipped), so the run fails like one that meets a null watermark.
"""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from incremental_assets.engine.errors import NullValuesError
from incremental_assets.engine.sources import Source
from incremental_assets.engine.transforms import quote, to_utc_instants
from incremental_assets.engine.watermarks import format_value, from_transaction_version
from incremental_assets.specs import TableSpec

# Rows named in the error: enough to find the pattern, few enough for one line.
_NAMED = 5


def fail_on_unordered_rows(
    spec: TableSpec, source: Source, nulls: int | None = None, tiebreak_nulls: int | None = None
) -> None:
    """Refuse a source holding a row with a null watermark, or (hybrid watermarks) a null
    tie-break, wherever it lies: each source counts them cheaply (statistics, or the
    database), and the rows are read only to be named. ``nulls`` and ``tiebreak_nulls``:
    the rows with a null watermark and a null tie-break as the probe's scan counted them
    (None: the source counts them).

    Raises:
        NullValuesError: naming the column, how many rows, and some of them.
    """
    watermark = spec.watermark
    count = source.count_nulls(watermark.column) if nulls is None else nulls
    if count:
        raise NullValuesError(
            spec.name,
            {watermark.column: count},
            f"fill '{watermark.column}' in the source (rows without a watermark can never "
            "be loaded incrementally)",
        )
    tiebreak = watermark.tiebreak
    if tiebreak is None:
        return
    count = source.count_nulls(tiebreak) if tiebreak_nulls is None else tiebreak_nulls
    if count:
        raise NullValuesError(
            spec.name,
            {tiebreak: count},
            f"give these rows a '{tiebreak}' in the source (the watermark orders rows by "
            f"('{watermark.column}', '{tiebreak}'), and a row without '{tiebreak}' has no "
            "place in that order: a run that stops at its instant would skip it), or use "
            f"watermark kind 'timestamp' with a lookback if '{tiebreak}' can be missing",
            rows=_named_rows(spec, source, tiebreak, count) + " Nothing was committed.",
        )


def _named_rows(spec: TableSpec, source: Source, column: str, count: int) -> str:
    """Some rows whose ``column`` is null, by key and watermark, oldest first."""
    raw = source.read([])  # the whole source, unsliced: a few rows are wanted
    wm = spec.watermark.column
    keys = [k for k in spec.keys if k in raw.columns and k != wm]
    rows = (
        raw.filter(F.col(quote(column)).isNull())
        .select(*[quote(c) for c in [*keys, wm]])
        .transform(to_utc_instants(spec.source.timezone))
    )
    # Collect instants as microseconds: PySpark turns timestamps into local-zone values.
    instant = isinstance(rows.schema[wm].dataType, TimestampType)
    at = F.unix_micros(F.col(quote(wm))) if instant else F.col(quote(wm))
    found = rows.select(*[quote(k) for k in keys], at.alias("_ia_at")).orderBy("_ia_at")
    named = []
    for row in found.limit(_NAMED).collect():
        key = ", ".join(f"{k}={row[k]!r}" for k in keys)
        value = row["_ia_at"]
        if instant and value is not None:
            value = format_value(from_transaction_version(int(value), "timestamp"))
        named.append(f"{key} at {wm}={value}" if key else f"{wm}={value}")
    more = f" and {count - len(named)} more" if count > len(named) else ""
    return f"Rows without '{column}': {'; '.join(named)}{more}."
