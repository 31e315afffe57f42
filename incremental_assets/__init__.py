"""Incremental loads on PySpark into Delta Lake, as partitioned Dagster assets."""
