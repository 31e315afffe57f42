"""The project's first example as a simulated source: CSV files of invoices
(``InvoiceID, CustomerID, InvoiceDate, TotalAmount``, with a header) dropped into a landing
folder, one a round, for the streaming layer ``invoice_totals_hourly`` (total amount per
customer per 1-hour window of InvoiceDate, 1-hour watermark).

Each round's file holds tens of invoices of the round's day and, from the second round
on, a few late invoices of the days before: some inside the watermark, which join a window
the query still holds (a customer's window that received an invoice before), and some
behind it, in windows the watermark has closed, which Spark drops. The feed keeps every row
it wrote and knows which of them were behind the watermark, by Spark's rule: a row is
dropped when its window ends at or before the watermark that the query's earlier runs left
(the latest InvoiceDate of the earlier rounds' files, minus the delay). In the first round
no watermark exists yet: nothing can be late.

Example:
    >>> feed = InvoiceCsvFeed(Path("data/source/invoice_headers"))  # doctest: +SKIP
    >>> hour = timedelta(hours=1)  # doctest: +SKIP
    >>> feed.write_round(day, window=hour, watermark=hour)  # doctest: +SKIP
    InvoiceCsvRound(file='invoices-20261121.csv', on_time=30, late_within=0, late_dropped=0)
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

UTC = timezone.utc
INVOICE_CSV_DDL = "InvoiceID STRING, CustomerID STRING, InvoiceDate TIMESTAMP, TotalAmount DOUBLE"
_HEADER = "InvoiceID,CustomerID,InvoiceDate,TotalAmount"


@dataclass(frozen=True)
class CsvInvoice:
    invoice_id: str
    customer_id: str
    invoice_date: datetime  # UTC
    total_amount: float


@dataclass(frozen=True)
class InvoiceCsvRound:
    """One round's file: its invoices of the day, and its late ones inside and behind the
    watermark."""

    file: str
    on_time: int
    late_within: int
    late_dropped: int


@dataclass
class InvoiceCsvFeed:
    """Writes the CSV invoice files into ``folder``; ``written`` holds every row, in the
    order written, ``dropped`` those behind the watermark when they arrived."""

    folder: Path
    seed: int = 7
    per_round: int = 30
    customers: int = 8
    late_within: int = 3
    late_behind: int = 2
    written: list[CsvInvoice] = field(default_factory=list)
    dropped: list[CsvInvoice] = field(default_factory=list)
    _numbered: int = field(default=0, init=False)

    def write_round(
        self, day: datetime, window: timedelta, watermark: timedelta
    ) -> InvoiceCsvRound:
        """Drop the file of ``day`` (midnight UTC): ``per_round`` invoices of the day, and
        late ones when an earlier round left a watermark. ``window`` and ``watermark``
        are the layer's, to know which late rows Spark drops."""
        rng = random.Random(f"{self.seed}-invoice-csv-{day:%Y%m%d}")
        # The watermark the query's runs so far leave: their latest InvoiceDate, minus the
        # delay (None before the first round).
        latest = max((r.invoice_date for r in self.written), default=None)
        mark = latest - watermark if latest is not None else None
        rows = [
            self._invoice(
                rng, rng.choice(self._customer_ids()), self._at(rng, day, timedelta(days=1))
            )
            for _ in range(self.per_round)
        ]
        late = [] if latest is None or mark is None else self._late(rng, latest, mark, window)
        rows += late
        behind = [r for r in rows if mark is not None and _window_end(r, window) <= mark]
        name = f"invoices-{day:%Y%m%d}.csv"
        self._drop(name, rows)
        self.written += rows
        self.dropped += behind
        return InvoiceCsvRound(name, self.per_round, len(late) - len(behind), len(behind))

    def _late(
        self, rng: random.Random, latest: datetime, mark: datetime, window: timedelta
    ) -> list[CsvInvoice]:
        """Invoices older than ``latest``: ``late_within`` in windows still open (each
        with the customer of an earlier invoice of that window, so it updates that
        window's total), ``late_behind`` in distinct windows the watermark ``mark``
        has passed (distinct groups: Spark counts each dropped row apart)."""
        open_rows = [r for r in self.written if _window_end(r, window) > mark]
        within = []
        for row in rng.sample(open_rows, min(self.late_within, len(open_rows))):
            start = _window_start(row.invoice_date, window)
            end = min(start + window, latest)
            within.append(self._invoice(rng, row.customer_id, self._at(rng, start, end - start)))
        closed = _window_start(mark, window)  # windows ending at or before it are final
        behind = [
            self._invoice(
                rng, rng.choice(self._customer_ids()), self._at(rng, closed - n * window, window)
            )
            for n in range(1, self.late_behind + 1)
        ]
        return within + behind

    def _customer_ids(self) -> list[str]:
        return [f"C{n:02d}" for n in range(1, self.customers + 1)]

    def _invoice(self, rng: random.Random, customer: str, when: datetime) -> CsvInvoice:
        self._numbered += 1
        return CsvInvoice(f"POS{self._numbered:06d}", customer, when, round(rng.uniform(5, 500), 2))

    @staticmethod
    def _at(rng: random.Random, start: datetime, span: timedelta) -> datetime:
        """A whole second in ``[start, start + span)``."""
        return start + timedelta(seconds=rng.randrange(max(1, int(span.total_seconds()))))

    def _drop(self, name: str, rows: list[CsvInvoice]) -> None:
        """Written under a hidden name, then renamed: a stream lists a file as soon as it
        appears and reads it once. Dated a minute back, so the landing table finds it
        settled."""
        self.folder.mkdir(parents=True, exist_ok=True)
        lines = [_HEADER] + [
            f"{r.invoice_id},{r.customer_id},{r.invoice_date:%Y-%m-%d %H:%M:%S},{r.total_amount}"
            for r in rows
        ]
        partial = self.folder / f".{name}.partial"
        partial.write_text("\n".join(lines) + "\n")
        stamp = datetime.now(UTC).timestamp() - 60
        os.utime(partial, (stamp, stamp))
        partial.rename(self.folder / name)


def hourly_totals(rows: list[CsvInvoice], window: timedelta) -> dict[tuple, float]:
    """The layer's rows computed from scratch: (customer, window start, window end) ->
    sum of TotalAmount (rounded to 6 decimals: a sum of doubles depends on its order)."""
    totals: dict[tuple, float] = defaultdict(float)
    for r in rows:
        start = _window_start(r.invoice_date, window)
        totals[(r.customer_id, start, start + window)] += r.total_amount
    return {k: round(v, 6) for k, v in totals.items()}


def _window_start(when: datetime, window: timedelta) -> datetime:
    """The start of the tumbling window holding ``when`` (windows start at multiples of
    their size since the epoch, as Spark's ``window``)."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return when - (when - epoch) % window


def _window_end(row: CsvInvoice, window: timedelta) -> datetime:
    return _window_start(row.invoice_date, window) + window
