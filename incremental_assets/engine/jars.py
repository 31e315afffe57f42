"""Delta Lake's JVM jars for Spark: resolved once from Maven Central, then read from a cache.

The first session resolves ``io.delta:delta-spark_<scala>:<version>`` (the version of the
installed ``delta-spark`` Python package, so JVM and Python sides always match) with
Spark's own resolver (``spark.jars.packages``) into the cache, and writes a manifest of
the jar files it got. Later sessions load the manifest's files (``spark.jars``) and resolve
nothing remotely. When Spark's resolver cannot reach the repository, Maven (``mvn``) fetches
the same jars into the cache. A manifest names a jar of every package it is for: the jars of
a session ``getOrCreate`` hands back (its JVM started earlier, with other jars) are not
written as one, and a manifest without a package's jar is not read. Settings:

- ``INCREMENTAL_ASSETS_JARS``: a folder of jars to use instead (no resolution at all), or
  ``provided`` where the cluster already has Delta Lake (Databricks, a cluster image).
- ``INCREMENTAL_ASSETS_JAR_CACHE``: the cache folder (default
  ``~/.cache/incremental-assets/jars``).

The object-store connectors a project needs (engine/spark/connectors.py) arrive as
packages in ``spark.jars.packages`` and are resolved, cached and listed the same way. A
local session puts their self-contained AWS SDK jar on the driver's class path rather than
in ``spark.jars`` (:func:`placed`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse

from incremental_assets.engine.errors import JarsUnavailableError
from incremental_assets.engine.spark import connectors

SCALA = "2.13"
JARS_ENV = "INCREMENTAL_ASSETS_JARS"
CACHE_ENV = "INCREMENTAL_ASSETS_JAR_CACHE"


def delta_package() -> str:
    """The Maven coordinate of the delta-spark jar matching the installed Python package."""
    return f"io.delta:delta-spark_{SCALA}:{metadata.version('delta-spark')}"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "incremental-assets" / "jars"
    return Path(os.environ.get(CACHE_ENV) or default).expanduser()


@dataclass(frozen=True)
class JarPlan:
    """How a session gets its jars: ``conf`` to add to the session's settings;
    ``resolving`` when Spark will resolve packages remotely (say so, record afterwards)."""

    packages: tuple[str, ...]
    conf: dict[str, str] = field(default_factory=dict)
    resolving: bool = False
    manifest: Path | None = None


def plan(conf: dict[str, str]) -> JarPlan:
    """The jar settings for a session whose user settings are ``conf``: the user's own
    ``spark.jars.packages`` are resolved (and cached) together with Delta Lake's."""
    extra = tuple(p.strip() for p in conf.get("spark.jars.packages", "").split(",") if p.strip())
    packages = (delta_package(), *extra)
    user_jars = [j for j in conf.get("spark.jars", "").split(",") if j.strip()]
    chosen = os.environ.get(JARS_ENV, "").strip()
    if chosen == "provided":
        return JarPlan(packages, {})
    if chosen:
        folder = Path(chosen).expanduser()
        jars = sorted(str(p) for p in folder.glob("*.jar")) if folder.is_dir() else []
        if not jars:
            raise JarsUnavailableError(
                f"{JARS_ENV}={chosen} holds no .jar files. Fix: point it at a folder with "
                f"{packages[0]} and its dependencies, or unset it to fetch them once"
            )
        return JarPlan(packages, {"spark.jars": ",".join([*user_jars, *jars])})
    manifest = cache_dir() / f"manifest-{_digest(packages)}.txt"
    cached = _read_manifest(manifest, packages)
    if cached:
        return JarPlan(packages, {"spark.jars": ",".join([*user_jars, *cached])}, False, manifest)
    conf_out = {
        "spark.jars.packages": ",".join(packages),
        "spark.jars.ivy": str(cache_dir() / "ivy"),
    }
    return JarPlan(packages, conf_out, True, manifest)


def placed(conf: dict[str, str], jar_plan: JarPlan) -> dict[str, str]:
    """``conf`` with the plan's jar settings. A local session (whose executors share the
    driver's JVM) takes the connectors' self-contained jars on the driver's class path:
    Spark copies every ``spark.jars`` file into each session's temporary folder before its
    first task, 640 MB a start for the AWS SDK. Elsewhere executors need them shipped."""
    out = {**conf, **jar_plan.conf}
    if not out.get("spark.master", "local").startswith("local"):
        return out
    listed = [j for j in out.get("spark.jars", "").split(",") if j.strip()]
    driver = [j for j in listed if connectors.on_driver_class_path(j)]
    if not driver:
        return out
    shipped = [j for j in listed if j not in driver]
    if shipped:
        out["spark.jars"] = ",".join(shipped)
    else:
        out.pop("spark.jars")
    # A class path holds file paths, not URIs.
    paths = [urlparse(j).path if "://" in j else j for j in driver]
    own = out.get("spark.driver.extraClassPath")
    out["spark.driver.extraClassPath"] = os.pathsep.join([*([own] if own else []), *paths])
    return out


@contextlib.contextmanager
def resolving_alone() -> Iterator[None]:
    """Held while a process resolves jars into the cache: a second process starting at the
    same time (the first sessions of two Dagster runs on a fresh machine) waits, then reads the
    manifest the first one wrote instead of resolving into the same folders at once."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "resolving.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def announce(jar_plan: JarPlan) -> None:
    aws = any(p.startswith("org.apache.hadoop:hadoop-aws:") for p in jar_plan.packages)
    sys.stderr.write(
        f"Fetching Delta Lake's jars ({', '.join(jar_plan.packages)}) from Maven Central "
        f"into {cache_dir()}{' (the S3 connector brings the AWS SDK, ~640 MB)' if aws else ''}"
        "; this happens once, later starts read the cache.\n"
    )
    sys.stderr.flush()


def record(jar_plan: JarPlan, resolved_jars: str) -> None:
    """Write the manifest of jars Spark resolved: those of ``resolved_jars`` (the jars a
    session started with, comma-separated) that lie in the cache."""
    if jar_plan.manifest is None:
        return
    # Spark names the files by their real paths: the cache's, and its ivy folder's where
    # that links elsewhere (a home on another disk, an ivy cache shared by projects).
    roots = {cache_dir().resolve(), (cache_dir() / "ivy").resolve()}
    jars = [urlparse(j.strip()).path for j in resolved_jars.split(",") if j.strip()]
    jars = [
        j
        for j in jars
        if Path(j).is_file() and any(Path(j).resolve().is_relative_to(r) for r in roots)
    ]
    # A session this JVM already ran is handed back as it is (getOrCreate), with the jars
    # it started with: they are no list of the packages asked for, and are not recorded.
    if jars and all(usable(j) for j in jars) and not missing(jar_plan.packages, jars):
        _write_manifest(jar_plan.manifest, jars)


def fetch_with_maven(jar_plan: JarPlan) -> JarPlan:
    """Fetch the packages with ``mvn`` into the cache (when Spark's resolver cannot reach
    the repository) and return the plan that loads them from there."""
    if shutil.which("mvn") is None:
        raise unavailable(jar_plan, "Spark could not resolve them and mvn is not installed")
    out = cache_dir() / f"maven-{_digest(jar_plan.packages)}"
    dependencies = "".join(
        "<dependency><groupId>{}</groupId><artifactId>{}</artifactId><version>{}</version>"
        "</dependency>".format(*package.split(":")[:3])
        for package in jar_plan.packages
    )
    pom = (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>incremental-assets</groupId><artifactId>jars</artifactId>"
        f"<version>1</version><dependencies>{dependencies}</dependencies></project>"
    )
    for _ in range(2):
        done = _copy_with_maven(pom, out)
        jars = sorted(str(p) for p in out.glob("*.jar")) if out.is_dir() else []
        if done.returncode != 0 or not jars:
            detail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no jars"]
            raise unavailable(jar_plan, f"mvn failed too: {detail[0]}")
        broken = [j for j in jars if not usable(j)]
        if not broken:
            break
        # A jar cut short (a copy interrupted, a disk that filled): Maven leaves a copy it
        # finds there; removed, it is copied again from Maven's own checked repository.
        for jar in broken:
            Path(jar).unlink(missing_ok=True)
    else:
        raise unavailable(jar_plan, f"mvn left jars that are not whole: {', '.join(broken)}")
    assert jar_plan.manifest is not None
    _write_manifest(jar_plan.manifest, jars)
    return JarPlan(jar_plan.packages, {"spark.jars": ",".join(jars)}, False, jar_plan.manifest)


def _copy_with_maven(pom: str, out: Path) -> subprocess.CompletedProcess:
    """Maven's copy of the dependencies ``pom`` names into ``out`` (downloads checked
    against their checksums: one that does not match fails rather than being kept)."""
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "pom.xml").write_text(pom)
        return subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "--strict-checksums",
                "dependency:copy-dependencies",
                f"-DoutputDirectory={out}",
                "-DincludeScope=runtime",
            ],
            cwd=work,
            capture_output=True,
            text=True,
        )


def usable(jar: str | Path) -> bool:
    """Whether ``jar`` is there and whole: a jar cut short has no zip directory at its end,
    and a JVM given it finds none of its classes, failing only at their first use
    (``ClassNotFoundException``) rather than as it starts."""
    try:
        return zipfile.is_zipfile(jar)
    except OSError:
        return False


def unavailable(jar_plan: JarPlan, why: str) -> JarsUnavailableError:
    return JarsUnavailableError(
        f"Delta Lake's jars ({', '.join(jar_plan.packages)}) are not in the cache "
        f"{cache_dir()} and could not be fetched: {why}. Fix: allow access to Maven Central "
        f"once, or set {JARS_ENV} to a folder holding these jars (or to 'provided' where the "
        "cluster already has Delta Lake)"
    )


def _digest(packages: tuple[str, ...]) -> str:
    return hashlib.sha256(",".join(packages).encode()).hexdigest()[:12]


def missing(packages: tuple[str, ...], jars: list[str]) -> list[str]:
    """The ``group:artifact:version`` packages of which ``jars`` hold no file (Spark's
    resolver names one ``group_artifact-version.jar``, Maven ``artifact-version.jar``)."""
    names = [Path(j).name for j in jars]
    out = []
    for package in packages:
        artifact, version = [*package.split(":"), "", ""][1:3]
        stem = f"{artifact}-{version}"
        if not any(n.endswith(".jar") and (n.startswith(stem) or f"_{stem}" in n) for n in names):
            out.append(package)
    return out


def _read_manifest(path: Path, packages: tuple[str, ...]) -> list[str]:
    if not path.is_file():
        return []
    jars = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    # A jar gone or cut short since, or a package's jar never listed (a manifest written
    # before record() checked it): resolved again, rather than a session without it.
    if not jars or not all(usable(j) for j in jars) or missing(packages, jars):
        return []
    return jars


def _write_manifest(path: Path, jars: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text("\n".join(jars) + "\n")
    partial.replace(path)
