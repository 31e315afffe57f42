"""The driver JVM's class archive (engine/spark/class_archive.py): which JVM options a
session start gets, by Java version and by what the archive folder holds; and a real
start that records one at exit, then a start that maps it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from incremental_assets.engine import jars
from incremental_assets.engine.spark import class_archive

CONF = {"spark.driver.extraClassPath": "/jars/hadoop-aws.jar"}


@pytest.fixture
def archives(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(jars.CACHE_ENV, str(tmp_path / "jars"))
    monkeypatch.delenv(class_archive.ARCHIVE_ENV, raising=False)
    return tmp_path / "class-archives"


def on_java(monkeypatch, version: int) -> None:
    monkeypatch.setattr(class_archive, "java_version", lambda java: version)


def options(conf: dict[str, str]) -> str:
    return conf.get(class_archive.OPTIONS_KEY, "")


def test_java_17_without_an_archive_records_one_and_adopts_it_at_exit(archives, monkeypatch):
    on_java(monkeypatch, 17)
    conf, started = class_archive.with_archive(CONF)
    assert "-XX:ArchiveClassesAtExit=" in options(conf)
    assert str(archives) in options(conf) and "-Xlog:cds=off" in options(conf)
    assert started is not None  # registers the adoption at exit


def test_java_17_maps_a_whole_archive_and_records_over_one_cut_short(archives, monkeypatch):
    on_java(monkeypatch, 17)
    java = class_archive._java()
    final = class_archive.archive_path(CONF, java, 17)
    final.parent.mkdir(parents=True)
    final.write_bytes(b"x" * 100)
    final.with_suffix(".size").write_text("100")

    conf, started = class_archive.with_archive(CONF)
    assert options(conf) == f"-XX:SharedArchiveFile={final}" and started is None

    final.write_bytes(b"x" * 60)  # cut short: Java 17 would fail on it
    conf, started = class_archive.with_archive(CONF)
    assert "-XX:ArchiveClassesAtExit=" in options(conf) and started is not None


def test_java_19_and_later_keep_the_archive_themselves(archives, monkeypatch):
    on_java(monkeypatch, 21)
    conf, started = class_archive.with_archive(CONF)
    assert "-XX:+AutoCreateSharedArchive -XX:SharedArchiveFile=" in options(conf)
    assert started is None


@pytest.mark.parametrize(
    ("own", "env", "version"),
    [
        ("-Xshare:off", "", 17),  # the session's own choice
        ("-XX:SharedArchiveFile=/elsewhere.jsa", "", 17),
        ("", "off", 17),  # INCREMENTAL_ASSETS_CLASS_ARCHIVE=off
        ("", "", 11),  # no dynamic archives before Java 13
        ("", "", None),  # Java's version unknown
    ],
)
def test_no_archive_when_the_session_or_java_says_so(archives, monkeypatch, own, env, version):
    on_java(monkeypatch, version)
    monkeypatch.setenv(class_archive.ARCHIVE_ENV, env)
    conf = {**CONF, **({class_archive.OPTIONS_KEY: own} if own else {})}
    assert class_archive.with_archive(conf) == (conf, None)


def test_an_archive_a_jvm_failed_on_is_forgotten(archives, monkeypatch):
    on_java(monkeypatch, 17)
    final = class_archive.archive_path(CONF, class_archive._java(), 17)
    final.parent.mkdir(parents=True)
    final.write_bytes(b"x" * 10)
    final.with_suffix(".size").write_text("10")
    conf, _ = class_archive.with_archive(CONF)

    class_archive.forget(conf)

    assert not final.exists() and not final.with_suffix(".size").exists()


def test_the_archive_follows_the_class_path(archives, monkeypatch):
    java = class_archive._java()
    other = {"spark.driver.extraClassPath": "/jars/hadoop-azure.jar"}
    assert class_archive.archive_path(CONF, java, 17) != class_archive.archive_path(other, java, 17)
    assert class_archive.archive_path(CONF, java, 17) != class_archive.archive_path(CONF, java, 21)


def test_the_archive_follows_where_sparks_jars_are(archives, monkeypatch, tmp_path):
    """Two virtual environments with the same Spark: the class path differs by its
    folder, and a JVM refuses an archive recorded with another."""
    import pyspark.find_spark_home as spark_home

    java = class_archive._java()
    here = class_archive.archive_path(CONF, java, 17)
    copy = tmp_path / "other-venv" / "pyspark"
    (copy / "jars").mkdir(parents=True)
    for jar in (Path(spark_home._find_spark_home()) / "jars").iterdir():
        (copy / "jars" / jar.name).touch()
        os.truncate(copy / "jars" / jar.name, jar.stat().st_size)  # same size, no data
    monkeypatch.setattr(spark_home, "_find_spark_home", lambda: str(copy))
    assert class_archive.archive_path(CONF, java, 17) != here


START = """
import sys
from incremental_assets.engine.spark_session import local_session
spark = local_session("class-archive-test", **dict(a.split("=", 1) for a in sys.argv[2:]))
spark.range(3).write.format("delta").mode("overwrite").save(sys.argv[1])
print("ROWS", spark.read.format("delta").load(sys.argv[1]).count())
# Python tasks: the JVM then holds a connection to PySpark's accumulator server.
print("SUM", spark.range(4).rdd.map(lambda row: row.id).sum())
"""


def _start(tmp_path: Path, *conf: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", START, str(tmp_path / "table"), *conf],
        env={
            **os.environ,
            class_archive.ARCHIVE_ENV: str(tmp_path / "archives"),
            "SPARK_LOCAL_IP": "127.0.0.1",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_real_start_records_the_archive_at_exit_and_the_next_start_maps_it(tmp_path):
    java = class_archive._java()
    version = class_archive.java_version(java) if java else None
    if version is None or version < 13:
        pytest.skip(f"Java {version} has no dynamic class archives (Java 13 and later do)")
    first = _start(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "ROWS 3" in first.stdout and "SUM 6" in first.stdout
    # The JVM was let go cleanly: nothing in the run's output says otherwise.
    assert "Traceback" not in first.stderr, first.stderr[-3000:]
    [archive] = (tmp_path / "archives").glob("*.jsa")
    assert not list((tmp_path / "archives").glob("*.part"))
    if version < 19:
        assert int(archive.with_suffix(".size").read_text()) == archive.stat().st_size

    log = tmp_path / "classes.log"
    second = _start(tmp_path, f"{class_archive.OPTIONS_KEY}=-Xlog:class+load=info:file={log}")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "ROWS 3" in second.stdout
    # Delta Lake's classes came from the archive the first start recorded.
    loaded = log.read_text()
    assert "org.apache.spark.sql.delta.DeltaLog source: shared objects file (top)" in loaded
    assert [archive] == list((tmp_path / "archives").glob("*.jsa"))


def test_the_folder_can_be_named(archives, monkeypatch, tmp_path):
    monkeypatch.setenv(class_archive.ARCHIVE_ENV, str(tmp_path / "elsewhere"))
    on_java(monkeypatch, 17)
    conf, _ = class_archive.with_archive(CONF)
    assert f"-XX:ArchiveClassesAtExit={tmp_path / 'elsewhere'}" in options(conf)
