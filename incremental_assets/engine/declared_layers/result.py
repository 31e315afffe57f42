"""What one refresh of a declared layer did."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from incremental_assets.engine.declared_layers.changes import UpstreamChanges
    from incremental_assets.engine.declared_layers.commit import Written

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

    @classmethod
    def of_commit(
        cls,
        since: int,
        changes: UpstreamChanges,
        rows_in: int,
        written: Written,
        groups_recomputed: int = 0,
        windows: tuple[datetime, ...] = (),
    ) -> LayerResult:
        """A refresh that read ``changes`` after version ``since`` and wrote ``written``
        (the covered version moves only when the layer committed)."""
        committed = written.version is not None
        return cls(
            upstream_from=since,
            upstream_to=changes.until if committed else since,
            rows_in=rows_in,
            rows_inserted=written.inserted,
            rows_updated=written.updated,
            rows_deleted=written.deleted,
            version=written.version,
            changes_from=changes.found_by,
            groups_recomputed=groups_recomputed,
            windows=windows if committed else (),
        )

    @property
    def rows_merged(self) -> int:
        return self.rows_inserted + self.rows_updated + self.rows_deleted

    @property
    def committed(self) -> bool:
        return self.version is not None
