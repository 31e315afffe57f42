"""Downstream layers of a Delta table (silver after bronze, gold after silver), each run
reading only what changed upstream.

A layer records the upstream Delta version it covers in its own commit, written by Spark's
Delta Lake as the idempotent write ``incremental_assets/<layer>#<upstream>`` at that
version (a version watermark between two Delta tables), with the commit record's
``upstream`` and ``upstream_version`` (``engine.delta_lake.commits``). So the layer's data and
the version it covers land together or not at all, a re-run after a crash reads the same
files again, and a second commit covering the same version is skipped by Delta itself.

The pieces:

- :func:`covered_version`: the upstream version a layer last covered (-1 before its first
  run);
- :func:`added_since`: the rows of the upstream data files added since that version, and
  the upstream's current version (the one the run then covers);
- :func:`rewritten_files` and :func:`older_versions`: for a landing bronze upstream, the
  source files rewritten in place since that version, and a predicate on the rows of
  their earlier versions (which a layer holding them should drop);
- :func:`covering`: the commit's transaction and record that say which version it covers,
  for ``delta_commits.append`` (DataFrame writes) or ``delta_commits.idempotent`` (MERGE).

Example (an append-only layer of invoice headers after an invoices bronze table; the
docs/layers.md runs it)::

    from incremental_assets.engine import DeltaTarget
    from incremental_assets.engine.delta_lake import commits as delta_commits
    from incremental_assets.engine.layers import added_since, covered_version, covering

    bronze = DeltaTarget("invoices_bronze", "data/warehouse/invoices_bronze")
    headers = DeltaTarget("invoice_headers", "data/warehouse/invoice_headers")

    since = covered_version(headers, bronze)
    added, bronze_version = added_since(spark, bronze, since)
    if bronze_version != since:  # otherwise bronze has nothing new
        rows = added.select("InvoiceNumber", "StoreID", "TotalAmount")
        delta_commits.append(rows, headers.spark_path, **covering(headers, bronze, bronze_version))
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from incremental_assets.engine.delta_lake import commits as delta_commits
from incremental_assets.engine.delta_lake import io as delta_io
from incremental_assets.engine.delta_lake.store import DeltaTarget
from incremental_assets.engine.landing import loaded_files
from incremental_assets.specs.landing import FILE_VERSION, SOURCE_FILE


def covered_version(target: DeltaTarget, upstream: DeltaTarget) -> int:
    """The upstream version ``target`` last covered (-1 before its first run)."""
    if not target.exists():
        return -1
    value = target.open().transaction_version(layer_app_id(target, upstream))
    return -1 if value is None else int(value)


def layer_app_id(target: DeltaTarget, upstream: DeltaTarget) -> str:
    """The application transaction id under which ``target`` records the version of
    ``upstream`` it covers."""
    return f"incremental_assets/{target.table_name}#{upstream.table_name}"


def added_since(spark: SparkSession, upstream: DeltaTarget, version: int) -> tuple[DataFrame, int]:
    """Rows of the data files live now but not at ``version`` (all rows when -1): for an
    append-only or merge-written table, a superset of the rows changed since."""
    table = upstream.open()
    now = delta_io.live_files(table).to_pylist()
    if version >= 0:
        before = {row["path"] for row in delta_io.live_files(upstream.open(version)).to_pylist()}
        now = [row for row in now if row["path"] not in before]
    return delta_io.read_files(spark, table, now), table.version()


def rewritten_files(bronze: DeltaTarget, since: int) -> dict[str, str]:
    """Files that bronze commits after version ``since`` loaded in a new version while an
    earlier version of them was loaded before: path -> the newest version. Read from the
    commits' file lists and the file index, not from the data."""
    newest: dict[str, tuple[int, str]] = {}
    table = bronze.open()
    for load in bronze.loads(table, limit=max(table.version() - since, 0)):
        if int(load["version"]) <= since:
            continue
        for path, version, _ in json.loads(load.get("files") or "[]"):
            if path not in newest or newest[path][0] < int(load["version"]):
                newest[path] = (int(load["version"]), version)
    if not newest:
        return {}
    earlier: dict[str, set[str]] = {}
    for path, version in loaded_files(bronze):
        if path in newest:
            earlier.setdefault(path, set()).add(version)
    return {p: v for p, (_, v) in newest.items() if earlier.get(p, set()) - {v}}


def older_versions(alias: str, files: dict[str, str]) -> str:
    """A SQL predicate on rows (of the table aliased ``alias``) that came from a version of
    one of ``files`` (path -> newest version, as :func:`rewritten_files` returns) other
    than its newest."""

    def text(value: str) -> str:
        return "'" + value.replace("'", "''") + "'"

    return " OR ".join(
        f"({alias}.{SOURCE_FILE} = {text(p)} AND {alias}.{FILE_VERSION} <> {text(v)})"
        for p, v in sorted(files.items())
    )


def covering(
    target: DeltaTarget, upstream: DeltaTarget, version: int, extra: dict | None = None
) -> dict[str, Any]:
    """The keyword arguments (``app_id``, ``version``, ``metadata``) of a write to
    ``target`` that records, in the same commit, that it covers ``upstream`` up to
    ``version`` (plus ``extra`` in the commit record)."""
    metadata = delta_commits.record(
        {
            "layer": target.table_name,
            "upstream": upstream.table_name,
            "upstream_version": str(version),
            **(extra or {}),
        }
    )
    return {"app_id": layer_app_id(target, upstream), "version": version, "metadata": metadata}
