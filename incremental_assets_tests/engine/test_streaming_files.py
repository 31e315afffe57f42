"""A streaming row layer that reads its upstream table's folder of files (``reads: files``,
engine/declared_layers/streaming_rows.py): the folder streamed straight into Delta by a
Structured Streaming query, its select applied to each batch of new files and merged by
key, without the folder's table ever being loaded. New files only are read; a corrected
row in a later file updates its key (a batch reads one file, oldest first); a run with no
new file commits nothing; a run killed with SIGKILL right after a batch's MERGE resumes
with nothing lost or doubled; rows of one key in one batch fail the run naming the key; a
changed select is refused until the reset."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pyspark.sql.types import StructType

from incremental_assets.engine.declared_layers import layer_inputs, stream_layer
from incremental_assets.engine.errors import LayerError, StreamCheckpointError
from incremental_assets.engine.streaming.checkpoint import QUERY, last_stream_commit, reset
from incremental_assets.specs import load_project
from incremental_assets_tests.builders import stream_killed

SELECT = (
    "SELECT InvoiceID, CustomerID, CAST(TotalAmount AS DECIMAL(12, 2)) AS amount "
    "FROM invoices WHERE TotalAmount > 0"
)
PROJECT = f"""
warehouse: {{root: ./warehouse}}
tables:
  - name: invoices
    source:
      format: csv
      path: ./landing/invoices
      schema: "InvoiceID STRING, CustomerID STRING, InvoiceDate TIMESTAMP, TotalAmount DOUBLE"
      options: {{header: "true"}}
      landing: {{}}
    strategy: append
    partitioning: {{granularity: daily, start: 2026-01-01}}
layers:
  - name: invoices_clean
    from: invoices
    run: streaming
    reads: files
    select: {SELECT}
    keys: [InvoiceID]
"""
HEADER = "InvoiceID,CustomerID,InvoiceDate,TotalAmount\n"


class Folder:
    """The landing folder of invoice files and the streaming layer after it."""

    def __init__(self, spark, root: Path, project: str = PROJECT):
        (root / "tables.yaml").write_text(project)
        self.spark, self.root = spark, root
        self.folder = root / "landing" / "invoices"
        self.folder.mkdir(parents=True)
        self.dropped = 0
        self.project = load_project(root / "tables.yaml")
        if any(layer.name == "invoices_clean" for layer in self.project.layers):
            self.inputs = layer_inputs(self.project, self.project.layer("invoices_clean"))

    def drop(self, name: str, *lines: str) -> None:
        """Write a file elsewhere, then move it in (as a landing folder should be fed),
        each file 10 s newer than the one before (Spark reads files oldest first)."""
        staged = self.root / name
        staged.write_text(HEADER + "".join(f"{line}\n" for line in lines))
        self.dropped += 1
        stamp = 1_790_000_000 + 10 * self.dropped
        os.utime(staged, (stamp, stamp))
        staged.rename(self.folder / name)

    def run(self):
        return stream_layer(self.spark, self.inputs)

    def rows(self) -> list[tuple]:
        frame = self.spark.read.format("delta").load(self.inputs.target.spark_path)
        return sorted((r.InvoiceID, r.CustomerID, float(r.amount)) for r in frame.collect())

    def commits(self) -> list[str]:
        return [h["operation"] for h in self.inputs.target.open().history()]


def test_new_files_stream_into_the_layer_by_key_without_loading_the_table(spark, tmp_path):
    folder = Folder(spark, tmp_path)
    folder.drop(
        "a.csv",
        "I1,C1,2026-01-01 10:00:00,5.5",
        "I2,C2,2026-01-01 10:05:00,3",
        "I3,C1,2026-01-01 10:07:00,0",  # the select's filter drops it
    )
    first = folder.run()
    assert (first.batches, first.rows_in, first.committed) == (1, 3, True)
    assert folder.rows() == [("I1", "C1", 5.5), ("I2", "C2", 3.0)]
    assert first.rows_out == 2 and first.upstream_version is None
    assert first.offsets_to is not None and first.checkpoint.endswith("invoices_clean__checkpoint")
    # The layer read the folder itself: the folder's table was never loaded.
    assert not folder.inputs.upstream.exists()

    version = folder.inputs.target.open().version()
    idle = folder.run()
    assert (idle.batches, idle.committed) == (0, False)
    assert folder.inputs.target.open().version() == version

    # A later file corrects I2 and adds I4: only that file is read, I2 is updated.
    folder.drop("b.csv", "I2,C2,2026-01-01 10:05:00,4.25", "I4,C3,2026-01-01 11:00:00,1")
    second = folder.run()
    assert (second.batches, second.rows_in, second.rows_out) == (1, 2, 2)
    assert folder.rows() == [("I1", "C1", 5.5), ("I2", "C2", 4.25), ("I4", "C3", 1.0)]
    assert folder.commits().count("MERGE") == 1

    # Two files with a row of one key: a batch a file, the later file's row wins.
    folder.drop("c.csv", "I5,C1,2026-01-01 12:00:00,2", "I6,C2,2026-01-01 12:01:00,6")
    folder.drop("d.csv", "I5,C1,2026-01-01 12:00:00,9")
    third = folder.run()
    assert (third.batches, third.rows_in, third.batch_ids) == (2, 3, (2, 3))
    assert folder.rows()[-2:] == [("I5", "C1", 9.0), ("I6", "C2", 6.0)]

    # A changed select is the old checkpoint's no more: refused, nothing written, until
    # the reset, after which every file is read anew.
    changed = PROJECT.replace("WHERE TotalAmount > 0", "WHERE TotalAmount > 2")
    (tmp_path / "tables.yaml").write_text(changed)
    project = load_project(tmp_path / "tables.yaml")
    inputs = layer_inputs(project, project.layer("invoices_clean"))
    version = inputs.target.open().version()
    with pytest.raises(StreamCheckpointError) as caught:
        stream_layer(spark, inputs)
    text = str(caught.value)
    assert "field 'select'" in text and "incremental-assets reset-layer invoices_clean" in text
    assert inputs.target.open().version() == version
    reset(spark, inputs.target)
    again = stream_layer(spark, inputs)
    assert (again.batches, again.rows_in) == (4, 8)
    rows = spark.read.format("delta").load(inputs.target.spark_path).collect()
    assert sorted((r.InvoiceID, float(r.amount)) for r in rows) == [
        ("I1", 5.5),
        ("I2", 4.25),
        ("I5", 9.0),
        ("I6", 6.0),
    ]


@pytest.mark.classic_only("its child process starts a local Spark session")
def test_a_run_killed_after_a_batch_merged_resumes_with_nothing_lost_or_doubled(spark, tmp_path):
    folder = Folder(spark, tmp_path)
    folder.drop("a.csv", "I1,C1,2026-01-01 10:00:00,5", "I2,C2,2026-01-01 10:05:00,3")
    folder.run()
    folder.drop("b.csv", "I1,C1,2026-01-01 10:00:00,7", "I3,C3,2026-01-01 10:09:00,1")
    done = stream_killed(tmp_path / "tables.yaml", "invoices_clean")
    assert done.returncode == -9, done.stderr[-3000:]  # killed inside batch 1, after its MERGE
    assert folder.commits().count("MERGE") == 1  # merged; the checkpoint does not know

    resumed = folder.run()
    # Batch 1 read b.csv again and its write was skipped: still one MERGE, and exact.
    assert resumed.batch_ids == (1, 1) and resumed.rows_in == 2 and not resumed.committed
    assert folder.commits().count("MERGE") == 1
    assert folder.rows() == [("I1", "C1", 7.0), ("I2", "C2", 3.0), ("I3", "C3", 1.0)]


def test_rows_of_one_key_in_one_batch_fail_the_run_naming_the_key(spark, tmp_path):
    folder = Folder(spark, tmp_path)
    folder.drop("a.csv", "I1,C1,2026-01-01 10:00:00,5", "I1,C1,2026-01-01 10:00:00,6")
    with pytest.raises(LayerError) as caught:
        folder.run()
    text = str(caught.value)
    assert "layer 'invoices_clean', field 'keys'" in text and "more than one row for a key" in text
    assert "'I1'" in text and "rewrite the batch's file" in text
    assert "incremental-assets reset-layer invoices_clean" in text
    assert not folder.inputs.target.exists()

    # Rewritten in place, the file is read again by the batch that failed.
    (folder.folder / "a.csv").write_text(HEADER + "I1,C1,2026-01-01 10:00:00,6\n")
    assert folder.run().batch_ids == (0, 0)
    assert folder.rows() == [("I1", "C1", 6.0)]


def test_a_file_of_no_rows_first_and_a_file_moved_in_late_with_an_old_time_are_followed(
    spark, tmp_path
):
    # No header option: a CSV file's first line is its header, as the batch loads read it.
    folder = Folder(spark, tmp_path, PROJECT.replace('      options: {header: "true"}\n', ""))
    folder.drop("a.csv")  # a header and no row
    empty = folder.run()
    # The first batch creates the table, empty: the checkpoint and the table go together.
    assert (empty.batches, empty.rows_in, empty.committed) == (1, 0, True)
    assert folder.rows() == []
    folder.drop("b.csv", "I1,C1,2026-01-01 10:00:00,5")
    assert folder.run().rows_in == 1

    # A file moved in now that was written 30 days before the newest file read (a move
    # keeps its time): Spark's file source would skip it as too old; it is read.
    late = tmp_path / "late.csv"
    late.write_text(HEADER + "I2,C2,2026-01-01 10:05:00,3\n")
    stamp = 1_790_000_000 - 30 * 86_400
    os.utime(late, (stamp, stamp))
    late.rename(folder.folder / "late.csv")
    assert folder.run().rows_in == 1
    assert folder.rows() == [("I1", "C1", 5.0), ("I2", "C2", 3.0)]


TEXT_TIMES = """
warehouse: {root: ./warehouse}
tables:
  - name: invoices
    source: {format: csv, path: ./landing/invoices}
    keys: [InvoiceID]
    watermark: {column: InvoiceDate, kind: timestamp}
    strategy: upsert
    partitioning: {granularity: daily, start: 2026-01-01}
layers:
  - name: invoice_totals
    kind: aggregate
    from: invoices
    run: streaming
    group_by: [CustomerID]
    window: {column: InvoiceDate, size: 1h, watermark: 1h}
    aggregates:
      - {name: total_amount, function: sum, column: TotalAmount}
"""


def test_a_window_over_a_column_inferred_as_text_names_the_schema_to_declare(spark, tmp_path):
    folder = Folder(spark, tmp_path, TEXT_TIMES)
    folder.drop("a.csv", "I1,C1,2026-01-01 10:00:00,5")
    inputs = layer_inputs(folder.project, folder.project.layer("invoice_totals"))
    with pytest.raises(LayerError) as caught:
        stream_layer(spark, inputs)
    text = str(caught.value)
    assert "layer 'invoice_totals', field 'window.column'" in text
    assert "'InvoiceDate' is string, not a timestamp" in text
    assert "declare source.schema of 'invoices' with InvoiceDate TIMESTAMP" in text
    assert not inputs.target.exists()


PARQUET = """
warehouse: {root: ./warehouse}
tables:
  - name: readings
    source: {format: parquet, path: ./landing/readings, landing: {}}
    strategy: append
    partitioning: {granularity: daily, start: 2026-01-01}
layers:
  - name: readings_clean
    from: readings
    run: streaming
    reads: files
    select: SELECT sensor, value FROM readings WHERE value IS NOT NULL
    keys: [sensor]
"""


def test_without_a_declared_schema_the_first_run_infers_one_and_keeps_it(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "tables.yaml").write_text(PARQUET)
    folder = tmp_path / "landing" / "readings"
    folder.mkdir(parents=True)
    project = load_project(tmp_path / "tables.yaml")
    inputs = layer_inputs(project, project.layer("readings_clean"))

    def drop(name: str, stamp: int, **columns) -> None:
        staged = tmp_path / name
        pq.write_table(pa.table(columns), staged)
        os.utime(staged, (stamp, stamp))
        staged.rename(folder / name)

    # No file yet: nothing to infer a schema from, nothing read, nothing written.
    empty = stream_layer(spark, inputs)
    assert (empty.batches, empty.committed) == (0, False) and not inputs.target.exists()

    drop("a.parquet", 1_790_000_000, sensor=["s1", "s2"], value=[1.5, None])
    first = stream_layer(spark, inputs)
    assert (first.batches, first.rows_in, first.rows_out) == (1, 2, 1)
    query = json.loads(last_stream_commit(inputs.target)[QUERY])
    kept = StructType.fromJson(json.loads(query["source.schema"]))
    assert kept.simpleString() == "struct<sensor:string,value:double>"

    # A later file with a column more: read with the kept schema, as every batch before.
    drop("b.parquet", 1_790_000_010, sensor=["s2"], value=[2.5], extra=["x"])
    second = stream_layer(spark, inputs)
    assert (second.batches, second.rows_in) == (1, 1)
    rows = spark.read.format("delta").load(inputs.target.spark_path)
    assert rows.columns == ["sensor", "value"]
    assert sorted(tuple(r) for r in rows.collect()) == [("s1", 1.5), ("s2", 2.5)]
