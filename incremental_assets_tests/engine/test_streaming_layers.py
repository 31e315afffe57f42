"""A streaming aggregate layer (engine/declared_layers/streaming_layer.py) over a landing
folder of invoice CSV files, one batch per file: a late invoice within the watermark
updates its window, one behind it is dropped and counted; a run with no new file runs no
batch and commits nothing; a run killed with SIGKILL right after a batch's MERGE resumes
from the checkpoint with nothing lost or doubled (the replayed batch commits nothing); a
checkpoint that no longer matches the declaration, the source or the table is refused,
naming the layer, the checkpoint and the reset, with nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from incremental_assets.engine.declared_layers import layer_inputs, stream_layer
from incremental_assets.engine.errors import StreamCheckpointError
from incremental_assets.engine.faults import CRASH_ENV
from incremental_assets.engine.streaming.checkpoint import checkpoint_location, reset
from incremental_assets.specs import load_project
from incremental_assets_tests.builders import (
    CHILD_SPARK_CONF,
    STREAMING_COLUMNS,
    STREAMING_YAML,
    InvoiceFiles,
    hourly_totals,
)

# Watermark = the latest InvoiceDate seen, minus 1h, moved at the end of each batch.
FIRST = [("I1", "C1", "2026-01-01 10:10:00", 10.0), ("I2", "C2", "2026-01-01 10:20:00", 5.0)]
SECOND = [("I3", "C1", "2026-01-01 11:10:00", 3.0), ("I4", "C1", "2026-01-01 12:30:00", 2.0)]
# Watermark now 11:30: C1's 11:00-12:00 window is still open, 10:00-11:00 is final.
WITHIN = [("I5", "C1", "2026-01-01 11:45:00", 4.0)]
BEHIND = [("I6", "C2", "2026-01-01 10:30:00", 7.0), ("I7", "C1", "2026-01-01 09:15:00", 8.0)]


class Layer:
    def __init__(self, spark, root: Path, yaml_text: str = STREAMING_YAML):
        (root / "tables.yaml").write_text(yaml_text)
        self.spark, self.root = spark, root
        self.project = load_project(root / "tables.yaml")
        self.inputs = layer_inputs(self.project, self.project.layer("invoice_totals"))
        self.target = self.inputs.target

    def run(self):
        return stream_layer(self.spark, self.inputs)

    def rows(self) -> list[tuple]:
        frame = self.spark.read.format("delta").load(self.target.spark_path)
        return sorted(tuple(r) for r in frame.select(*STREAMING_COLUMNS).collect())

    def batch_commits(self) -> list[int]:
        """The batch id of each commit of the layer's streaming batches, oldest first."""
        history = reversed(self.target.open().history())
        records = [json.loads(c.get("userMetadata") or "{}") for c in history]
        batches = [r.get("incremental_assets", {}).get("batch_id") for r in records]
        return [int(b) for b in batches if b is not None]


def naive(rows: list[tuple]) -> list[tuple]:
    """hourly_totals' rows with Spark's naive UTC datetimes (the session zone is UTC)."""
    return [(c, s.replace(tzinfo=None), e.replace(tzinfo=None), *m) for c, s, e, *m in rows]


def test_late_invoices_within_the_watermark_update_their_window_and_later_ones_are_dropped(
    spark, tmp_path
):
    files, layer = InvoiceFiles(tmp_path), Layer(spark, tmp_path)
    files.drop(*FIRST, *SECOND)
    first = layer.run()
    assert first.batches >= 1 and first.rows_in == 4 and first.committed
    assert first.late_rows_dropped == 0
    assert first.checkpoint == checkpoint_location(layer.target)
    assert layer.rows() == naive(hourly_totals(files.written))

    files.drop(*WITHIN, *BEHIND)  # one batch: each row against the watermark of 11:30
    second = layer.run()
    # I5 joins C1's 11:00 window (3 + 4); I6 and I7 are behind the watermark: dropped.
    assert second.late_rows_dropped == 2 and second.rows_in == 3
    assert naive(hourly_totals(SECOND[:1] + WITHIN))[0] in layer.rows()
    assert layer.rows() == naive(hourly_totals(FIRST + SECOND + WITHIN))
    assert second.offsets_from is not None and second.offsets_to != second.offsets_from

    version = layer.target.open().version()
    again = layer.run()  # no new file
    assert (again.batches, again.rows_in, again.committed) == (0, 0, False)
    assert layer.target.open().version() == version


CHILD = """
import sys
from incremental_assets.engine.declared_layers import layer_inputs, stream_layer
from incremental_assets.engine.spark_session import local_session
from incremental_assets.specs import load_project

project = load_project(sys.argv[1])
spark = local_session(**dict(arg.split("=", 1) for arg in sys.argv[2:]))
stream_layer(spark, layer_inputs(project, project.layer("invoice_totals")))
"""


def test_a_run_killed_after_a_batch_merged_resumes_with_nothing_lost_or_doubled(spark, tmp_path):
    files, layer = InvoiceFiles(tmp_path), Layer(spark, tmp_path)
    for part in (FIRST, SECOND, WITHIN):
        files.drop(*part)
    conf = [f"{k}={v}" for k, v in CHILD_SPARK_CONF.items()]
    env = {**os.environ, CRASH_ENV: "after_commit", "INCREMENTAL_ASSETS_DRIVER_MEMORY": "1g"}
    command = [sys.executable, "-c", CHILD, str(tmp_path / "tables.yaml"), *conf]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, done.stderr[-3000:]  # killed inside batch 0, after its MERGE
    assert layer.batch_commits() == [0]  # merged, but not committed in the checkpoint

    resumed = layer.run()
    # Batch 0 ran again (its file is in this run's input) and its write was skipped.
    assert resumed.batch_ids[0] == 0 and resumed.rows_in == 5
    commits = layer.batch_commits()
    assert commits.count(0) == 1 and commits == sorted(set(commits))
    assert layer.rows() == naive(hourly_totals(files.written))


def test_a_checkpoint_that_no_longer_matches_is_refused_with_nothing_written_until_reset(
    spark, tmp_path
):
    files, layer = InvoiceFiles(tmp_path), Layer(spark, tmp_path)
    files.drop(*FIRST)
    layer.run()
    version = layer.target.open().version()
    files.drop(*SECOND)

    def refused(changed: Layer, field: str, fragment: str) -> None:
        with pytest.raises(StreamCheckpointError) as caught:
            changed.run()
        text = str(caught.value)
        assert f"layer 'invoice_totals', field '{field}'" in text and fragment in text
        assert checkpoint_location(layer.target) in text
        assert "incremental-assets reset-layer invoice_totals" in text
        assert layer.target.open().version() == version

    other_window = STREAMING_YAML.replace("size: 1h,", "size: 30m,")
    refused(Layer(spark, tmp_path, other_window), "window", "the declared query changed")
    more = STREAMING_YAML + "      - {name: largest, function: max, column: TotalAmount}\n"
    refused(Layer(spark, tmp_path, more), "aggregates", "the declared query changed")
    moved = files.folder.rename(files.folder.with_name("gone"))
    refused(layer, "from", "cannot be read")
    moved.rename(files.folder)
    checkpoint = tmp_path / "warehouse" / "invoice_totals__checkpoint"
    shutil.move(checkpoint, tmp_path / "kept")
    refused(layer, "run", "there is no checkpoint")

    reset(spark, layer.target)  # the documented way out: table and checkpoint go together
    assert not (checkpoint / "metadata").exists()
    assert not layer.target.exists()
    rerun = layer.run()
    assert rerun.rows_in == 4 and rerun.batch_ids[0] == 0
    assert layer.rows() == naive(hourly_totals(files.written))
