"""Every read and write of a Delta table: Spark's Delta Lake for data and commits, delta-rs
only to read a log where starting Spark would cost more than the answer.

- ``io``: reads (Spark's Delta; delta-rs for log-only answers), file listings, key sets;
- ``commits``: the commit record and idempotent (exactly-once) writes;
- ``store``: a target table, its cursor and its side tables;
- ``merge_plan``: the MERGE a strategy runs;
- ``maintenance``: OPTIMIZE and VACUUM.
"""
