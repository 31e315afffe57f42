"""What one refresh of a declared layer did."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

WINDOWS_LISTED = 1000


@dataclass(frozen=True)
class LayerResult:
    """``upstream_from``: the upstream version covered before (-1: none); ``upstream_to``:
    the version covered now; ``rows_in``: upstream rows read (those whose keys changed);
    ``rows_merged``: layer rows inserted, updated or deleted; ``version``: the layer's
    commit (None: nothing committed); ``changes_from``: how the changes were found;
    ``windows``: an aggregate layer's windows recomputed (their starts, UTC; at most
    ``WINDOWS_LISTED``, the earliest)."""

    upstream_from: int
    upstream_to: int
    rows_in: int = 0
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    version: int | None = None
    changes_from: str = "none"
    groups_recomputed: int = 0
    windows: tuple[datetime, ...] = ()

    @property
    def rows_merged(self) -> int:
        return self.rows_inserted + self.rows_updated + self.rows_deleted

    @property
    def committed(self) -> bool:
        return self.version is not None
