"""The load engine: PySpark and Spark's Delta Lake (delta-rs reads logs only), no Dagster
import.

Cut by concept: ``sources`` (where rows come from), ``windows`` and ``watermarks`` (which
rows), ``strategies`` (how they land), ``delta_lake`` (every Delta read and write: state
and the exactly-once commit), ``load`` (one run, end to end).
"""

from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.errors import (
    ConcurrentLoadError,
    IncrementalLoadError,
    NullValuesError,
    SchemaMismatchError,
    SourceNotFoundError,
)
from incremental_assets.engine.load import LoadResult, run_load
from incremental_assets.engine.windows import LoadRequest

__all__ = [
    "ConcurrentLoadError",
    "DeltaTarget",
    "IncrementalLoadError",
    "LoadRequest",
    "LoadResult",
    "NullValuesError",
    "SchemaMismatchError",
    "SourceNotFoundError",
    "run_load",
]
