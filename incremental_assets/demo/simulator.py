"""A source simulator: an operational ``orders`` table, an insert-only ``events`` log and a
``customers`` change feed.

Each round writes one simulated day, the way real sources misbehave:

- orders (a Delta table, updated in place like a database table, or with the demo's
  ``--postgres`` switch a PostgreSQL table): new orders, status updates to orders of the
  last two days, a burst of rows sharing one timestamp (a batch import), rows that arrive
  late but inside the lookback, and rows that arrive later than any lookback (below the
  watermark: the next run reads them from the Delta commit that appended them; from
  PostgreSQL only a backfill of their day picks them up);
- events (Parquet files appended to a folder, ids increasing, zone-less timestamps written
  in Europe/Berlin wall-clock time): some events of the previous day arrive with new ids;
- customers (Parquet files of a CDC feed): inserts, updates, deletes, re-inserts, duplicated
  events, and events delivered a day late, out of order (loaded twice: as the current
  customers, and as their history);
- products (one Parquet file, rewritten each day: a nightly export of the whole table with
  no change column): price changes, new products, discontinued ones, and some that return;
- invoices (JSON-lines files dropped into a landing folder by point-of-sale systems,
  ``write_invoices``): a few files per day, one corrupt file in the first round, and from
  the second round on one late file for the first day;
- invoice CSV files (the project's first example: InvoiceID, CustomerID, InvoiceDate,
  TotalAmount; ``invoice_csv``, :mod:`invoice_csv`): one file a day for a streaming layer,
  from the second round on with late invoices inside and behind its watermark.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Protocol
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from incremental_assets.demo.invoice_csv import InvoiceCsvFeed
from incremental_assets.engine.spark.local_rows import local_rows
from incremental_assets.engine.transforms import quote

UTC = timezone.utc
EVENTS_ZONE = ZoneInfo("Europe/Berlin")

ORDERS_SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("customer_id", pa.int64()),
        ("status", pa.string()),
        ("amount", pa.decimal128(12, 2)),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
EVENTS_SCHEMA = pa.schema(
    [
        ("event_id", pa.int64()),
        ("event_time", pa.timestamp("us")),  # naive: Europe/Berlin wall clock
        ("user_id", pa.int64()),
        ("event_type", pa.string()),
    ]
)
CUSTOMERS_SCHEMA = pa.schema(
    [
        ("customer_id", pa.int64()),
        ("name", pa.string()),
        ("tier", pa.string()),
        ("op", pa.string()),
        ("lsn", pa.int64()),
        ("changed_at", pa.timestamp("us", tz="UTC")),
    ]
)
PRODUCTS_SCHEMA = pa.schema(
    [
        ("product_id", pa.int64()),
        ("name", pa.string()),
        ("category", pa.string()),
        ("price", pa.decimal128(10, 2)),
    ]
)
INVOICE_DDL = (
    "InvoiceNumber STRING, CreatedTime BIGINT, StoreID STRING, PosID STRING, "
    "CashierID STRING, CustomerType STRING, CustomerCardNo STRING, TotalAmount DOUBLE, "
    "NumberOfItems INT, PaymentMethod STRING, TaxableAmount DOUBLE, CGST DOUBLE, "
    "SGST DOUBLE, CESS DOUBLE, DeliveryType STRING, "
    "DeliveryAddress STRUCT<AddressLine: STRING, City: STRING, ContactNumber: STRING, "
    "PinCode: STRING, State: STRING>, "
    "InvoiceLineItems ARRAY<STRUCT<ItemCode: STRING, ItemDescription: STRING, "
    "ItemPrice: DOUBLE, ItemQty: INT, TotalValue: DOUBLE>>"
)


def random_invoice(
    rng: random.Random,
    number: str,
    day: datetime,
    stores: tuple[str, ...] = ("STR7188", "STR1534", "STR2629"),
    item_code=lambda _rng, i: f"I{i}",
) -> dict:
    """One point-of-sale invoice of ``day`` (midnight) in the domain's shape: a nested
    delivery address and 1-4 line items."""
    lines = []
    for i in range(rng.randint(1, 4)):
        price = round(rng.uniform(5, 200), 2)
        qty = rng.randint(1, 3)
        lines.append(
            {
                "ItemCode": item_code(rng, i),
                "ItemDescription": f"item {i}",
                "ItemPrice": price,
                "ItemQty": qty,
                "TotalValue": round(price * qty, 2),
            }
        )
    total = round(sum(line["TotalValue"] for line in lines), 2)
    created = day + timedelta(seconds=rng.randrange(86_400))
    return {
        "InvoiceNumber": number,
        "CreatedTime": int(created.timestamp() * 1000),
        "StoreID": rng.choice(list(stores)),
        "PosID": f"POS{rng.randrange(1, 9)}",
        "CashierID": f"C{rng.randrange(1, 30)}",
        "CustomerType": rng.choice(["PRIME", "NONPRIME"]),
        "CustomerCardNo": str(rng.randrange(10**9, 10**10)),
        "TotalAmount": total,
        "NumberOfItems": len(lines),
        "PaymentMethod": rng.choice(["CARD", "CASH", "UPI"]),
        "TaxableAmount": total,
        "CGST": round(total * 0.025, 2),
        "SGST": round(total * 0.025, 2),
        "CESS": 0.0,
        "DeliveryType": rng.choice(["TAKEAWAY", "HOME-DELIVERY"]),
        "DeliveryAddress": {
            "AddressLine": "1 Main St",
            "City": rng.choice(["Pune", "Mumbai", "Nagpur"]),
            "ContactNumber": "9000000000",
            "PinCode": "411001",
            "State": "MH",
        },
        "InvoiceLineItems": lines,
    }


STATUSES = ["placed", "paid", "packed", "shipped", "delivered", "cancelled"]
EVENT_TYPES = ["view", "click", "add_to_cart", "checkout"]


@dataclass
class RoundSummary:
    day: datetime
    orders_new: int
    orders_updated: int
    orders_burst: int
    orders_late: int
    orders_very_late: int
    events: int
    events_late: int
    changes: int = 0
    changes_deletes: int = 0
    changes_held_back: int = 0
    products: int = 0
    products_repriced: int = 0
    products_new: int = 0
    products_gone: int = 0


class OrdersSink(Protocol):
    """Where the orders table lives: new orders are inserted, updates carry ``order_id``,
    ``status`` and ``updated_at``."""

    def write_orders(self, inserts: list[dict], updates: list[dict]) -> None: ...


@dataclass
class DeltaOrders:
    """The orders table as a Delta table, updated in place by a merge, written by Spark's
    Delta Lake through ``spark`` (called at each write, so the session starts when the
    first day is written). Its change data feed is on, as on a table whose consumers must
    see rows changed below their watermark (docs/late-data.md)."""

    path: str
    spark: Callable[[], SparkSession]

    def write_orders(self, inserts: list[dict], updates: list[dict]) -> None:
        spark = self.spark()
        rows = local_rows(spark, inserts, ORDERS_SCHEMA)
        # Delta's SQL, not the DeltaTable API: it runs through Spark Connect too.
        table = f"delta.{quote(self.path)}"
        columns = ", ".join(f"{quote(f.name)} {f.dataType.simpleString()}" for f in rows.schema)
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {table} ({columns}) USING DELTA "
            "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"
        )
        rows.write.format("delta").mode("append").save(self.path)
        if updates:
            columns = ("order_id", "status", "updated_at")
            schema = pa.schema([ORDERS_SCHEMA.field(c) for c in columns])
            changes = local_rows(spark, [{c: r[c] for c in columns} for r in updates], schema)
            view = f"demo_order_updates_{uuid.uuid4().hex}"
            changes.createOrReplaceTempView(view)
            try:
                spark.sql(
                    f"MERGE INTO {table} AS t USING {view} AS s ON t.order_id = s.order_id "
                    "WHEN MATCHED THEN UPDATE SET t.status = s.status, "
                    "t.updated_at = s.updated_at"
                )
            finally:
                spark.catalog.dropTempView(view)


@dataclass
class SourceSimulator:
    """Writes the demo sources under ``root`` (``orders/``, ``events/``,
    ``customers_cdc/``); ``orders`` is where the orders go: ``DeltaOrders`` (the demo's
    default, given its Spark session by the demo's run) or a database table."""

    root: Path
    seed: int = 7
    new_orders: int = 2000
    updates: int = 500
    burst: int = 300
    late: int = 50
    very_late: int = 20
    events_per_day: int = 5000
    invoices_per_file: int = 40
    orders: OrdersSink | None = None

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._rng = random.Random(self.seed)
        self._next_order = 1
        self._next_event = 1
        self._orders_by_day: dict[datetime, list[int]] = {}
        self._days_written = 0
        self._lsn = 0
        self._customers: dict[int, bool] = {}  # id -> alive
        self._held_back: list[dict] = []
        self._products: dict[int, dict] = {}
        self._discontinued: dict[int, dict] = {}
        self._next_invoice = 0
        self.invoice_csv = InvoiceCsvFeed(Path(self.invoice_csv_path), self.seed)

    @property
    def orders_path(self) -> str:
        return str(self.root / "orders")

    @property
    def events_path(self) -> str:
        return str(self.root / "events")

    @property
    def customers_path(self) -> str:
        return str(self.root / "customers_cdc")

    @property
    def products_path(self) -> str:
        return str(self.root / "products")

    @property
    def invoices_path(self) -> str:
        return str(self.root / "invoices")

    @property
    def invoice_csv_path(self) -> str:
        return str(self.root / "invoice_headers")

    def write_invoices(self, day: datetime, round_number: int, first_day: datetime) -> dict:
        """Drop one round of invoice files: two files of ``day``, in round 1 a corrupt file,
        from round 2 on a late file of ``first_day``. Returns file name -> invoices (None
        for the corrupt file). Files are dated a minute back, so they have settled."""
        rng = random.Random(f"{self.seed}-invoices-{round_number}")
        folder = Path(self.invoices_path)
        folder.mkdir(parents=True, exist_ok=True)
        written: dict[str, int | None] = {}
        batches = [(day, f"pos-{day:%Y%m%d}-{n}.json") for n in (1, 2)]
        if round_number >= 2:
            batches.append((first_day, f"pos-{first_day:%Y%m%d}-late-r{round_number}.json"))
        for when, name in batches:
            rows = [self._invoice(rng, when) for _ in range(self.invoices_per_file)]
            self._drop(folder / name, "".join(json.dumps(r) + "\n" for r in rows))
            written[name] = len(rows)
        if round_number == 1:
            good = json.dumps(self._invoice(rng, day))
            self._drop(folder / f"pos-{day:%Y%m%d}-corrupt.json", good + '\n{"InvoiceNumber": \n')
            written[f"pos-{day:%Y%m%d}-corrupt.json"] = None
        return written

    def _drop(self, path: Path, text: str) -> None:
        path.write_text(text)
        stamp = datetime.now(UTC).timestamp() - 60
        os.utime(path, (stamp, stamp))

    def _invoice(self, rng: random.Random, day: datetime) -> dict:
        self._next_invoice += 1
        return random_invoice(
            rng,
            f"INV{self._next_invoice:07d}",
            day,
            item_code=lambda rng, i: f"{100 + rng.randrange(40)}-{i}",
        )

    def write_day(self, day: datetime) -> RoundSummary:
        """Write one simulated day (``day`` is midnight UTC)."""
        orders, counts = self._orders_for(day)
        self._upsert_orders(orders)
        events, late_events = self._events_for(day)
        Path(self.events_path).mkdir(parents=True, exist_ok=True)
        pq.write_table(events, f"{self.events_path}/events-{day:%Y%m%d}.parquet")
        feed, deletes, held = self._customer_changes(day)
        Path(self.customers_path).mkdir(parents=True, exist_ok=True)
        pq.write_table(feed, f"{self.customers_path}/changes-{day:%Y%m%d}.parquet")
        products, product_counts = self._products_export()
        Path(self.products_path).mkdir(parents=True, exist_ok=True)
        # The export replaces yesterday's: the folder only ever holds today's state.
        for old in Path(self.products_path).glob("*.parquet"):
            old.unlink()
        pq.write_table(products, f"{self.products_path}/products-{day:%Y%m%d}.parquet")
        return RoundSummary(
            day,
            *counts,
            events.num_rows,
            late_events,
            feed.num_rows,
            deletes,
            held,
            products.num_rows,
            *product_counts,
        )

    def _products_export(self) -> tuple[pa.Table, tuple[int, int, int]]:
        """Today's full product list: some prices change, a few products are discontinued
        (some of them come back later), new ones are added."""
        rng = self._rng
        repriced = new = gone = 0
        if self._products:
            for product in rng.sample(list(self._products.values()), 25):
                product["price"] = Decimal(rng.randint(100, 9999)) / 100
                repriced += 1
            for product_id in rng.sample(list(self._products), 5):
                self._discontinued[product_id] = self._products.pop(product_id)
                gone += 1
            for product_id in rng.sample(list(self._discontinued), min(2, len(self._discontinued))):
                self._products[product_id] = self._discontinued.pop(product_id)
        for _ in range(200 if not self._products else 10):
            product_id = len(self._products) + len(self._discontinued) + 1
            self._products[product_id] = {
                "product_id": product_id,
                "name": f"product {product_id}",
                "category": rng.choice(["books", "games", "tools", "garden"]),
                "price": Decimal(rng.randint(100, 9999)) / 100,
            }
            new += 1
        rows = sorted(self._products.values(), key=lambda p: p["product_id"])
        return pa.Table.from_pylist(rows, schema=PRODUCTS_SCHEMA), (repriced, new, gone)

    def _customer_changes(self, day: datetime) -> tuple[pa.Table, int, int]:
        """A CDC feed: inserts, updates, deletes, re-inserts of deleted customers, a few
        duplicated events, and some events held back to the next day's file (delivered out
        of order, with older sequence numbers)."""
        rows = []
        deletes = 0
        # Change times follow the log order (a CDC log is written as changes commit).
        stamps = iter(sorted(self._at(day) for _ in range(400)))
        for _ in range(400):
            alive = [c for c, a in self._customers.items() if a]
            gone = [c for c, a in self._customers.items() if not a]
            roll = self._rng.random()
            if roll < 0.45 or not alive:
                customer, op = len(self._customers) + 1, "I"
            elif roll < 0.85:
                customer, op = self._rng.choice(alive), "U"
            elif roll < 0.95 or not gone:
                customer, op = self._rng.choice(alive), "D"
            else:
                customer, op = self._rng.choice(gone), "I"  # re-insert after delete
            self._customers[customer] = op != "D"
            deletes += op == "D"
            self._lsn += 1
            rows.append(
                {
                    "customer_id": customer,
                    "name": None if op == "D" else f"customer {customer} v{self._lsn}",
                    "tier": None if op == "D" else self._rng.choice(["basic", "gold"]),
                    "op": op,
                    "lsn": self._lsn,
                    "changed_at": next(stamps),
                }
            )
        rows += self._rng.sample(rows, 10)  # duplicates
        held = set(self._rng.sample(range(len(rows)), 15))
        delivered = self._held_back + [r for i, r in enumerate(rows) if i not in held]
        self._held_back = [rows[i] for i in sorted(held)]
        return pa.Table.from_pylist(delivered, schema=CUSTOMERS_SCHEMA), deletes, len(held)

    def _at(self, day: datetime, start_hour: float = 0.0, end_hour: float = 24.0) -> datetime:
        seconds = self._rng.uniform(start_hour * 3600, end_hour * 3600 - 1)
        return (day + timedelta(seconds=seconds)).replace(microsecond=0)

    def _new_order(self, stamp: datetime) -> dict:
        order_id = self._next_order
        self._next_order += 1
        self._orders_by_day.setdefault(stamp.replace(hour=0, minute=0, second=0), []).append(
            order_id
        )
        return {
            "order_id": order_id,
            "customer_id": self._rng.randint(1, 5000),
            "status": "placed",
            "amount": Decimal(self._rng.randint(500, 50000)) / 100,
            "created_at": stamp,
            "updated_at": stamp,
        }

    def _orders_for(self, day: datetime) -> tuple[list[dict], tuple[int, ...]]:
        rows = [self._new_order(self._at(day)) for _ in range(self.new_orders)]
        # A batch import: many rows stamped with one and the same instant.
        burst_at = day + timedelta(hours=12)
        rows += [self._new_order(burst_at) for _ in range(self.burst)]
        updated = 0
        recent = [
            oid
            for d in (day - timedelta(days=1), day - timedelta(days=2))
            for oid in self._orders_by_day.get(d, [])
        ]
        for order_id in self._rng.sample(recent, min(self.updates, len(recent))):
            stamp = self._at(day)
            rows.append(
                {
                    "order_id": order_id,
                    "customer_id": None,  # filled from the current row below
                    "status": self._rng.choice(STATUSES[1:]),
                    "amount": None,
                    "created_at": None,
                    "updated_at": stamp,
                }
            )
            updated += 1
        late = very_late = 0
        if day - timedelta(days=1) in self._orders_by_day:
            # Late, inside a 2h lookback: stamped in the last hour of yesterday.
            for _ in range(self.late):
                rows.append(self._new_order(self._at(day - timedelta(days=1), 23, 24)))
                late += 1
        if day - timedelta(days=2) in self._orders_by_day:
            # Later than any lookback: stamped two days ago, mid-morning.
            for _ in range(self.very_late):
                rows.append(self._new_order(self._at(day - timedelta(days=2), 8, 10)))
                very_late += 1
        return rows, (self.new_orders + self.burst, updated, self.burst, late, very_late)

    def _upsert_orders(self, rows: list[dict]) -> None:
        if self.orders is None:
            raise ValueError("SourceSimulator needs orders=: DeltaOrders(...) or a database")
        self.orders.write_orders(
            [r for r in rows if r["customer_id"] is not None],
            [r for r in rows if r["customer_id"] is None],
        )

    def _events_for(self, day: datetime) -> tuple[pa.Table, int]:
        rows = []
        late = 0
        for _ in range(self.events_per_day):
            if self._days_written and self._rng.random() < 0.02:
                stamp = self._at(day - timedelta(days=1))
                late += 1
            else:
                stamp = self._at(day)
            rows.append(
                {
                    "event_id": self._next_event,
                    "event_time": stamp.astimezone(EVENTS_ZONE).replace(tzinfo=None),
                    "user_id": self._rng.randint(1, 5000),
                    "event_type": self._rng.choice(EVENT_TYPES),
                }
            )
            self._next_event += 1
        self._days_written += 1
        return pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA), late


def day(n: int, start: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> datetime:
    """Midnight UTC of the n-th simulated day (1-based)."""
    return start + timedelta(days=n - 1)
