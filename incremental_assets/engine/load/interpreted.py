"""Small runs run Spark interpreted: no code generation for their queries.

For each query Spark writes Java source for its operators (whole-stage code generation)
and expressions, compiles it with Janino, and the JVM compiles the new classes again as
they run hot. On the thousands of rows of a small run that costs more than it saves. A
day of the demo's ``orders`` (47 changed rows into a 1,000-row table, 23 Spark jobs),
measured here: in one warm process, runs alternating, a median step of 4.5 s
interpreted against 5.1 s (6 pairs of 7 faster); a whole ``dagster asset materialize``
in a fresh process, 28.7 s against 31.7 s. On more rows generated code wins, the more so
where a run hashes and merges them: a filter and aggregate of 1M rows (76 MB) took 0.75 s
with it and 1.0-1.1 s without; an upsert of 50,000 rows into 1M (60 MiB of files) 5.0 s
against 9.5 s.

So a run whose source and target files total at most ``BELOW`` bytes runs interpreted
from its probe's first read of the source to its end (a landing run: its new files and
bronze, from their first read); a larger one, or one whose source size is unknown (a
database: Spark receives only the rows the query returns), keeps code generation. A
session that sets either key itself (``spark.conf`` in the tables file) keeps its own
choice for every run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.spark import runtime_conf, session_slots

WHOLE_STAGE = "spark.sql.codegen.wholeStage"
# Whole-stage code generation off, and expressions evaluated by Spark's interpreted
# projections and predicates instead of generated classes.
SETTINGS = {
    WHOLE_STAGE: "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# At most this many bytes of source and target files: interpreted (see above). Measured
# on upserts of 10% of a table (benchmarks/incremental_vs_full.py, both ways, twice): at
# about 2 and 4 MiB of files level, at 7.5 MiB 0.8 s slower interpreted, at 60 MiB 4.5 s
# (9.5 s against 5.0 s, the engine's reload of the same table 14 s against 7 s).
BELOW = 4 * 1024 * 1024


def is_small(source_bytes: int | None, target_bytes: Callable[[], int]) -> bool:
    """Whether the source's files (None: unknown) and the target's (asked only when the
    source's leave room) total at most ``BELOW`` bytes."""
    if source_bytes is None or source_bytes > BELOW:
        return False
    return source_bytes + target_bytes() <= BELOW


def table_bytes(table: DeltaTable | None) -> int:
    """The live files' bytes of a Delta table (0 for none yet), from its log."""
    return delta_io.bytes_holding(table, None) if table is not None else 0


@contextmanager
def interpreted(spark: SparkSession, small: bool) -> Iterator[bool]:
    """Within the block, ``spark`` runs interpreted when ``small`` and the session sets
    neither key itself; yields whether the block's queries run without whole-stage code
    generation (a session's own setting included). Settings Spark refuses leave the run
    on code generation; a failed reset taints the session (through Spark Connect no later
    process takes it) and never hides the block's own error. Not under the commit's
    session lock: another thread's run in the same session may run interpreted or not
    meanwhile, which changes its speed, never its rows."""
    before = runtime_conf.get_many(spark, SETTINGS)
    if any(value is not None for value in before.values()):
        yield str(before[WHOLE_STAGE]).lower() == "false"  # the session's own choice
        return
    if not small:
        yield False
        return
    try:
        runtime_conf.set_many(spark, SETTINGS)
        accepted = True
    except Exception:
        accepted = False  # a cluster that refuses them: the run keeps code generation
    if not accepted:
        _reset(spark)
        yield False
        return
    try:
        yield True
    except BaseException:
        _reset(spark)
        raise
    try:
        runtime_conf.unset_many(spark, list(SETTINGS))
    except BaseException:
        session_slots.taint()
        raise


def _reset(spark: SparkSession) -> None:
    """Unset the settings as far as Spark lets it; taint the session when it does not."""
    try:
        runtime_conf.unset_many(spark, list(SETTINGS))
    except Exception:
        session_slots.taint()
