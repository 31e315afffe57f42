"""Errors the engine raises. Each carries its context and says what to change."""

from __future__ import annotations


class IncrementalLoadError(Exception):
    """Base class: a load could not run. Nothing was committed when this is raised."""

    def __init__(self, table: str, message: str, fix: str | None = None):
        self.table = table
        self.fix = fix
        text = f"table '{table}': {message}"
        if fix:
            text += f" Fix: {fix}"
        super().__init__(text)


class SourceNotFoundError(IncrementalLoadError):
    """The configured source (path, table) does not exist."""


class SchemaMismatchError(IncrementalLoadError):
    """A column is missing, or its type differs from the target or the spec."""

    def __init__(self, table: str, column: str, message: str, fix: str | None = None):
        self.column = column
        super().__init__(table, message, fix)


class NullValuesError(IncrementalLoadError):
    """Key or watermark columns hold nulls in the rows a run would load."""

    def __init__(self, table: str, counts: dict[str, int], fix: str | None = None):
        self.counts = counts
        detail = ", ".join(f"{column}: {n}" for column, n in sorted(counts.items()))
        super().__init__(table, f"null values in required columns ({detail}).", fix)


class ConcurrentLoadError(IncrementalLoadError):
    """Another writer committed to the target while this run was working."""


class TargetOwnedError(IncrementalLoadError):
    """The target's Delta log holds another table's loads."""


class DeleteGuardError(IncrementalLoadError):
    """A run would delete more of the target than its strategy allows (a vanished source).
    ``report`` holds the numbers (engine.guards.GuardReport)."""

    def __init__(self, table: str, message: str, fix: str, report: object):
        self.report = report
        super().__init__(table, message, fix)
