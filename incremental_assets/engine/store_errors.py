"""An object store's refusal, from delta-rs (reading a table's log) or Spark's S3A and ABFS
connectors (reading and writing its files), as one line that names the table, the path,
the setting to change and what to do: a bucket or container that does not exist,
credentials the store refuses, or an endpoint nothing answers on. Instead of a retried
multi-line HTTP trace or a Java stack trace. Nothing was committed: these stop the run
before its commit, which is its last write.

The failure is told by its text, not its class: delta-rs raises OSError, a classic
session the JVM's exception, Spark Connect its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from incremental_assets.engine.errors import IncrementalLoadError, StoreAccessError

_MISSING = re.compile(
    r"NoSuchBucket|specified bucket does not exist|ContainerNotFound|"
    r"specified container does not exist",
    re.IGNORECASE,
)
_REFUSED = re.compile(
    r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|Access Denied|403 Forbidden|"
    r"ExpiredToken|InvalidToken|AuthenticationFailed|AuthorizationFailure|"
    r"NoAuthWithAWSException|No AWS Credentials|Unable to load (AWS )?credentials",
    re.IGNORECASE,
)
_UNREACHABLE = re.compile(
    r"Connection refused|UnknownHostException|Name or service not known|dns error|"
    r"failed to lookup address|Unable to execute HTTP request|tcp connect error",
    re.IGNORECASE,
)
_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>|\b(InvalidAccessKeyId|SignatureDoesNotMatch)\b")


@contextmanager
def naming_store_errors(table: str, locations: Mapping[str, tuple[str, str]]) -> Iterator[None]:
    """Turn an object store's refusal inside the block into a StoreAccessError naming the
    location it concerns; other failures pass through unchanged. ``locations``: what the
    run reads and writes on a store, as ``role -> (path, setting)``, e.g. ``"warehouse" ->
    ("s3://wh/orders", "warehouse.root")``; paths on local disk are ignored."""
    stores = {role: found for role, found in locations.items() if "://" in found[0]}
    if not stores:
        yield
        return
    try:
        yield
    except IncrementalLoadError:
        raise
    except Exception as exc:
        error = store_error(table, stores, str(exc))
        if error is None:
            raise
        raise error from None


def store_error(
    table: str, stores: Mapping[str, tuple[str, str]], text: str
) -> StoreAccessError | None:
    """The StoreAccessError that ``text`` (a failure's message) amounts to, or None."""
    kind = next((k for k, pattern in _KINDS if pattern.search(text)), None)
    concerned = _concerned(stores, text) if kind else None
    if concerned is None:
        return None
    role, (path, setting) = concerned
    bucket = _bucket(path)
    scheme = path.split("://", 1)[0].lower()
    if kind == "missing":
        return StoreAccessError(
            table,
            kind,
            path,
            f"the {_container(scheme)} '{bucket}' of its {role} {path} does not exist;"
            " nothing was written.",
            f"create it, or correct {setting}.",
        )
    if kind == "refused":
        code = _CODE.search(text)
        said = f" ({code.group(1) or code.group(2)})" if code else ""
        return StoreAccessError(
            table,
            kind,
            path,
            f"the object store refused the credentials for its {role} {path}{said};"
            " nothing was written.",
            f"{_credentials(scheme)} (never in the tables file), for this process and for"
            " Spark's executors, or grant them access to the "
            f"{_container(scheme)} '{bucket}'.",
        )
    return StoreAccessError(
        table,
        kind,
        path,
        f"the object store of its {role} {path} cannot be reached (nothing answered at its"
        " endpoint); nothing was written.",
        "check 'endpoint' in warehouse.storage_options (and any endpoint set in the spark"
        " settings by hand), or start the store.",
    )


_KINDS = (("missing", _MISSING), ("refused", _REFUSED), ("unreachable", _UNREACHABLE))


def _concerned(
    stores: Mapping[str, tuple[str, str]], text: str
) -> tuple[str, tuple[str, str]] | None:
    """The location whose bucket the failure names, or None: a failure that names none
    (a database's refused connection, say) is not told as the store's."""
    for role, found in stores.items():
        bucket = _bucket(found[0])
        if bucket and re.search(rf"(?<![\w.-]){re.escape(bucket)}(?![\w.-])", text):
            return role, found
    return None


def _bucket(path: str) -> str:
    authority = path.split("://", 1)[1].split("/", 1)[0]
    return authority.split("@", 1)[0]  # abfss://container@account.dfs...


def _container(scheme: str) -> str:
    return "bucket" if scheme.startswith("s3") or scheme == "gs" else "container"


def _credentials(scheme: str) -> str:
    if scheme.startswith("s3"):
        return (
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or a role of the"
            " default provider chain) in the environment"
        )
    return "set the storage account's key or SAS token in the environment"
