"""How the loader's commits are written by Spark's Delta Lake and read back from the log.

Every commit the loader makes carries its record as the commit's ``userMetadata``: a JSON
object ``{"incremental_assets": {...}}`` (table, run, window, cursor, counts). A commit that
moves a table's state also carries an application transaction, Delta's idempotent-write
marker (``txnAppId``/``txnVersion``): its version is the table's commit sequence, one more
than the last. Spark skips a write whose version is not above the recorded one, and fails
one that races another writer of the same transaction, so a run that planned its window on
a state another run has since moved commits nothing.

Reading needs no Spark: the log's commit infos and transactions are read with delta-rs
(``DeltaTarget``), which never writes.

Example:
    >>> with idempotent(spark, "incremental_assets/orders", 8, {"run_id": "r1"}):  # doctest: +SKIP
    ...     DeltaTable.forPath(spark, path).merge(...).execute()
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from incremental_assets.engine.delta_lake import catalog
from incremental_assets.engine.spark import runtime_conf, session_slots

KEY = "incremental_assets"
# The record's entry for what a load read, or a rewind accepted (engine/sources/identity.py).
SOURCE_IDENTITY = "source_identity"
# The session settings that make Delta's next DML command (MERGE, UPDATE, DELETE) an
# idempotent write with commit metadata; DataFrame writes take the same as options.
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_RECORD_EMPTY = "spark.databricks.delta.skipRecordingEmptyCommits"
# A merge of staged Parquet, which no one changes during the merge, need not be copied
# first (Delta's guard against a source changing between the merge's passes).
STAGED_SOURCE = {"spark.databricks.delta.merge.materializeSource": "none"}
# Session settings are shared by the threads of one session: one commit sets them at a time.
SESSION_LOCK = threading.RLock()
log = logging.getLogger(__name__)


def plain(value: Any) -> Any:
    """A metadata value as the log keeps it: text, number, bool or None; anything else as
    JSON text."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return json.dumps(value, default=str)


def record(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` with plain values and a unique ``commit_id``, by which the run finds
    its own commit in the log afterwards."""
    return {**{k: plain(v) for k, v in metadata.items()}, "commit_id": uuid.uuid4().hex}


def user_metadata(metadata: Mapping[str, Any]) -> str:
    return json.dumps({KEY: dict(metadata)}, default=str, sort_keys=True)


def parse(commit: Mapping[str, Any]) -> dict[str, Any] | None:
    """The loader's record in a commit info read from the log, or None when the commit is
    not the loader's. Commits written by earlier releases (through delta-rs) kept the
    record as top-level ``incremental_assets.<key>`` entries; they are read the same way."""
    text = commit.get("userMetadata")
    if isinstance(text, str) and text.startswith("{"):
        try:
            value = json.loads(text).get(KEY)
        except (ValueError, AttributeError):
            value = None
        if isinstance(value, dict):
            return dict(value)
    prefix = f"{KEY}."
    legacy = {k.removeprefix(prefix): v for k, v in commit.items() if k.startswith(prefix)}
    if legacy:
        legacy["legacy"] = True
        return legacy
    return None


def writer_options(
    app_id: str | None, version: int | None, metadata: Mapping[str, Any]
) -> dict[str, str]:
    """DataFrameWriter options for an idempotent write with the loader's record."""
    options = {"userMetadata": user_metadata(metadata)}
    if app_id is not None and version is not None:
        options |= {"txnAppId": app_id, "txnVersion": str(version)}
    return options


@contextmanager
def session_settings(
    spark: SparkSession, settings: Mapping[str, str], optional: Mapping[str, str] | None = None
) -> Iterator[None]:
    """The session ``settings`` within the block, each restored to what it was after it,
    however the block ends; one block at a time sets them (Spark reads a commit's user
    metadata and transaction from the session, which its threads share).

    ``optional``: settings that only make the block cheaper, all or none of them (a
    merge's source left as staged, its rewrite in key order). Where the session refuses
    one of them (``refused``: a static setting, or one a serverless workspace does not
    offer, there even to read), the block runs without any, and so do the session's later
    blocks (said once in the log); a refused one of ``settings`` fails the block."""
    optional = {k: v for k, v in (optional or {}).items() if k not in settings}
    if spark in _REFUSING:
        optional = {}
    with SESSION_LOCK:
        before, optional = _read(spark, settings, optional)
        # A block that fails, or whose settings may be left: through Spark Connect, no
        # later process takes this session (its command may even still be running).
        try:
            _set(spark, settings, optional, before)
            yield
        except BaseException:
            session_slots.taint()
            raise
        finally:
            try:
                _restore(spark, before)
            except BaseException:
                session_slots.taint()
                raise


# What a session says of a setting it will not take: a static one, a core one (Spark's
# own), one a serverless workspace does not offer (Databricks); the last, as Spark 3.5
# words the first two without a condition.
REFUSALS = ("CANNOT_MODIFY_STATIC_CONFIG", "CANNOT_MODIFY_CONFIG", "CONFIG_NOT_AVAILABLE")
_REFUSED_TEXT = ("[CONFIG_NOT_AVAILABLE]", "Cannot modify the value of")
# The sessions that refused a block's optional settings: their later blocks run without.
_REFUSING: weakref.WeakSet = weakref.WeakSet()


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is a session refusing a setting."""
    condition = getattr(exc, "getCondition", lambda: None)() or ""
    if condition:
        return condition.startswith(REFUSALS)
    return any(text in str(exc) for text in _REFUSED_TEXT)


def _refuses(spark: SparkSession, optional: Mapping[str, str], exc: BaseException) -> None:
    _REFUSING.add(spark)
    log.warning(
        "the Spark session refuses one of %s (%s); its merges run without them",
        ", ".join(f"{k}={v}" for k, v in optional.items()),
        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
    )


def _read(
    spark: SparkSession, settings: Mapping[str, str], optional: Mapping[str, str]
) -> tuple[dict[str, str | None], Mapping[str, str]]:
    """The values of ``settings``' and ``optional``'s keys (one round trip through Spark
    Connect), and ``optional``: none where the session refuses to read one of them."""
    try:
        return runtime_conf.get_many(spark, [*settings, *optional]), optional
    except Exception as exc:
        if not optional or not refused(exc):
            raise
        before = runtime_conf.get_many(spark, settings)  # a refused one fails the block
        _refuses(spark, optional, exc)
        return before, {}


def _set(
    spark: SparkSession,
    settings: Mapping[str, str],
    optional: Mapping[str, str],
    before: Mapping[str, str | None],
) -> None:
    """Set ``settings`` and ``optional`` (one round trip through Spark Connect); where the
    session refuses one, ``settings`` alone (a refused one of these fails the block), the
    optional ones the batch set before the refused one put back as they were."""
    try:
        runtime_conf.set_many(spark, {**optional, **settings})
        return
    except Exception as exc:
        if not optional or not refused(exc):
            raise
        error = exc
    runtime_conf.set_many(spark, settings)
    _restore(spark, {key: before[key] for key in optional})
    _refuses(spark, optional, error)


def _restore(spark: SparkSession, before: Mapping[str, str | None]) -> None:
    """Put back every key of ``before`` (two round trips through Spark Connect); where the
    session refuses one (never set: a refused setting, or a batch that stopped at one),
    each alone, the refused ones left as they are."""
    try:
        runtime_conf.restore(spark, before)
    except Exception as exc:
        if not refused(exc):
            raise
        for key, value in before.items():
            try:
                runtime_conf.restore(spark, {key: value})
            except Exception as each:
                if not refused(each):
                    raise


def idempotent(
    spark: SparkSession,
    app_id: str | None,
    version: int | None,
    metadata: Mapping[str, Any],
    optional: Mapping[str, str] | None = None,
):
    """Within the block, Delta's DML commands commit with the loader's record and, given
    ``app_id``, as the idempotent write ``(app_id, version)`` (and with those of the
    session settings ``optional`` the session takes: ``session_settings``)."""
    conf = {USER_METADATA: user_metadata(metadata)}
    if app_id is not None and version is not None:
        conf |= {TXN_APP_ID: app_id, TXN_VERSION: str(version)}
    return session_settings(spark, conf, optional)


def append(
    df: DataFrame,
    path: str,
    metadata: Mapping[str, Any],
    *,
    app_id: str | None = None,
    version: int | None = None,
    mode: str = "append",
    partition_by: list[str] | None = None,
    options: Mapping[str, str] | None = None,
    table: str | None = None,
) -> None:
    """Write ``df`` to the Delta table at ``path`` (``mode`` "error" creates it, failing if
    it exists) in one commit carrying ``metadata``; with ``table``, to that catalog table
    (created as an external table at ``path``)."""
    writer = df.write.format("delta").mode(mode)
    for key, value in {**writer_options(app_id, version, metadata), **(options or {})}.items():
        writer = writer.option(key, value)
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    catalog.save(df.sparkSession, writer, path, table, creating=mode == "error")


def empty_commit(
    spark: SparkSession,
    path: str,
    metadata: Mapping[str, Any],
    *,
    app_id: str | None = None,
    version: int | None = None,
    table: str | None = None,
) -> None:
    """A commit that adds no rows: the loader's record (and transaction) alone (to the
    catalog table ``table``, if given)."""
    nothing = catalog.read(spark, path, table).limit(0)
    # Delta leaves out a commit without actions unless told: this one is the record.
    with session_settings(spark, {_RECORD_EMPTY: "false"}):
        append(nothing, path, metadata, app_id=app_id, version=version, table=table)
