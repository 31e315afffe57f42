"""SCD type 2: the versions of each key, recomputed from every change seen for it.

A history target holds one row per version of a key with ``valid_from``, ``valid_to``
(exclusive; null while current) and ``is_current``. Versions are derived from change
events (a row's values at an effective time, or a delete):

- events of a key are ordered by their effective time; at one effective time one event
  stands (a delete first, then the highest watermark, then the highest row hash);
- consecutive events with the same tracked values form one version, which holds the
  values of its newest event (so a change to untracked columns updates it in place);
- a version ends where the next version or a delete begins.

Every change is also appended to a log beside the target (``<target>__changes``). A run
recomputes the history of the keys it touches from their logged events plus its own, and
stages only the versions that differ from what the target holds: a late change lands in
history where it belongs, a replay writes nothing, and any arrival order converges. A run
whose events all take effect after every logged one, when no logged append awaits a
commit, reads no logged event: its events only continue each key's newest version
(``later_changes``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    AtomicType,
    DataType,
    NullType,
    StructField,
    StructType,
    VariantType,
)

from incremental_assets.engine.changes import OP
from incremental_assets.engine.snapshots import CHANGE
from incremental_assets.engine.transforms import KEY_RANGE, ROW_HASH, quote

_DELETE, _STATE, _RANK = "_ia_is_delete", "_ia_state", "_ia_rank"
# The start of a version the table holds, carried into a recomputation as its key's first
# event (standing for the version's newest event: ``later_changes``).
_SINCE = "_ia_since"
_STARTS, _ENDS = "_ia_starts", "_ia_ends"
# The comparison with the table: a held version's columns, prefixed, and which side holds it.
_HELD, _HELD_ROW, _RECOMPUTED = "_ia_held_", "_ia_held", "_ia_recomputed"


@dataclass(frozen=True)
class HistoryColumns:
    keys: tuple[str, ...]
    effective: str  # timestamp that places a change in history (valid_from)
    order: str  # the watermark: orders events that share an effective time
    tracked: tuple[str, ...]
    valid_from: str = "valid_from"
    valid_to: str = "valid_to"
    is_current: str = "is_current"

    @property
    def validity(self) -> tuple[str, str, str]:
        return (self.valid_from, self.valid_to, self.is_current)

    @property
    def identity(self) -> list[str]:
        """What identifies a version: the keys and its start."""
        return [*self.keys, self.valid_from]


def default_tracked(columns: Sequence[str], untracked: Sequence[str]) -> tuple[str, ...]:
    """Every business column but ``untracked`` (keys and the columns that change with every
    event: the effective time, watermark and partition column) and the loader's own."""
    skip = {*untracked, OP, CHANGE, ROW_HASH}
    return tuple(c for c in columns if c not in skip and not c.startswith("_ia_"))


Stage = Callable[[DataFrame, str], DataFrame]
Shuffle = Callable[[DataFrame], DataFrame]


def history_changes(
    events: DataFrame,
    logged: DataFrame | None,
    stored: DataFrame | None,
    columns: HistoryColumns,
    stage: Stage = lambda rows, _name: rows,
    one_file: bool = False,
) -> tuple[DataFrame, DataFrame]:
    """The staged change set for the target, and the events new to the log.

    ``events`` are this run's change rows (business columns, ``_ia_row_hash``, ``_ia_op``);
    ``logged`` the change log's and ``stored`` the target's rows of the keys ``events``
    touch (None when absent; rows of other keys would be taken as history the run
    removes). The change set holds the target's columns plus ``_ia_op`` ('U' write the
    version, 'D' remove it) and ``_ia_change`` (open, close, update, remove).

    ``stage(rows, name)`` materializes an intermediate result that later steps read more
    than once ("new_changes": the new events, in key order, as the log keeps them) and
    returns it read back (or, where the caller derives them again for the log's append,
    only counts them as they pass). The touched keys' recomputed history is read once, by the
    comparison with ``stored`` (one full join on each version's identity).

    A first load with no log to compare with has ``first_events`` and
    ``first_versions`` instead.

    ``one_file``: the new events are few, so they are sorted in one partition; else they
    are shuffled into ranges of the keys (Spark samples them first), so that each file
    the log's append writes holds a narrow range of keys.
    """
    event_id = _event_id(columns)
    fresh = events.dropDuplicates(event_id)
    if logged is not None:
        fresh = fresh.join(logged.select(*event_id), on=event_id, how="left_anti")
    fresh = new_events(fresh, columns, stage, one_file)
    every = logged.unionByName(fresh, allowMissingColumns=True) if logged is not None else fresh
    return _difference(_by_key_versions(every, columns), stored, columns), fresh


def later_changes(
    events: DataFrame,
    latest: DataFrame,
    columns: HistoryColumns,
    stage: Stage = lambda rows, _name: rows,
    one_file: bool = False,
) -> tuple[DataFrame, DataFrame]:
    """``history_changes`` of events that all take effect after every logged event, with
    a table whose versions are those of the logged events (``ChangeLog.precedes``): the
    log is not read.
    No event is in it, and the events only continue each key's newest version, as the
    table holds it (``latest``, from ``latest_versions``): that version is carried in as
    its key's first event (keeping its start), a delete after it where it was closed; the
    older versions stay as they are. The change set is then the same as a recomputation
    from the whole log would give."""
    fresh = new_events(events, columns, stage, one_file, deduplicate=True)
    every = _carried(latest, columns).unionByName(fresh, allowMissingColumns=True)
    return _difference(_by_key_versions(every, columns), latest, columns), fresh


def latest_versions(stored: DataFrame, columns: HistoryColumns) -> DataFrame:
    """Each key's newest version among ``stored`` (the one with the latest start)."""
    keys = list(columns.keys)
    others = [c for c in stored.columns if c not in keys]
    values = F.struct(*[F.col(quote(c)) for c in others])
    newest = F.max_by(values, F.col(quote(columns.valid_from)))
    return (
        stored.groupBy(*[F.col(quote(k)) for k in keys])
        .agg(newest.alias(_SINCE))
        .select(*[F.col(quote(k)) for k in keys], *[F.col(_SINCE)[c].alias(c) for c in others])
    )


def _carried(latest: DataFrame, columns: HistoryColumns) -> DataFrame:
    """The table's newest versions as events: each at its newest event's time, with its
    values and its start (``_SINCE``); a closed one (its key deleted, since no version
    follows it) with the delete that closed it, at its end."""
    valid_from, valid_to = columns.valid_from, columns.valid_to
    held = [c for c in latest.columns if c not in columns.validity]
    ended = F.col(quote(valid_to))
    as_events = latest.select(
        *[F.col(quote(c)) for c in held],
        F.lit("U").alias(OP),
        F.col(quote(valid_from)).alias(_SINCE),
    )
    deletes = latest.filter(ended.isNotNull()).select(
        *[F.col(quote(k)) for k in columns.keys],
        ended.alias(columns.effective),
        F.lit("D").alias(OP),
    )
    return as_events.unionByName(deletes, allowMissingColumns=True)


def new_events(
    fresh: DataFrame,
    columns: HistoryColumns,
    stage: Stage = lambda rows, _name: rows,
    one_file: bool = False,
    deduplicate: bool = False,
) -> DataFrame:
    """The events new to the log, in key order (one partition when ``one_file``, else
    ranges of the keys), as the log's append writes them; ``stage`` stages them as
    "new_changes" where the append reads them back. With
    ``deduplicate``, each event once, deduplicated within those partitions (each holds
    all of a key's events: no shuffle of its own)."""
    key_columns = [F.col(quote(k)) for k in columns.keys]
    fresh = fresh.repartition(1) if one_file else fresh.repartitionByRange(*key_columns)
    if deduplicate:
        fresh = fresh.dropDuplicates(_event_id(columns))
    return stage(fresh.sortWithinPartitions(*key_columns), "new_changes")


def _by_key_versions(events: DataFrame, columns: HistoryColumns) -> DataFrame:
    """``versions`` of events shuffled by key first: every step then reads the same
    partitions, in one sort (its first window alone would shuffle by key and time)."""
    return versions(events.repartition(*[F.col(quote(k)) for k in columns.keys]), columns)


def first_events(events: DataFrame, columns: HistoryColumns) -> DataFrame:
    """A first load's events as its change log keeps them: each once, in key order.
    ``events`` arrive shuffled into ranges of the first key (engine/spark/key_ranges.py):
    the range (where there is a ``KEY_RANGE`` column) is a function of the first key, so
    deduplicating within it needs no shuffle (nor does it within Spark's own ranges)."""
    keys = [F.col(quote(k)) for k in columns.keys]
    within = [KEY_RANGE] if KEY_RANGE in events.columns else []
    fresh = events.dropDuplicates([*_event_id(columns), *within]).drop(KEY_RANGE)
    return fresh.sortWithinPartitions(*keys)


def first_versions(logged: DataFrame, columns: HistoryColumns, ranges: Shuffle) -> DataFrame:
    """A first load's change set: the versions its events (``logged``: ``first_events``,
    as written, or read back from the log) imply, every one opened, computed in one
    shuffle into the key ranges ``ranges`` makes, where they stay for the write of the
    table they create."""
    ranged = ranges(logged)
    within = [KEY_RANGE] if KEY_RANGE in ranged.columns else []
    return _difference(versions(ranged, columns, within=within), None, columns)


def _event_id(columns: HistoryColumns) -> list[str]:
    """What tells one event from another (the same values at another time are another
    event: a snapshot's row hash leaves the snapshot time out)."""
    keys = list(columns.keys)
    return list(dict.fromkeys([*keys, columns.effective, columns.order, ROW_HASH, OP]))


def versions(events: DataFrame, columns: HistoryColumns, within: Sequence[str] = ()) -> DataFrame:
    """The history the events imply: business columns, row hash and validity columns.
    ``within``: columns the events are already shuffled on, each a function of the keys
    (a key range): every per-key step is made within them, with no shuffle of its own;
    they are left out of the result.

    One sort orders each key's events by time, and every later step reads them in that
    order: a version is a run of events in the same state (deleted, or the same tracked
    values), and holds the values of its last event; it starts at its first event's time
    and ends at the next run's."""
    keys = [F.col(quote(k)) for k in (*columns.keys, *within)]
    effective, order = F.col(quote(columns.effective)), F.col(quote(columns.order))
    same_time = Window.partitionBy(*keys, effective).orderBy(
        F.col(_DELETE).desc(), order.desc(), F.col(ROW_HASH).desc()
    )
    by_time = Window.partitionBy(*keys).orderBy(effective)
    running = by_time.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    tracked = F.struct(*[_comparable(events.schema[c]) for c in columns.tracked])
    state = F.struct(F.col(_DELETE).alias("deleted"), F.when(~F.col(_DELETE), tracked))
    previous, following = F.lag(F.col(_STATE)).over(by_time), F.lead(F.col(_STATE)).over(by_time)
    first_of_run = previous.isNull() | ~previous.eqNullSafe(F.col(_STATE))
    last_of_run = following.isNull() | ~following.eqNullSafe(F.col(_STATE))
    valid_from, valid_to = columns.valid_from, columns.valid_to
    # A carried version (``later_changes``) starts where the table has it start.
    start = F.coalesce(F.col(_SINCE), effective) if _SINCE in events.columns else effective
    runs = (
        events.withColumn(_DELETE, F.col(OP) == "D")
        .withColumn(_RANK, F.row_number().over(same_time))
        .filter(F.col(_RANK) == 1)  # one event at a time: a delete, then the newest
        .withColumn(_STATE, state)
        .withColumn(_STARTS, F.when(first_of_run, start))
        .withColumn(_ENDS, last_of_run)
        .withColumn(valid_to, F.lead(effective).over(by_time))
        .withColumn(valid_from, F.max(F.col(_STARTS)).over(running))
    )
    values = [c for c in events.columns if c not in (*columns.keys, OP, _SINCE, *within)]
    return runs.filter(F.col(_ENDS) & ~F.col(_DELETE)).select(
        *[F.col(quote(k)) for k in columns.keys],
        *[F.col(quote(c)) for c in values],
        F.col(quote(valid_from)),
        F.col(quote(valid_to)),
        F.col(quote(valid_to)).isNull().alias(columns.is_current),
    )


def _comparable(field: StructField) -> Column:
    """A tracked column as its state compares it: as it is, or as JSON text where Spark
    cannot compare its type (a map, a variant)."""
    column = F.col(quote(field.name))
    return column if _orderable(field.dataType) else F.to_json(column).alias(field.name)


def _orderable(data_type: DataType) -> bool:
    if isinstance(data_type, StructType):
        return all(_orderable(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return _orderable(data_type.elementType)
    return isinstance(data_type, (AtomicType, NullType)) and not isinstance(data_type, VariantType)


def _difference(
    recomputed: DataFrame, stored: DataFrame | None, columns: HistoryColumns
) -> DataFrame:
    """The versions to write (recomputed ones the table does not hold as they are) and to
    remove (held ones history no longer has), in one full join on each version's
    identity: a removed version keeps the values the table holds."""
    if stored is None:
        return recomputed.withColumn(OP, F.lit("U")).withColumn(CHANGE, F.lit("open"))
    identity = columns.identity
    kept = [c for c in stored.columns if c not in identity]
    held = stored.select(
        *[F.col(quote(c)) for c in identity],
        *[F.col(quote(c)).alias(_HELD + c) for c in kept],
        F.lit(True).alias(_HELD_ROW),
    )
    joined = recomputed.withColumn(_RECOMPUTED, F.lit(True)).join(held, on=identity, how="full")
    is_new, is_held = F.col(_RECOMPUTED).isNotNull(), F.col(_HELD_ROW).isNotNull()
    valid_to, held_to = F.col(quote(columns.valid_to)), F.col(quote(_HELD + columns.valid_to))
    same = (F.col(quote(_HELD + ROW_HASH)) == F.col(ROW_HASH)) & held_to.eqNullSafe(valid_to)
    unchanged = is_new & is_held & F.coalesce(same, F.lit(False))

    def value(name: str) -> Column:
        if name in identity or name not in kept:
            return F.col(quote(name))
        return F.when(is_new, F.col(quote(name))).otherwise(F.col(quote(_HELD + name)))

    closes = valid_to.isNotNull() & held_to.isNull()
    change = (
        F.when(~is_new, F.lit("remove"))
        .when(~is_held, F.lit("open"))
        .when(closes, F.lit("close"))
        .otherwise(F.lit("update"))
    )
    return joined.filter(~unchanged).select(
        *[value(c).alias(c) for c in recomputed.columns],
        F.when(is_new, F.lit("U")).otherwise(F.lit("D")).alias(OP),
        change.alias(CHANGE),
    )
