"""Hadoop's object-store connectors for Spark: which ones a project needs, their Maven
packages, the jar a local session keeps on the driver's class path, and the s3a settings.

- **Which**: a connector is added when a path of the project (warehouse root, targets,
  sources, landing folders) uses one of its schemes, or when ``INCREMENTAL_ASSETS_CONNECTORS``
  names it (``s3``, ``azure``, comma-separated), so a project without S3 never fetches the
  AWS SDK (~640 MB).
- **Packages**: ``org.apache.hadoop:hadoop-aws`` / ``hadoop-azure`` at the Hadoop version
  of the Spark distribution pyspark runs (its ``hadoop-client-api`` jar): a connector built
  for another Hadoop fails at run time. hadoop-aws brings the AWS SDK v2 bundle it was
  built with. They are resolved and cached with Delta Lake's jars (engine/jars.py).
- **Settings** (s3a): ``s3://`` and ``s3n://`` paths are read by S3A too (delta-rs and AWS
  spell them ``s3://``); the endpoint, region, path-style access and plain http come from
  the warehouse's ``storage_options`` (the keys delta-rs reads); credentials never do:
  S3A takes them from the standard AWS environment variables, a profile, web identity or
  the instance (the AWS SDK's default chain).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from incremental_assets.engine.errors import ConnectorSettingError

CONNECTORS_ENV = "INCREMENTAL_ASSETS_CONNECTORS"

S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"
# The AWS SDK's default chain (environment, system properties, web identity, profile,
# container, instance) after Hadoop's own two (fs.s3a.session.token / fs.s3a.access.key,
# which a cluster's core-site.xml may set): Hadoop's default stops at the environment
# and the instance, missing profiles and Kubernetes' web identity.
S3A_CREDENTIALS = ",".join(
    (
        "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
        "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
    )
)

AZURE_KEY_ENV = "AZURE_STORAGE_ACCOUNT_KEY"
# Azurite's one account, the emulator's default in delta-rs and Azure's SDKs.
AZURE_EMULATOR_ACCOUNT = "devstoreaccount1"
# Spark's default redaction pattern, plus Hadoop's Azure account keys, which it misses:
# a key given as a setting would otherwise show in the Spark UI and its event logs.
REDACTION = r"(?i)secret|password|token|access[.]?key|account[.]key"


@dataclass(frozen=True)
class Connector:
    """One Hadoop file-system connector: the schemes it serves, its Hadoop artifact, and
    the jars (by file name) that a local session puts on the driver's class path instead
    of handing them to Spark's ``spark.jars``, which copies every jar into each session's
    temporary folder (640 MB a start for the AWS SDK). Only self-contained (shaded) jars
    qualify: the driver's class path comes before Spark's own jars."""

    name: str
    schemes: tuple[str, ...]
    artifact: str
    class_path_jars: re.Pattern[str] | None = None

    def packages(self) -> tuple[str, ...]:
        return (f"org.apache.hadoop:{self.artifact}:{hadoop_version()}",)


CONNECTORS: dict[str, Connector] = {
    "s3": Connector(
        "s3",
        ("s3a", "s3", "s3n"),
        "hadoop-aws",
        # Ivy names it software.amazon.awssdk_bundle-<v>.jar, Maven bundle-<v>.jar.
        re.compile(r"^(software\.amazon\.awssdk_)?bundle-[0-9][0-9.]*\.jar$"),
    ),
    "azure": Connector("azure", ("abfs", "abfss", "wasb", "wasbs", "az"), "hadoop-azure"),
}


def hadoop_version() -> str:
    """The Hadoop version of the Spark distribution pyspark runs (``$SPARK_HOME/jars`` when
    set, else pyspark's own jars), read from its ``hadoop-client-api`` jar."""
    home = os.environ.get("SPARK_HOME")
    if home:
        folder = Path(home) / "jars"
    else:
        import pyspark

        folder = Path(pyspark.__file__).parent / "jars"
    found = sorted(folder.glob("hadoop-client-api-*.jar"))
    if not found:
        raise ConnectorSettingError(
            f"cannot tell the Hadoop version of Spark: no hadoop-client-api jar in {folder}. "
            "Fix: install pyspark with its jars (or set SPARK_HOME to a Spark distribution), "
            "or set INCREMENTAL_ASSETS_JARS=provided where the cluster has the connectors"
        )
    return found[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def scheme(path: str) -> str:
    """The URI scheme of ``path`` in lower case; '' for a local path."""
    parsed = urlparse(str(path))
    # A Windows drive letter (C:\...) is not a scheme.
    return parsed.scheme.lower() if len(parsed.scheme) > 1 else ""


def needed(paths: Iterable[str], asked: str | None = None) -> tuple[Connector, ...]:
    """The connectors the ``paths`` use, plus those ``asked`` names (default: the
    ``INCREMENTAL_ASSETS_CONNECTORS`` environment variable), in a fixed order."""
    asked = os.environ.get(CONNECTORS_ENV, "") if asked is None else asked
    names = {n.strip().lower() for n in asked.split(",") if n.strip()}
    unknown = sorted(names - set(CONNECTORS))
    if unknown:
        raise ConnectorSettingError(
            f"{CONNECTORS_ENV}={asked}: unknown connector {', '.join(unknown)}. "
            f"Fix: name only {', '.join(sorted(CONNECTORS))} (comma-separated), or unset it"
        )
    used = {scheme(p) for p in paths}
    return tuple(
        c for name, c in sorted(CONNECTORS.items()) if name in names or used & set(c.schemes)
    )


def with_connectors(
    conf: Mapping[str, str],
    connectors: Iterable[Connector],
    storage_options: Mapping[str, str] | None = None,
    paths: Iterable[str] = (),
) -> dict[str, str]:
    """``conf`` with the connectors' packages added to ``spark.jars.packages`` (unless it
    already names the artifact, at any version) and their settings (from the warehouse's
    ``storage_options`` and the project's ``paths``) added where ``conf`` has none of its
    own."""
    out = dict(conf)
    listed = [p.strip() for p in out.get("spark.jars.packages", "").split(",") if p.strip()]
    given = {":".join(p.split(":")[:2]) for p in listed}
    settings: dict[str, str] = {}
    for connector in connectors:
        for package in connector.packages():
            if ":".join(package.split(":")[:2]) not in given:
                listed.append(package)
        if connector.name == "s3":
            settings.update(s3a_conf(storage_options or {}))
        if connector.name == "azure":
            settings.update(azure_conf(storage_options or {}, paths))
    if listed:
        out["spark.jars.packages"] = ",".join(listed)
    return {**settings, **out}


def s3a_conf(storage_options: Mapping[str, str]) -> dict[str, str]:
    """S3A's settings from delta-rs storage options (keys in any case, with or without the
    ``aws_`` prefix): ``endpoint``, ``region``, ``allow_http``,
    ``virtual_hosted_style_request``. No credential is read from them."""
    options = {k.lower().removeprefix("aws_"): str(v) for k, v in storage_options.items()}
    conf = {
        "spark.hadoop.fs.s3.impl": S3A,
        "spark.hadoop.fs.s3n.impl": S3A,
        # FileContext (streaming checkpoints) resolves schemes through these instead.
        "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A",
        "spark.hadoop.fs.AbstractFileSystem.s3n.impl": "org.apache.hadoop.fs.s3a.S3A",
        "spark.hadoop.fs.s3a.aws.credentials.provider": S3A_CREDENTIALS,
    }
    endpoint = options.get("endpoint") or options.get("endpoint_url")
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
    region = options.get("region") or options.get("default_region")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    virtual = options.get("virtual_hosted_style_request")
    # delta-rs addresses buckets by path unless told otherwise; S3A by host name. An
    # endpoint of one's own (MinIO, an S3-compatible store) is usually path-style only.
    if virtual is not None:
        conf["spark.hadoop.fs.s3a.path.style.access"] = str(not _true(virtual)).lower()
    elif endpoint:
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
    if _true(options.get("allow_http", "false")):
        # An endpoint written without http:// or https:// is then reached over http.
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
    return conf


def azure_conf(storage_options: Mapping[str, str], paths: Iterable[str]) -> dict[str, str]:
    """hadoop-azure's settings from delta-rs storage options (keys in any case, with or
    without the ``azure_storage_`` / ``azure_`` prefix) and the project's paths: the
    account key of each account the paths name (``container@host``), from the
    ``AZURE_STORAGE_ACCOUNT_KEY`` environment variable; with ``use_emulator``, the
    account wasb sends to the local emulator instead (hadoop-azure's emulator mode)."""
    options = {
        k.lower().removeprefix("azure_storage_").removeprefix("azure_"): str(v)
        for k, v in storage_options.items()
    }
    conf: dict[str, str] = {}
    if _true(options.get("use_emulator", "false")):
        account = options.get("account_name") or AZURE_EMULATOR_ACCOUNT
        # wasb sends this account's requests to 127.0.0.1:10000 with the emulator's key,
        # as delta-rs's use_emulator does; the name is the host of the project's URLs.
        conf["spark.hadoop.fs.azure.storage.emulator.account.name"] = (
            f"{account}.blob.core.windows.net"
        )
        return conf
    key = os.environ.get(AZURE_KEY_ENV)
    if not key:
        return conf  # a cluster's core-site.xml or credential provider may hold the keys
    for url in (urlparse(str(p)) for p in paths):
        if url.scheme.lower() in CONNECTORS["azure"].schemes and "@" in url.netloc:
            conf[f"spark.hadoop.fs.azure.account.key.{url.hostname}"] = key
    if conf:
        conf["spark.redaction.regex"] = REDACTION
    return conf


def on_driver_class_path(jar: str) -> bool:
    """Whether a local session should put ``jar`` on the driver's class path (see
    :class:`Connector`)."""
    name = Path(urlparse(jar).path if "://" in jar else jar).name
    return any(c.class_path_jars and c.class_path_jars.match(name) for c in CONNECTORS.values())


def _true(value: str) -> bool:
    return value.strip().lower() in ("true", "1", "yes")
