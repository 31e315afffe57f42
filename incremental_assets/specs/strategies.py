"""How increments land, one model per strategy: a union keyed by ``kind``.

``strategy: upsert`` is shorthand for ``strategy: {kind: upsert}``.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


class _Strategy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AppendStrategy(_Strategy):
    """Insert keys not yet in the target; ignore later versions of existing keys."""

    kind: Literal["append"] = "append"


class UpsertStrategy(_Strategy):
    """Merge by key; the newest version by watermark wins (SCD type 1)."""

    kind: Literal["upsert"] = "upsert"


class CdcStrategy(_Strategy):
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
    operation: str | None = Field(
        default=None,
        description="Column holding the operation (default: op, or __$operation for sqlserver).",
    )
    deletes: Literal["hard", "soft"] = "hard"
    before: str = Field(default="before", description="Debezium: the before-image column.")
    after: str = Field(default="after", description="Debezium: the after-image column.")

    @property
    def operation_column(self) -> str:
        if self.operation:
            return self.operation
        return "__$operation" if self.encoding == "sqlserver" else "op"


def _shorthand(value: object) -> object:
    return {"kind": value} if isinstance(value, str) else value


StrategySpec = Annotated[
    Union[AppendStrategy, UpsertStrategy, CdcStrategy],
    BeforeValidator(_shorthand),
    Field(discriminator="kind"),
]
STRATEGY_KINDS = ("append", "upsert", "cdc")
