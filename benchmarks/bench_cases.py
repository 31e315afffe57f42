"""What ``incremental_vs_full.py`` loads: source scenarios and the strategy cases on them.

A **scenario** builds a source of N rows with pyarrow and delta-rs, and increments that
change it the way such a source changes (round after round, for the repeated-runs
measurement):

- ``orders``: an operational table updated in place (a delta-rs merge); the increment
  updates recent orders and inserts new ones;
- ``orders_feed``: the change feed of the same orders (I/U/D events, a log sequence number
  ``lsn``), appended to; the increment mixes updates, inserts and deletes, with some keys
  changed twice and some events delivered twice;
- ``events``: the orders as an append-only table; the increment appends new events.

A **case** is a table spec's strategy on a scenario, with the counts its incremental run
must report. The cases of one scenario share its source at each size. To add a strategy,
add a ``Case`` to ``CASES``; for example an SCD2 history fed by the change feed::

    Case(
        "scd2",
        ORDERS_FEED,  # or ORDERS, for SCD2 fed by upsert-style rows
        {"kind": "scd2", "changes": {"kind": "cdc"}},  # the spec's strategy, as in YAML
        expect=None,  # or a function of the Increment: (inserted, updated, deleted)
        note="...",
    )

and ``--cases scd2`` runs it. The hand-written baselines (``contenders.py``) follow the
case's ``kind``. A case's incremental target is checked against the engine's full reload
of the same source (row counts; row by row with ``--verify``) unless
``reload_equal=False`` (SCD2 fed by ``ORDERS``, whose source keeps no history).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from incremental_assets.specs import TableSpec

UTC = timezone.utc
HISTORY_START = datetime(2024, 1, 1, tzinfo=UTC)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ORDERS_PER_DAY = 200_000  # 20M rows span 100 days of history
STEP_US = 86_400_000_000 // ORDERS_PER_DAY  # created_at spacing between consecutive orders
MAX_UPDATE_LAG_US = 2 * 3_600_000_000  # a row's updated_at trails its created_at by < 2h
RECENT_ROWS = 200_000  # updates and deletes hit orders among the last this many
INCREMENT_SPAN_US = 10 * 60_000_000  # the increment is stamped within 10 minutes
ROUND_US = 3_600_000_000  # a later round's increment is stamped an hour after the one before
STATUSES = pa.array(["placed", "paid", "packed", "shipped", "delivered", "cancelled"])
SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("customer_id", pa.int64()),
        ("status", pa.string()),
        ("amount", pa.float64()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
FEED_SCHEMA = SCHEMA.append(pa.field("op", pa.string())).append(pa.field("lsn", pa.int64()))
HISTORY_START_US = (HISTORY_START - _EPOCH) // timedelta(microseconds=1)


# --- time helpers -----------------------------------------------------------------------


def instant(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def day_floor(value: datetime) -> datetime:
    return value.replace(hour=0, minute=0, second=0, microsecond=0)


def day_after(value: datetime) -> datetime:
    return day_floor(value) + timedelta(days=1)


# --- rows -------------------------------------------------------------------------------


def _random(n: int, seed: int) -> pa.Array:
    return pc.random(n, initializer=seed)


def _scaled_int(n: int, seed: int, high: int) -> pa.Array:
    """n pseudo-random integers in [0, high)."""
    return pc.floor(pc.multiply(_random(n, seed), float(high))).cast(pa.int64())


def _timestamps(micros: pa.Array) -> pa.Array:
    return micros.cast(pa.timestamp("us", tz="UTC"))


def _created_us(order_ids: pa.Array) -> pa.Array:
    return pc.add(pc.multiply(pc.subtract(order_ids, 1), STEP_US), HISTORY_START_US)


def orders_chunk(first_id: int, n: int, seed: int, updated_us: pa.Array | None = None) -> pa.Table:
    """Orders ``first_id .. first_id + n - 1``; all columns built with Arrow compute."""
    ids = pa.array(range(first_id, first_id + n), pa.int64())
    created = _created_us(ids)
    if updated_us is None:
        updated_us = pc.add(created, _scaled_int(n, seed + 1, MAX_UPDATE_LAG_US))
    return pa.table(
        [
            ids,
            _scaled_int(n, seed + 2, 100_000),
            STATUSES.take(_scaled_int(n, seed + 3, len(STATUSES))),
            pc.round(pc.add(5.0, pc.multiply(_random(n, seed + 4), 495.0)), 2),
            _timestamps(created),
            _timestamps(updated_us),
        ],
        schema=SCHEMA,
    )


def orders_with_ids(ids: list[int], updated_us: pa.Array, seed: int, rows: int) -> pa.Table:
    """Orders with the given ids and ``updated_at``; ids above ``rows`` are new orders,
    created at the moment they are first stamped."""
    id_array = pa.array(ids, pa.int64())
    created = pc.if_else(
        pc.greater(id_array, rows), updated_us, _created_us(id_array).cast(pa.int64())
    )
    chunk = orders_chunk(1, len(ids), seed, updated_us=updated_us)
    return chunk.set_column(0, "order_id", id_array).set_column(
        4, "created_at", _timestamps(created)
    )


def last_existing_update_us(rows: int) -> int:
    """An upper bound of every ``updated_at`` in the initial source."""
    return HISTORY_START_US + (rows - 1) * STEP_US + MAX_UPDATE_LAG_US


def increment_start_us(rows: int, round_: int = 0) -> int:
    """Increments are stamped from one hour after everything in the initial source; each
    later round an hour after the one before."""
    return last_existing_update_us(rows) + 3_600_000_000 + round_ * ROUND_US


def recent_ids(rows: int, n: int, rng: random.Random, what: str) -> list[int]:
    recent = min(RECENT_ROWS, rows)
    if n > recent:
        raise SystemExit(f"the increment has {n} {what}, more than the {recent} recent rows")
    return rng.sample(range(rows - recent + 1, rows + 1), n)


# --- scenarios --------------------------------------------------------------------------


@dataclass(frozen=True)
class Increment:
    """The rows an increment writes to the source, and what they amount to."""

    table: pa.Table
    first_us: int  # first and last change stamp (updated_at)
    last_us: int
    inserts: int  # new keys
    updated_keys: int  # existing keys with at least one update (and no delete)
    deletes: int  # existing keys deleted
    events: int  # rows written to the source, duplicates included
    description: str

    @property
    def key_range(self) -> tuple[int, int]:
        ids = self.table.column("order_id")
        return pc.min(ids).as_py(), pc.max(ids).as_py()


class Scenario(Protocol):
    name: str

    def spec(self, source: str, target: str, strategy: Any) -> TableSpec: ...

    def write_source(self, path: str, rows: int, chunk_rows: int) -> int: ...

    def increment(self, rows: int, size: int, seed: int, round_: int = 0) -> Increment: ...

    def apply(self, path: str, increment: Increment) -> str: ...


def _spec(source: str, target: str, strategy: Any, **fields: Any) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": "orders",
            "source": {"format": "delta", "path": source},
            "keys": ["order_id"],
            "strategy": strategy,
            "target": {"path": target},
            **fields,
        }
    )


def _written_files(path: str) -> int:
    return len(DeltaTable(path).file_uris())


class OrdersTable:
    """A mutable ``orders`` table, ``updated_at`` rising with ``order_id``, one ~1M-row file
    per chunk. Its increment: half updates to recent orders, half new orders."""

    name = "orders"

    def spec(self, source: str, target: str, strategy: Any) -> TableSpec:
        return _spec(
            source,
            target,
            strategy,
            watermark={"column": "updated_at", "kind": "timestamp", "lookback": "0s"},
            partitioning={"granularity": "daily", "start": HISTORY_START.date().isoformat()},
        )

    def write_source(self, path: str, rows: int, chunk_rows: int) -> int:
        for i, first in enumerate(range(1, rows + 1, chunk_rows)):
            chunk = orders_chunk(first, min(chunk_rows, rows + 1 - first), seed=1000 + 10 * i)
            write_deltalake(path, chunk, mode="append")
            del chunk
        return _written_files(path)

    def increment(self, rows: int, size: int, seed: int, round_: int = 0) -> Increment:
        """Round ``round_`` (0 first) of the increments: later rounds insert the orders
        after the earlier rounds' and update recent orders again."""
        updates = size // 2
        inserts = size - updates
        rng = random.Random(seed + round_)
        start_us = increment_start_us(rows, round_)
        updated_ids = sorted(recent_ids(rows, updates, rng, "updates"))

        def stamps(n: int, seed: int) -> pa.Array:
            return pc.add(_scaled_int(n, seed, INCREMENT_SPAN_US), start_us)

        changed = orders_with_ids(updated_ids, stamps(updates, seed + 11), seed + 10, rows)
        first_new = rows + 1 + round_ * size
        new_ids = list(range(first_new, first_new + inserts))
        new = orders_with_ids(new_ids, stamps(inserts, seed + 12), seed + 20, rows)
        return Increment(
            table=pa.concat_tables([changed, new]),
            first_us=start_us,
            last_us=start_us + INCREMENT_SPAN_US,
            inserts=inserts,
            updated_keys=updates,
            deletes=0,
            events=size,
            description=f"{updates:,} updates to recent rows, {inserts:,} inserts",
        )

    def apply(self, path: str, increment: Increment) -> str:
        """Update and insert in place, as an operational table changes."""
        metrics = (
            DeltaTable(path)
            .merge(
                increment.table,
                "t.order_id = s.order_id",
                source_alias="s",
                target_alias="t",
                # Not streamed: delta-rs then prunes the source's files by the keys.
                streamed_exec=False,
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        return (
            f"{metrics.get('num_target_rows_updated')} updated, "
            f"{metrics.get('num_target_rows_inserted')} inserted"
        )


class OrdersFeed:
    """The change feed of the orders (the row image after the change, ``op`` I/U/D and a
    sequence ``lsn``; deletes carry a row image too), an append-only Delta table.

    The initial feed is one insert per order (``lsn`` = ``order_id``). The increment of
    ``size`` changes is 40% updates of recent orders (5% of those keys updated twice),
    40% inserts of new orders, 20% deletes of other recent orders, in shuffled ``lsn``
    order, plus 5% of the events delivered a second time (same ``lsn``)."""

    name = "orders_feed"

    def spec(self, source: str, target: str, strategy: Any) -> TableSpec:
        return _spec(
            source,
            target,
            strategy,
            watermark={"column": "lsn", "kind": "id", "lookback": 0},
            partitioning={
                "granularity": "daily",
                "start": HISTORY_START.date().isoformat(),
                "column": "updated_at",
            },
        )

    def write_source(self, path: str, rows: int, chunk_rows: int) -> int:
        for i, first in enumerate(range(1, rows + 1, chunk_rows)):
            chunk = orders_chunk(first, min(chunk_rows, rows + 1 - first), seed=1000 + 10 * i)
            write_deltalake(path, _as_events(chunk, "I", chunk.column("order_id")), mode="append")
            del chunk
        return _written_files(path)

    def increment(self, rows: int, size: int, seed: int, round_: int = 0) -> Increment:
        """Round ``round_`` (0 first): later rounds insert orders after the earlier rounds'
        and carry sequence numbers after theirs."""
        update_events = size * 2 // 5
        inserts = size * 2 // 5
        deletes = size - update_events - inserts
        twice = update_events // 20
        updated_keys = update_events - twice
        rng = random.Random(seed + round_)
        existing = recent_ids(rows, updated_keys + deletes, rng, "updates and deletes")
        first_new = rows + 1 + round_ * size
        updated, deleted = existing[:updated_keys], existing[updated_keys:]
        events = (
            [(k, "U") for k in updated]
            + [(k, "U") for k in rng.sample(updated, twice)]
            + [(k, "I") for k in range(first_new, first_new + inserts)]
            + [(k, "D") for k in deleted]
        )
        rng.shuffle(events)  # lsn order: the order the changes happened in
        start_us = increment_start_us(rows, round_)
        step = INCREMENT_SPAN_US // len(events)
        stamps = pa.array([start_us + i * step for i in range(len(events))], pa.int64())
        images = orders_with_ids([k for k, _ in events], stamps, seed + 10, rows)
        first_lsn = rows + 1 + round_ * 2 * size
        lsn = pa.array(range(first_lsn, first_lsn + len(events)), pa.int64())
        table = _as_events(images, pa.array([op for _, op in events]), lsn)
        duplicates = size // 20
        again = table.take(pa.array(sorted(rng.sample(range(len(events)), duplicates))))
        return Increment(
            table=pa.concat_tables([table, again]),
            first_us=start_us,
            last_us=start_us + (len(events) - 1) * step,
            inserts=inserts,
            updated_keys=updated_keys,
            deletes=deletes,
            events=len(events) + duplicates,
            description=(
                f"{update_events:,} updates ({twice:,} keys twice), {inserts:,} inserts, "
                f"{deletes:,} deletes, {duplicates:,} duplicate events"
            ),
        )

    def apply(self, path: str, increment: Increment) -> str:
        write_deltalake(path, increment.table, mode="append")
        return f"{increment.events} change events appended"


def _as_events(rows: pa.Table, op: str | pa.Array, lsn: pa.Array) -> pa.Table:
    ops = pa.array([op] * rows.num_rows) if isinstance(op, str) else op
    return rows.append_column("op", ops).append_column("lsn", lsn).cast(FEED_SCHEMA)


class Events(OrdersTable):
    """An append-only table (the orders as events, never changed once written), one ~1M-row
    file per chunk. Its increment: new events only, appended."""

    name = "events"

    def increment(self, rows: int, size: int, seed: int, round_: int = 0) -> Increment:
        start_us = increment_start_us(rows, round_)
        first_new = rows + 1 + round_ * size
        stamps = pc.add(_scaled_int(size, seed + 12, INCREMENT_SPAN_US), start_us)
        new = orders_with_ids(list(range(first_new, first_new + size)), stamps, seed + 20, rows)
        return Increment(
            table=new,
            first_us=start_us,
            last_us=start_us + INCREMENT_SPAN_US,
            inserts=size,
            updated_keys=0,
            deletes=0,
            events=size,
            description=f"{size:,} new events appended",
        )

    def apply(self, path: str, increment: Increment) -> str:
        write_deltalake(path, increment.table, mode="append")
        return f"{increment.events} events appended"


ORDERS = OrdersTable()
ORDERS_FEED = OrdersFeed()
EVENTS = Events()


# --- cases ------------------------------------------------------------------------------

Counts = tuple[int, int, int]  # rows inserted, updated, deleted


@dataclass(frozen=True)
class Case:
    name: str
    scenario: Scenario
    strategy: Any  # the spec's ``strategy``, as in tables.yaml
    # The (inserted, updated, deleted) the incremental run must report; None: not checked.
    expect: Callable[[Increment], Counts] | None
    sizes: tuple[int, ...] = (1_000_000, 5_000_000, 20_000_000)  # default target sizes
    note: str = ""
    # Whether a full reload of the source rebuilds the incremental target exactly. Not
    # for a history (scd2) fed by a table that keeps only current rows: its reload lacks
    # the closed versions.
    reload_equal: bool = True
    # Whether dlt can apply the case's increment to a Delta table (dlt's Delta destination
    # has upsert, insert-only and append; not scd2).
    dlt: bool = True

    def spec(self, source: str, target: str) -> TableSpec:
        return self.scenario.spec(source, target, self.strategy)

    @property
    def kind(self) -> str:
        """upsert, cdc_hard, cdc_soft, scd2 or append: what the hand-written baselines do."""
        if isinstance(self.strategy, str):
            return self.strategy
        if self.strategy["kind"] == "cdc":
            return f"cdc_{self.strategy.get('deletes', 'hard')}"
        return self.strategy["kind"]


CASES: dict[str, Case] = {
    case.name: case
    for case in [
        Case(
            "upsert",
            ORDERS,
            "upsert",
            expect=lambda inc: (inc.inserts, inc.updated_keys, 0),
        ),
        Case(
            "cdc_hard",
            ORDERS_FEED,
            {"kind": "cdc", "deletes": "hard"},
            expect=lambda inc: (inc.inserts, inc.updated_keys, inc.deletes),
            note="deleted rows removed; tombstones written to <target>__tombstones",
        ),
        Case(
            "cdc_soft",
            ORDERS_FEED,
            {"kind": "cdc", "deletes": "soft"},
            # Soft deletes are updates of the row (is_deleted, deleted_at).
            expect=lambda inc: (inc.inserts, inc.updated_keys + inc.deletes, 0),
            note="deleted rows kept with is_deleted (counted as updates)",
        ),
        Case(
            "scd2",
            ORDERS_FEED,
            {"kind": "scd2", "changes": {"kind": "cdc"}},
            expect=None,
            note="history of the feed: every change a version (valid_from, valid_to, "
            "is_current); the change log in <target>__changes",
            dlt=False,
        ),
        Case(
            "append",
            EVENTS,
            "append",
            expect=lambda inc: (inc.inserts, 0, 0),
            note="insert-only events; a key seen before is ignored",
        ),
    ]
}
