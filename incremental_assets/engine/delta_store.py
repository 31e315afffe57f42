"""The Delta target: its committed state (cursor, version) and the exactly-once commit.

The data of a run and its new cursor go into one Delta commit: the cursor as readable
commit metadata (``incremental_assets.*`` keys of the commit info) and as the version of
the application transaction ``incremental_assets/<table>``. The Delta log is the truth:
a run reads its starting cursor from it, never from the orchestrator.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from incremental_assets.engine import delta_io
from incremental_assets.engine.changes import OP
from incremental_assets.engine.errors import ConcurrentLoadError, TargetOwnedError
from incremental_assets.engine.merge_plan import MergePlan, matching
from incremental_assets.engine.transforms import quote
from incremental_assets.engine.unreadable import log_error
from incremental_assets.engine.watermarks import (
    ID_MIN,
    WatermarkKind,
    WatermarkValue,
    from_transaction_version,
    to_transaction_version,
)

META_PREFIX = "incremental_assets."
# Marks a commit that rewound or reset a table's cursor (``incremental-assets rewind``).
# It carries no ``incremental_assets.table`` key, so it is not taken for a load.
REWIND_KEY = f"{META_PREFIX}rewind"
_LOAD_KEY = f"{META_PREFIX}table"
# The transaction version that stands for "no cursor" after a reset: a Delta application
# transaction cannot be removed, only given a new version (the protocol lets it decrease).
NO_CURSOR = -(2**63)
# Above this many staged rows the merge streams its source (bounded memory) at the price
# of delta-rs's early file pruning, which needs the source's min/max up front.
_STREAM_ABOVE_ROWS = 2_000_000


def app_id(table: str) -> str:
    return f"incremental_assets/{table}"


def tiebreak_app_id(table: str) -> str:
    """A hybrid cursor's id part, committed in the same commit as its time part."""
    return f"incremental_assets/{table}#tiebreak"


@dataclass(frozen=True)
class TargetState:
    exists: bool
    version: int | None = None
    cursor: WatermarkValue | None = None
    schema: StructType | None = None
    last_load: dict[str, Any] = field(default_factory=dict)
    table: DeltaTable | None = None


@dataclass(frozen=True)
class CommitResult:
    committed: bool
    version: int | None
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    files_added: int = 0
    files_removed: int = 0
    created_table: bool = False
    cursor_only: bool = False


class DeltaTarget:
    """One table's Delta location and storage options (delta-rs ``storage_options``)."""

    def __init__(self, table: str, path: str, storage_options: Mapping[str, str] | None = None):
        self.table_name = table
        self.path = path
        self.storage_options = dict(storage_options or {})

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.path, storage_options=self.storage_options or None)

    def beside(self, suffix: str) -> DeltaTarget:
        """The sibling Delta table ``<target>__<suffix>``, with the same storage options."""
        return DeltaTarget(
            f"{self.table_name}__{suffix}",
            f"{self.path.rstrip('/')}__{suffix}",
            self.storage_options,
        )

    def open(self, version: int | None = None) -> DeltaTable:
        try:
            return DeltaTable(
                self.path, version=version, storage_options=self.storage_options or None
            )
        except DeltaError as exc:
            if not self.exists():
                raise
            raise log_error(self.table_name, self.path, exc) from None

    def state(self, kind: WatermarkKind) -> TargetState:
        if not self.exists():
            return TargetState(exists=False)
        table = self.open()
        txn = table.transaction_version(app_id(self.table_name))
        cursor = from_transaction_version(txn, kind) if txn not in (None, NO_CURSOR) else None
        if kind == "hybrid" and cursor is not None:
            tiebreak = table.transaction_version(tiebreak_app_id(self.table_name))
            cursor = (cursor, tiebreak if tiebreak is not None else ID_MIN)
        last_load = self.last_load(table)
        self._check_owner(last_load)
        return TargetState(
            exists=True,
            version=table.version(),
            cursor=cursor,
            schema=delta_io.spark_schema(table),
            last_load=last_load,
            table=table,
        )

    def _check_owner(self, last_load: Mapping[str, Any]) -> None:
        """A target holds one table's loads: one whose last load was another table's (two
        specs pointed at one location, or a table renamed) is refused, since its cursor
        and rows are that table's."""
        owner = last_load.get("table")
        if owner is not None and owner != self.table_name:
            raise TargetOwnedError(
                self.table_name,
                f"the Delta table at {self.path} holds the loads of table '{owner}' (last at "
                f"version {last_load.get('version')}); loading into it would mix the two "
                "tables' rows and cursors. Nothing was written.",
                f"give table '{self.table_name}' its own target.path, or, if it was renamed "
                f"from '{owner}', keep the name '{owner}'",
            )

    def loads(self, table: DeltaTable | None = None, limit: int | None = None) -> list[dict]:
        """This loader's commits, newest first, with their metadata and Delta metrics."""
        return self._commits((_LOAD_KEY,), table, limit)

    def rewinds(self, table: DeltaTable | None = None, limit: int | None = None) -> list[dict]:
        """Commits that rewound or reset the cursor, newest first (see ``record_rewind``)."""
        return self._commits((REWIND_KEY,), table, limit)

    def cursor_commits(
        self, table: DeltaTable | None = None, limit: int | None = None
    ) -> list[dict]:
        """Loads and rewinds, newest first, in one read of the history; a rewind's dict
        has the key ``rewind``."""
        return self._commits((_LOAD_KEY, REWIND_KEY), table, limit)

    def _commits(
        self, markers: tuple[str, ...], table: DeltaTable | None, limit: int | None
    ) -> list[dict]:
        table = table or self.open()
        out = []
        for commit in table.history(limit):
            if not any(marker in commit for marker in markers):
                continue
            meta = {
                k.removeprefix(META_PREFIX): v
                for k, v in commit.items()
                if k.startswith(META_PREFIX)
            }
            meta["version"] = commit.get("version")
            meta["timestamp"] = commit.get("timestamp")
            meta["operation"] = commit.get("operation")
            meta["operation_metrics"] = commit.get("operationMetrics") or {}
            out.append(meta)
        return out

    def record_rewind(
        self,
        state: TargetState,
        kind: WatermarkKind,
        cursor: WatermarkValue | None,
        metadata: Mapping[str, Any],
    ) -> int:
        """Set the cursor back to ``cursor`` (None: no cursor) in a commit of its own, with
        ``metadata`` (who, why) beside it; returns the new Delta version.

        The commit holds no data, only the application transaction(s) at their new, lower
        version. It is made against ``state``'s snapshot: a load that committed since, or
        commits meanwhile, touches the same transaction and makes one of the two fail.
        """
        assert state.table is not None
        custom = {f"{META_PREFIX}{k}": _plain(v) for k, v in metadata.items()}
        custom[REWIND_KEY] = self.table_name
        transactions = self._transactions(kind, cursor)
        state.table.create_write_transaction(
            actions=[],
            mode="append",
            schema=state.table.schema(),
            commit_properties=CommitProperties(
                custom_metadata=custom, app_transactions=transactions
            ),
        )
        return self.open().version()

    def last_load(self, table: DeltaTable) -> dict:
        # Most recent commits first; maintenance commits may sit between loads.
        for limit in (20, None):
            loads = self.loads(table, limit)
            if loads:
                return loads[0]
        return {}

    def to_spark(
        self,
        spark: SparkSession,
        version: int | None = None,
        holding: delta_io.KeySet | None = None,
    ) -> DataFrame:
        """The table's rows; with ``holding``, only from the files that may hold those keys
        (the caller still filters rows by key)."""
        table = self.open(version)
        if holding is None:
            return delta_io.read_files(spark, table)
        files = delta_io.files_holding(delta_io.live_files(table), holding)
        return delta_io.read_files(spark, table, files)

    def commit(
        self,
        state: TargetState,
        staged_path: str,
        plan: MergePlan,
        *,
        kind: WatermarkKind,
        cursor_before: WatermarkValue | None,
        cursor_after: WatermarkValue | None,
        metadata: Mapping[str, Any],
        partition_by: list[str],
        add_new_columns: bool,
    ) -> CommitResult:
        """Land the staged increment and the new cursor in one Delta commit.

        Writes nothing when no row changes and the cursor stays put.
        """
        properties = self._properties(kind, cursor_after, metadata)
        dataset = pads.dataset(staged_path, format="parquet")
        staged_rows = dataset.count_rows()
        columns = [n for n in dataset.schema.names if n not in plan.staged_only_columns]
        try:
            table = state.table
            if not state.exists:
                if staged_rows == 0 and cursor_after is None:
                    return CommitResult(committed=False, version=None)
                if not plan.writes_by_merge_only:
                    return self._create_with(
                        dataset.scanner(), partition_by, properties, staged_rows
                    )
                # A change set's first load: nothing to delete or supersede yet, so its
                # rows are written as staged (in key order, which keeps each file's key
                # range narrow for later merges), with the cursor, in one commit: the
                # upserts, and soft deletes (the flagged row is the record of the delete).
                kept = None if plan.deletes == "soft" else pads.field(OP) == "U"
                rows = dataset.scanner(columns=columns, filter=kept)
                written = dataset.count_rows(filter=kept)
                return self._create_with(rows, partition_by, properties, written)
            assert table is not None
            metrics: dict[str, Any] = {}
            if staged_rows:
                merger = table.merge(
                    source=dataset.scanner().to_reader(),
                    predicate=plan.predicate,
                    source_alias="s",
                    target_alias="t",
                    merge_schema=add_new_columns,
                    streamed_exec=staged_rows > _STREAM_ABOVE_ROWS,
                    commit_properties=properties,
                )
                metrics = plan.apply(merger, columns).execute()
            changed = metrics.get("num_target_files_added", 0) or metrics.get(
                "num_target_files_removed", 0
            )
            if changed:
                return _result(metrics, self.open().version())
            if cursor_after is not None and cursor_after != cursor_before:
                # Nothing to write, but the cursor moves: record it alone, still atomically.
                table.create_write_transaction(
                    actions=[],
                    mode="append",
                    schema=table.schema(),
                    commit_properties=properties,
                )
                return CommitResult(
                    committed=True,
                    version=self.open().version(),
                    cursor_only=True,
                )
            return CommitResult(
                committed=False,
                version=state.version,
            )
        except (CommitFailedError, DeltaError) as exc:
            if not isinstance(exc, CommitFailedError) and "exists" not in str(exc).lower():
                raise
            raise ConcurrentLoadError(
                self.table_name,
                f"another writer committed to {self.path} during this run ({exc}); "
                "nothing from this run was committed.",
                "re-run; limit each table to one run at a time (its Dagster pool)",
            ) from None

    def record(self, metadata: Mapping[str, Any]) -> CommitResult:
        """A commit without data or cursor: ``metadata`` alone in the log (e.g. a landing
        run whose new file versions hold no rows still lists them)."""
        table = self.open()
        table.create_write_transaction(
            actions=[],
            mode="append",
            schema=table.schema(),
            commit_properties=self._properties("timestamp", None, metadata),
        )
        return CommitResult(committed=True, version=self.open().version())

    def _create_with(
        self,
        rows: pads.Scanner,
        partition_by: list[str],
        properties: CommitProperties,
        staged_rows: int,
    ) -> CommitResult:
        write_deltalake(
            self.path,
            rows.to_reader(),
            # "error": a table created by a concurrent first load fails this one.
            mode="error",
            partition_by=partition_by or None,
            storage_options=self.storage_options or None,
            commit_properties=properties,
        )
        table = self.open()
        return CommitResult(
            committed=True,
            version=table.version(),
            rows_inserted=staged_rows,
            files_added=len(table.file_uris()),
            created_table=True,
        )

    def _properties(
        self, kind: WatermarkKind, cursor: WatermarkValue | None, metadata: Mapping[str, Any]
    ) -> CommitProperties:
        custom = {f"{META_PREFIX}{k}": _plain(v) for k, v in metadata.items()}
        custom[_LOAD_KEY] = self.table_name
        transactions = self._transactions(kind, cursor) if cursor is not None else None
        return CommitProperties(custom_metadata=custom, app_transactions=transactions)

    def _transactions(self, kind: WatermarkKind, cursor: WatermarkValue | None) -> list:
        """The cursor as application transactions (None: the reset marker)."""
        now = int(time.time() * 1000)
        if cursor is None:
            return [Transaction(app_id(self.table_name), NO_CURSOR, now)]
        transactions = [
            Transaction(app_id(self.table_name), to_transaction_version(cursor, kind), now)
        ]
        if isinstance(cursor, tuple):
            transactions.append(Transaction(tiebreak_app_id(self.table_name), cursor[1], now))
        return transactions


class SideTable:
    """A Delta table the loader keeps beside a target, ``<target>__<SUFFIX>``."""

    SUFFIX = ""

    def __init__(self, target: DeltaTarget):
        self.location = target.beside(self.SUFFIX)

    def to_spark(
        self, spark: SparkSession, holding: delta_io.KeySet | None = None
    ) -> DataFrame | None:
        if not self.location.exists():
            return None
        return self.location.to_spark(spark, holding=holding)


class Tombstones(SideTable):
    """Keys a CDC feed hard-deleted, with the delete's sequence, in a sibling Delta table
    ``<target>__tombstones``. Written before the target's commit: a tombstone only ever
    suppresses changes older than a delete that did happen, so one recorded by a run that
    died before its main commit is harmless, and the target's commit stays the one truth
    for the watermark."""

    SUFFIX = "tombstones"

    def record(self, staged: pads.Dataset, keys: list[str], watermark: str) -> int:
        deletes = staged.to_table(columns=[*keys, watermark], filter=pads.field(OP) == "D")
        if deletes.num_rows == 0:
            return 0
        options = self.location.storage_options or None
        if not self.location.exists():
            write_deltalake(self.location.path, deletes, mode="append", storage_options=options)
            return deletes.num_rows
        predicate = matching(keys)
        wm = quote(watermark)
        (
            self.location.open()
            .merge(deletes, predicate, source_alias="s", target_alias="t")
            .when_matched_update_all(predicate=f"s.{wm} > t.{wm}")
            .when_not_matched_insert_all()
            .execute()
        )
        return deletes.num_rows


class ChangeLog(SideTable):
    """Every change a history (scd2) table has seen, in a sibling Delta table
    ``<target>__changes``: what a key's versions are recomputed from. Appended before the
    target's commit; a run that dies in between re-reads the same window, finds its changes
    logged, and recomputes the same versions, so the log never holds a change twice."""

    SUFFIX = "changes"

    def append(self, staged_path: str) -> int:
        dataset = pads.dataset(staged_path, format="parquet")
        rows = dataset.count_rows()
        if rows:
            write_deltalake(
                self.location.path,
                dataset.scanner().to_reader(),
                mode="append",
                schema_mode="merge",
                storage_options=self.location.storage_options or None,
            )
        return rows


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return json.dumps(value, default=str)


def _result(metrics: dict[str, Any], version: int) -> CommitResult:
    return CommitResult(
        committed=True,
        version=version,
        rows_inserted=int(metrics.get("num_target_rows_inserted", 0)),
        rows_updated=int(metrics.get("num_target_rows_updated", 0)),
        rows_deleted=int(metrics.get("num_target_rows_deleted", 0)),
        files_added=int(metrics.get("num_target_files_added", 0)),
        files_removed=int(metrics.get("num_target_files_removed", 0)),
    )


def row_count(table: DeltaTable) -> int:
    """Rows in the snapshot, from the log's per-file statistics (no data read)."""
    counts = delta_io.live_files(table).column("num_records").to_pylist()
    return int(sum(c or 0 for c in counts))


def arrow_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())
