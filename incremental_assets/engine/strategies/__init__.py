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
from incremental_assets.engine.transforms import LATEST_ROW_HASH
from incremental_assets.specs import TableSpec

_BY_KIND: dict[str, type[Strategy]] = {s.kind: s for s in (Append, Upsert, Cdc, Snapshot, Scd2)}


def strategy_for(spec: TableSpec, row_hash: int = LATEST_ROW_HASH) -> Strategy:
    """The strategy of ``spec`` (by ``strategy.kind``), hashing rows as ``row_hash`` says
    (the target's way: ``transforms.row_hash_version`` of its schema)."""
    return _BY_KIND[spec.strategy.kind](spec, row_hash)


__all__ = ["Staged", "Strategy", "strategy_for"]
