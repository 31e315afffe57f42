"""Errors the engine raises. Each carries its context and says what to change."""

from __future__ import annotations

import re


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

    def __init__(self, table: str, counts: dict[str, int], fix: str | None = None, rows: str = ""):
        self.counts = counts
        self.rows = rows  # some of the rows, named by key and watermark, when known
        detail = ", ".join(f"{column}: {n}" for column, n in sorted(counts.items()))
        named = f" {rows}" if rows else ""
        super().__init__(table, f"null values in required columns ({detail}).{named}", fix)


class DuplicateKeysError(IncrementalLoadError):
    """A snapshot holds a key more than once. ``count`` keys are repeated; ``sample`` names
    some of them."""

    def __init__(self, table: str, count: int, sample: list[str], message: str, fix: str):
        self.count = count
        self.sample = sample
        super().__init__(table, message, fix)


class RuleTimeoutError(IncrementalLoadError):
    """The Spark job evaluating a table's quality rules ran past ``quality.rule_timeout``
    and was cancelled. ``rules`` names the table's rules."""

    def __init__(self, table: str, rules: list[str], message: str, fix: str):
        self.rules = rules
        super().__init__(table, message, fix)


class ConcurrentLoadError(IncrementalLoadError):
    """Another writer committed to the target while this run was working."""


class CursorLostError(IncrementalLoadError):
    """The Delta log no longer holds the commit that recorded the table's cursor."""


class TargetOwnedError(IncrementalLoadError):
    """The target's Delta log holds another table's loads."""


class FirstLoadUnfinishedError(TargetOwnedError):
    """The target's folder holds the uncommitted files of a first load of the table whose
    write may still be going on. The run that finds them leaves the staging root as it is
    (``keeps_staging``): the claim that says whose the files are stays for the next run."""

    keeps_staging = True


class CatalogTableError(IncrementalLoadError):
    """A table named in Spark's catalog is missing, not Delta, or not the one at the
    table's location."""


class SourceSwitchedError(IncrementalLoadError):
    """The table's source is not the one its last load (or accepted rewind) read: another
    database, table, path or format. ``recorded`` and ``current`` are the two identities."""

    def __init__(self, table: str, recorded: str, current: str, message: str, fix: str):
        self.recorded = recorded
        self.current = current
        super().__init__(table, message, fix)


class CursorRangeError(IncrementalLoadError):
    """The table's cursor lies outside the values a run can read from (set by a rewind of
    an earlier release)."""


class DeleteGuardError(IncrementalLoadError):
    """A run would delete more of the target than its strategy allows (a vanished source).
    ``report`` holds the numbers (engine.guards.GuardReport)."""

    def __init__(self, table: str, message: str, fix: str, report: object):
        self.report = report
        super().__init__(table, message, fix)


class SourceUnavailableError(IncrementalLoadError):
    """The database could not be reached, or the connection broke: a retry may succeed."""

    retryable = True


class SourceAccessError(IncrementalLoadError):
    """The database refused the login or the read (password, privileges, missing driver)."""


class ConnectionSettingError(SourceAccessError):
    """The connection's settings do not fit the database (SSL mode, certificates, driver
    parameters): a retry cannot help; ``setting`` names what to change."""

    def __init__(self, table: str, setting: str, message: str, fix: str):
        self.setting = setting
        super().__init__(table, message, fix)


class UnreadableFileError(IncrementalLoadError):
    """A source file cannot be read; ``path`` names it (None when Spark did not say)."""

    def __init__(self, table: str, path: str | None, message: str, fix: str):
        self.path = path
        super().__init__(table, message, fix)


class UnreadableLogError(IncrementalLoadError):
    """A Delta table's transaction log cannot be read; ``path`` names the log file."""

    def __init__(self, table: str, path: str | None, message: str, fix: str):
        self.path = path
        super().__init__(table, message, fix)


class DiskFullError(IncrementalLoadError):
    """A disk the run writes to is full: ``location`` is ``target``, ``staging`` or
    ``spill`` (Spark's local folder), ``path`` the folder on it. Nothing was committed."""

    def __init__(self, table: str, location: str, path: str, message: str, fix: str):
        self.location = location
        self.path = path
        super().__init__(table, message, fix)


class OperationError(IncrementalLoadError):
    """An operation on a table was refused; nothing was written."""


class MaintenanceError(IncrementalLoadError):
    """Maintenance was refused; nothing was changed by the refused step."""


class LayerError(IncrementalLoadError):
    """A declared layer could not refresh (its SELECT, keys or upstream); ``field`` names
    the declaration's field to change. Nothing was committed."""

    def __init__(self, layer: str, field: str, message: str, fix: str | None = None):
        self.table = layer
        self.field = field
        self.fix = fix
        text = f"layer '{layer}', field '{field}': {message}"
        Exception.__init__(self, f"{text} Fix: {fix}" if fix else text)


# A LayerError's text as __init__ writes it: what a streaming batch function raised comes
# back from Spark as text only (through Spark Connect, from another process).
_LAYER_ERROR = re.compile(
    r"layer '(?P<layer>[^']+)', field '(?P<field>[^']+)': (?P<message>.*?)(?: Fix: (?P<fix>.*))?$",
    re.DOTALL,
)


def layer_error_from_text(text: str) -> LayerError | None:
    """The :class:`LayerError` whose text ``text`` is (None: another text)."""
    found = _LAYER_ERROR.match(text.strip())
    if found is None:
        return None
    return LayerError(found["layer"], found["field"], found["message"], found["fix"])


class StreamCheckpointError(LayerError):
    """A streaming layer's checkpoint no longer matches its query or its table (a changed
    declaration or source, a deleted checkpoint or table). ``checkpoint``: where it is.
    Nothing was written; the fix is the layer's reset (docs/layers.md)."""

    def __init__(self, layer: str, field: str, checkpoint: str, message: str):
        self.checkpoint = checkpoint
        super().__init__(
            layer,
            field,
            f"{message} (checkpoint {checkpoint}). Nothing was written.",
            f"reset the layer, `incremental-assets reset-layer {layer}` (it empties the "
            "layer's table and its checkpoint), then materialize it again: it reads every "
            "file of the source folder anew; or undo the change",
        )


# Not about one table's load: Spark cannot start without the jars, or a session keeps a
# setting the engine needs; a landing folder that cannot be listed is turned into a
# SourceNotFoundError by the landing loader.


class JarsUnavailableError(RuntimeError):
    """Delta Lake's jars could not be found or fetched."""


class SessionSettingError(RuntimeError):
    """A Spark session keeps a setting the engine needs otherwise, after it was set: read
    back, it still holds ``actual`` where ``key`` must be ``wanted``. Nothing was run."""

    def __init__(self, key: str, actual: str | None, wanted: str, why: str):
        self.key, self.actual, self.wanted = key, actual, wanted
        super().__init__(
            f"the Spark session keeps {key}={actual} after the project set it to {wanted}: "
            f"{why}. Nothing was run. Fix: set {key}={wanted} in the configuration of the "
            "cluster or session the project is given, or let the project change it"
        )


class ConnectorSettingError(ValueError):
    """The object-store connectors asked for cannot be added (an unknown name, a Spark
    without its Hadoop jars); the message names the setting."""


class LandingListError(OSError):
    """The folder could not be listed (missing bucket, credentials, endpoint)."""


class SparkRemoteError(RuntimeError):
    """The Spark Connect server the project names cannot be reached, or went away during a
    run. Nothing was committed."""

    def __init__(self, url: str, setting: str, problem: str, fix: str):
        self.url, self.setting, self.fix = url, setting, fix
        super().__init__(f"the Spark Connect server {url} ({setting}) {problem}. Fix: {fix}")


class StoreAccessError(IncrementalLoadError):
    """An object store refused the run (engine/store_errors.py): ``kind`` is ``missing``
    (the bucket or container does not exist), ``refused`` (credentials) or ``unreachable``
    (its endpoint); ``path`` is the location concerned. Nothing was committed."""

    def __init__(self, table: str, kind: str, path: str, message: str, fix: str):
        self.kind = kind
        self.path = path
        super().__init__(table, message, fix)


class SparkMasterError(RuntimeError):
    """The standalone Spark master the project names cannot be reached
    (engine/spark/master.py). Nothing was started."""
