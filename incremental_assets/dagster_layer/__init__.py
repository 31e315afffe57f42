"""The Dagster layer: thin wiring from table specs to assets, checks, jobs and schedules."""
