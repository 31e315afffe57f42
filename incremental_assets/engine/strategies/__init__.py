"""How increments land: one module per strategy, behind one interface (``base.Strategy``),
picked in one place (``strategy_for``).

All strategies are idempotent and order-independent, so re-running a window, replaying a
backfill or loading windows out of order converges to the same table. Adding a strategy
means a new module here plus its spec model (``specs/strategies.py``).

Example:
    >>> strategy_for(spec).merge_plan()  # doctest: +SKIP
"""

from __future__ import annotations

from incremental_assets.engine.strategies.append import Append
from incremental_assets.engine.strategies.base import Staged, Strategy
from incremental_assets.engine.strategies.cdc import Cdc
from incremental_assets.engine.strategies.scd2 import Scd2
from incremental_assets.engine.strategies.snapshot import Snapshot
from incremental_assets.engine.strategies.upsert import Upsert
from incremental_assets.specs import TableSpec

_BY_KIND: dict[str, type[Strategy]] = {s.kind: s for s in (Append, Upsert, Cdc, Snapshot, Scd2)}


def strategy_for(spec: TableSpec) -> Strategy:
    """The strategy of ``spec`` (by ``strategy.kind``)."""
    return _BY_KIND[spec.strategy.kind](spec)


__all__ = ["Staged", "Strategy", "strategy_for"]
