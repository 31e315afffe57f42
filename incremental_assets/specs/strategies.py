"""How increments land, one model per strategy: a union keyed by ``kind``.

``strategy: upsert`` is shorthand for ``strategy: {kind: upsert}``.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from incremental_assets.specs.names import ColumnList, ColumnName


class _Strategy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AppendStrategy(_Strategy):
    """Insert keys not yet in the target; ignore later versions of existing keys."""

    kind: Literal["append"] = "append"


class UpsertStrategy(_Strategy):
    """Merge by key; the newest version by watermark wins (SCD type 1)."""

    kind: Literal["upsert"] = "upsert"


class _DeletingStrategy(_Strategy):
    """Options shared by strategies that delete target rows: the guard against a source
    that vanished (a failed export, a truncated table) wiping the target."""

    max_delete_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Refuse a run that would delete (or soft-delete) more than this share of "
        "the target's live rows, before anything is written; 1.0 turns the guard off.",
    )


class CdcStrategy(_DeletingStrategy):
    """A change feed: rows carry an operation and a sequence (the watermark column).

    Per key the newest change by sequence wins; duplicates and out-of-order delivery are
    harmless. Hard deletes remove the row and keep a tombstone (keys and sequence) in a
    sibling Delta table ``<target>__tombstones``, so an older change replayed later cannot
    bring the row back; soft deletes keep the row with ``is_deleted`` and ``deleted_at``.
    """

    kind: Literal["cdc"] = "cdc"
    encoding: Literal["iud", "sqlserver", "debezium"] = Field(
        default="iud",
        description="'iud': I/U/D or INSERT/UPDATE/DELETE; 'sqlserver': __$operation codes "
        "1 delete, 2 insert, 3 update-before (ignored), 4 update-after; 'debezium': op "
        "c/u/d/r with before/after images.",
    )
    operation: ColumnName | None = Field(
        default=None,
        description="Column holding the operation (default: op, or __$operation for sqlserver).",
    )
    deletes: Literal["hard", "soft"] = "hard"
    before: ColumnName = Field(default="before", description="Debezium: the before-image column.")
    after: ColumnName = Field(default="after", description="Debezium: the after-image column.")

    @property
    def operation_column(self) -> str:
        if self.operation:
            return self.operation
        return "__$operation" if self.encoding == "sqlserver" else "op"


class SnapshotStrategy(_DeletingStrategy):
    """The source gives its full current state each run and has no change column.

    Each run reads the whole source, stamps it with the time it was taken, and compares it
    with the target by a hash of the tracked columns: only inserted, changed and vanished
    rows are written. Vanished rows are removed (hard) or kept with ``is_deleted`` and
    ``deleted_at`` (soft). The table has no ``watermark``: its cursor is the snapshot time.
    """

    kind: Literal["snapshot"] = "snapshot"
    deletes: Literal["hard", "soft"] = "hard"
    allow_empty: bool = Field(
        default=False,
        description="Accept an empty snapshot of a non-empty target (it deletes every row); "
        "by default such a run fails before writing, as a failed export looks just like it.",
    )
    tracked: ColumnList | None = Field(
        default=None,
        min_length=1,
        description="Columns whose change is a change (default: every column). A change "
        "to other columns alone is not written.",
    )


def _shorthand(value: object) -> object:
    return {"kind": value} if isinstance(value, str) else value


ChangesSpec = Annotated[
    Union[UpsertStrategy, CdcStrategy, SnapshotStrategy],
    BeforeValidator(_shorthand),
    Field(discriminator="kind"),
]


class Scd2Strategy(_Strategy):
    """A history target (SCD type 2): one row per version of a key, with validity columns.

    A change to a tracked column closes the current version and opens a new one; a change
    to untracked columns only updates the version in place; an unchanged row writes
    nothing; a delete closes the current version. A change older than the current version
    is placed in history where it belongs. Every change seen is also kept in a sibling
    Delta table ``<target>__changes``, so the history of a key is recomputed exactly
    whatever order its changes arrive in.
    """

    kind: Literal["scd2"] = "scd2"
    changes: ChangesSpec = Field(
        default_factory=UpsertStrategy,
        description="How the source delivers changes: upsert (new row versions, the "
        "default), cdc (a change feed with deletes) or snapshot (the full current state).",
    )
    tracked: ColumnList | None = Field(
        default=None,
        min_length=1,
        description="Columns whose change opens a new version (default: every column but "
        "the keys and the effective-time column).",
    )
    effective: ColumnName | None = Field(
        default=None,
        description="Timestamp column that says when a change took effect (valid_from); "
        "default: the watermark column when it is a timestamp, else partitioning.column.",
    )
    valid_from: ColumnName = "valid_from"
    valid_to: ColumnName = "valid_to"
    is_current: ColumnName = "is_current"

    @model_validator(mode="after")
    def _options_of_the_history(self) -> Scd2Strategy:
        given = self.changes.model_fields_set
        if "deletes" in given:
            raise ValueError(
                "changes.deletes does not apply to scd2: a delete closes the current "
                "version (the history keeps it); remove changes.deletes"
            )
        if "tracked" in given:
            raise ValueError("set tracked on the scd2 strategy itself, not under changes")
        names = [self.valid_from, self.valid_to, self.is_current]
        if len(set(names)) != 3:
            raise ValueError(f"valid_from, valid_to and is_current must differ; got {names}")
        return self


StrategySpec = Annotated[
    Union[AppendStrategy, UpsertStrategy, CdcStrategy, SnapshotStrategy, Scd2Strategy],
    BeforeValidator(_shorthand),
    Field(discriminator="kind"),
]
STRATEGY_KINDS = ("append", "upsert", "cdc", "snapshot", "scd2")
