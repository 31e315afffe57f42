"""A class-data-sharing archive for the driver JVM of a session the project starts.

Every Dagster run starts its own Spark driver JVM, which loads and verifies the classes of
Spark, Delta Lake and Hadoop before its first query: measured here, a cold start plus a
small Delta MERGE took 17.9 s, and 10.7 s when the JVM mapped the classes an earlier
start had loaded from an archive (application class data sharing); a Dagster run of one
small table 23 s against 18 s.

One archive per Java and class path (Spark's jars, the driver's extra class path), kept
beside the jar cache (``~/.cache/incremental-assets/class-archives``):

- Java 19 and later write it and check it themselves (``-XX:+AutoCreateSharedArchive``);
- Java 13 to 18: a session started while there is none writes one as its JVM exits
  (``-XX:ArchiveClassesAtExit``, into a file of its own); when the Python process ends,
  it lets its JVM exit, waits for it, and moves the file into place. Every later start
  maps it (``-XX:SharedArchiveFile``). A JVM that finds the archive does not match its
  class path, or truncated, runs without it (``-Xshare:auto``, Java's default).

``INCREMENTAL_ASSETS_CLASS_ARCHIVE`` names another folder for them, or is ``off`` to turn
them off (a session's own ``-XX:SharedArchiveFile`` or ``-Xshare`` option in
``spark.driver.extraJavaOptions`` does too).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path

from incremental_assets.engine import jars

ARCHIVE_ENV = "INCREMENTAL_ASSETS_CLASS_ARCHIVE"
OPTIONS_KEY = "spark.driver.extraJavaOptions"
# A file being written by a JVM that died is left behind; one this old is removed.
STALE_SECONDS = 3600


OFF = {"off", "0", "false", "no"}


def folder() -> Path:
    """Where archives are kept: ``INCREMENTAL_ASSETS_CLASS_ARCHIVE`` when it names a
    folder, else beside the jar cache."""
    chosen = os.environ.get(ARCHIVE_ENV, "").strip()
    if chosen and chosen.lower() not in OFF:
        return Path(chosen).expanduser()
    return jars.cache_dir().parent / "class-archives"


@lru_cache(maxsize=4)
def java_version(java: str) -> int | None:
    """The feature version of ``java`` (17 for 17.0.15; 8 for 1.8.0), None when unknown."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    return shutil.which("java")


def _spark_jars() -> list[str]:
    """Spark's jars folder and its jars (name and size): an archive records the class
    path by absolute path, so two installations of the same Spark (two virtual
    environments) need one each, or the second's JVM refuses the first's at every start."""
    from pyspark.find_spark_home import _find_spark_home

    jars_dir = Path(_find_spark_home()) / "jars"
    if not jars_dir.is_dir():
        return []
    listed = sorted(f"{p.name}:{p.stat().st_size}" for p in jars_dir.iterdir())
    return [os.path.realpath(jars_dir), *listed]


def archive_path(conf: Mapping[str, str], java: str, version: int) -> Path:
    """The archive for a driver with ``conf``'s class path on ``java``."""
    identity = "\n".join(
        [
            os.path.realpath(java),
            str(version),
            conf.get("spark.driver.extraClassPath", ""),
            *_spark_jars(),
        ]
    )
    return folder() / f"{hashlib.sha256(identity.encode()).hexdigest()[:24]}.jsa"


def with_archive(conf: Mapping[str, str]) -> tuple[dict[str, str], Callable[[], None] | None]:
    """``conf`` with the JVM options that map (or write) the class archive, and what to
    call once the session has started (Java 13-18, when this start writes the archive:
    moves it into place at exit); ``conf`` unchanged when there is none to use."""
    out = dict(conf)
    own = out.get(OPTIONS_KEY, "")
    if os.environ.get(ARCHIVE_ENV, "").strip().lower() in OFF:
        return out, None
    if "SharedArchiveFile" in own or "-Xshare" in own or "ArchiveClassesAtExit" in own:
        return out, None
    java = _java()
    version = java_version(java) if java else None
    if java is None or version is None or version < 13:
        return out, None
    final = archive_path(out, java, version)
    final.parent.mkdir(parents=True, exist_ok=True)
    adopt = None
    if version >= 19:
        options = f"-XX:+AutoCreateSharedArchive -XX:SharedArchiveFile={final}"
    elif _whole(final):
        options = f"-XX:SharedArchiveFile={final}"
    else:
        _remove_stale(final)
        part = final.with_name(f"{final.stem}.{os.getpid()}.part")
        # Its warnings (classes it leaves out) would reach the run's output.
        options = f"-XX:ArchiveClassesAtExit={part} -Xlog:cds=off -Xlog:cds+dynamic=off"

        def adopt() -> None:
            atexit.register(_adopt_at_exit, part, final)

    out[OPTIONS_KEY] = f"{own} {options}".strip()
    return out, adopt


def _whole(final: Path) -> bool:
    """Whether ``final`` is there at the size it was adopted at: Java 17 maps an archive
    it finds cut short and fails on it (SIGBUS) instead of running without it."""
    try:
        return final.stat().st_size == int(_size_file(final).read_text())
    except (OSError, ValueError):
        return False


def _size_file(final: Path) -> Path:
    return final.with_suffix(".size")


def forget(conf: Mapping[str, str]) -> None:
    """Remove the archive ``conf``'s options name (a JVM failed to start with it)."""
    for option in conf.get(OPTIONS_KEY, "").split():
        if option.startswith("-XX:SharedArchiveFile="):
            final = Path(option.split("=", 1)[1])
            for path in (final, _size_file(final)):
                with contextlib.suppress(OSError):
                    path.unlink()


def _remove_stale(final: Path) -> None:
    now = time.time()
    for part in final.parent.glob(f"{final.stem}.*.part"):
        with contextlib.suppress(OSError):
            if now - part.stat().st_mtime > STALE_SECONDS:
                part.unlink()


def _adopt_at_exit(part: Path, final: Path) -> None:
    """Let the driver JVM exit (it writes the archive as it does), wait for it, then move
    the archive into place; a JVM that did not exit cleanly leaves nothing adopted."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    try:
        if proc is None or proc.stdin is None:
            return
        # Stopped first, so the accumulator server sees no JVM vanish under it (it would
        # print a traceback) and Spark shuts down as it does on a session's stop().
        active = SparkContext._active_spark_context
        if active is not None:
            with contextlib.suppress(Exception):
                active.stop()
        # The gateway exits when its standard input ends, as when Python exits.
        with contextlib.suppress(OSError):
            proc.stdin.close()
        proc.wait(timeout=300)
        if proc.returncode == 0 and part.exists() and part.stat().st_size > 0:
            _size_file(final).write_text(str(part.stat().st_size))
            os.replace(part, final)
    except Exception:  # best effort: the next start writes one again
        pass
    finally:
        with contextlib.suppress(OSError):
            part.unlink()
