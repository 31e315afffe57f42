"""Where rows come from: one class per kind of source, picked by ``source.format``.

``base`` holds the interface (``Source``); ``delta`` a Delta table, ``files`` a folder of
Parquet, CSV or JSON-lines files, ``jdbc`` a database table. A new kind is a module with a
``Source`` subclass and one entry in ``SOURCES``.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from incremental_assets.engine.errors import IncrementalLoadError
from incremental_assets.engine.sources.base import Source
from incremental_assets.engine.sources.delta import DeltaSource
from incremental_assets.engine.sources.files import FileSource
from incremental_assets.engine.sources.jdbc import JdbcSource
from incremental_assets.specs import SourceSpec

SOURCES: dict[str, type[Source]] = {
    "delta": DeltaSource,
    "jdbc": JdbcSource,
    "parquet": FileSource,
    "csv": FileSource,
    "json": FileSource,
}
"""The source class of each ``source.format``."""


def source_class(table: str, spec: SourceSpec) -> type[Source]:
    """The source class registered for ``spec``'s format."""
    kind = SOURCES.get(spec.format)
    if kind is None:
        raise IncrementalLoadError(
            table,
            f"source.format '{spec.format}' is not a kind of source the engine reads.",
            f"set source.format to one of: {', '.join(sorted(SOURCES))}",
        )
    return kind


def open_source(spark: SparkSession, table: str, spec: SourceSpec, storage: dict) -> Source:
    """``table``'s source for one run, of the class registered for its format."""
    return source_class(table, spec).open(spark, table, spec, storage)


__all__ = [
    "SOURCES",
    "DeltaSource",
    "FileSource",
    "JdbcSource",
    "Source",
    "open_source",
    "source_class",
]
