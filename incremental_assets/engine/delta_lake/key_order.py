"""A merge that rewrites few rows writes them in key order, in files of bounded size.

A table's first write puts its rows in key order, ``ROWS_PER_FILE`` to a file, so each
file holds a narrow key range and an increment rewrites only the files its keys fall in.
Delta's MERGE writes what it rewrites as its join leaves it: hash-partitioned by the key
over the write's tasks. Two tasks write two files that each span the whole key range of
the file they replace, so every later increment into that range rewrites both; and the
rows an increment inserts beside them (new keys land beside the newest) make them grow
without bound. In 30 runs of the scd2 benchmark at 5M rows, the rows an increment
rewrote grew from 665,000 to 1,825,000.

Where the files the merge may rewrite and the staged rows hold more than a file's rows
(``rows_per_file``: the files have grown past the first write's bound) and at most
``ORDERED_FILES`` files' worth, the merge's shuffle is one partition: its sort-merge join
then hands every row, in key order, to one task, which starts a new file every
``rows_per_file`` rows. The files stay key-ordered and bounded, and the next increment
rewrites only those its keys fall in (in the benchmark's 30 runs at 5M rows, the rows a
cdc increment rewrote stopped at 1,020,000).

What it costs: that one task writes the rewrite alone, where Delta would spread it over
the cluster; the merge's search for the files it rewrites runs in one task too. On 2
cores a run writing about a million rows in one task took about 1 s longer than one
writing as many in two: below a file's rows, where nothing outgrows the bound yet, the
merge is left to Delta. Where the order is not kept, the rows are the
same and only the layout differs: a partitioned table (Delta repartitions a MERGE's
output by the partition columns), a session that sets
``spark.sql.adaptive.coalescePartitions.initialPartitionNum`` (adaptive execution then
starts from that many partitions), a join that is not a sort-merge join (a merge with no
insert clause may broadcast the staged rows: its output then follows the target's files,
one file each, as they were), and optimized writes, which shuffle the output again.

Example:
    >>> ordered_rewrite(1_200_000, 1_000_000, partitioned=False)["spark.sql.shuffle.partitions"]
    '1'
"""

from __future__ import annotations

# A merge rewriting at most this many files' worth of rows writes them in key order.
ORDERED_FILES = 2


def few(rows: int, rows_per_file: int) -> bool:
    """Whether a merge writing ``rows`` rows may write them in one task."""
    return rows <= ORDERED_FILES * rows_per_file


def ordered_rewrite(
    rows: int | None, rows_per_file: int, partitioned: bool, one_task: int | None = None
) -> dict[str, str]:
    """The session settings under which a MERGE that writes at most ``rows`` rows (the
    files its keys may fall in, and the staged rows; None: not known) writes them in key
    order, ``rows_per_file`` to a file; none where they fit in a file, where they are too
    many for one task (more than ``one_task`` rows; default: ``ORDERED_FILES`` files'
    worth), or where the table is ``partitioned``.

    ``one_task`` apart from ``rows_per_file``: a table of wide rows gets files of fewer
    rows than its first write's (or an earlier release's) were, and a rewrite of one of
    those larger files is still cut into files of the smaller bound, in key order."""
    limit = ORDERED_FILES * rows_per_file if one_task is None else one_task
    if partitioned or rows is None or rows <= rows_per_file or rows > limit:
        return {}
    return {
        "spark.sql.shuffle.partitions": "1",
        "spark.sql.files.maxRecordsPerFile": str(rows_per_file),
    }
