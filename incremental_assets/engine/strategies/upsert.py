"""``upsert`` (SCD type 1): a row replaces the target's row of the same key only if it is
newer by the watermark (ties broken by the row hash)."""

from __future__ import annotations

from incremental_assets.engine.strategies.base import Strategy


class Upsert(Strategy):
    kind = "upsert"
