"""``append``: a key not yet in the target is inserted; later versions of existing keys
are ignored (insert-only sources, such as event logs)."""

from __future__ import annotations

from incremental_assets.engine.strategies.base import Strategy


class Append(Strategy):
    kind = "append"
