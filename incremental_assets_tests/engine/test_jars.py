"""Delta Lake's jars: fetched once, then read from the cache; a folder of local jars works
with no network; no network and no cache gives one error naming the setting; Maven fetches
them when Spark's resolver cannot."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

from incremental_assets.engine import jars
from incremental_assets.engine.errors import JarsUnavailableError
from incremental_assets.engine.spark import class_archive, connectors
from incremental_assets.engine.spark_session import ConnectorsMissingWarning, start_session
from incremental_assets_tests.servers import QUICK_JIT

START = """
import sys
import zipfile
from incremental_assets.engine.spark_session import local_session
from incremental_assets.engine.errors import JarsUnavailableError
try:
    spark = local_session("jars-test", **dict(a.split("=", 1) for a in sys.argv[2:]))
except JarsUnavailableError as exc:
    print(f"UNAVAILABLE {exc}")
    sys.exit(3)
spark.range(3).write.format("delta").save(sys.argv[1])
print("ROWS", spark.read.format("delta").load(sys.argv[1]).count())
print("JARS", spark.sparkContext.getConf().get("spark.jars", ""))
"""


def _offline() -> list[str]:
    """A command prefix that runs without a network (a network namespace of its own)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed: cannot take the network away")
    if shutil.which("ip") is None:
        pytest.skip("ip (iproute2) is not installed: cannot bring up loopback offline")
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -n needs root (or user namespaces) on this machine")
    # Only the loopback interface, brought up for Spark's driver.
    return ["unshare", "-n", "sh", "-c", 'ip link set lo up 2>/dev/null; exec "$@"', "offline"]


def _start(
    tmp_path: Path, env: dict[str, str], *conf: str, prefix=()
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, sys.executable, "-c", START, str(tmp_path / "table"), *conf],
        env={
            **os.environ,
            # A home of its own: no ~/.ivy2 or ~/.m2 (Maven's local repository is a cache
            # too, and Java takes the home from user.home, not HOME).
            "HOME": str(tmp_path / "home"),
            "MAVEN_OPTS": f"-Duser.home={tmp_path / 'home'}",
            "SPARK_LOCAL_IP": "127.0.0.1",
            # Its jars (and so its class path) are its own: a class archive recorded for
            # them would serve no other start (engine/spark/class_archive.py).
            class_archive.ARCHIVE_ENV: "off",
            # Its JVMs (Spark's, Maven's) start, run a few statements and exit: the quick
            # JIT compiler, as the tests' other child runs have.
            "JAVA_TOOL_OPTIONS": QUICK_JIT,
            **env,
        },
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_second_start_resolves_nothing(spark):
    plan = jars.plan({})

    assert not plan.resolving
    assert "spark.jars.packages" not in plan.conf
    files = plan.conf["spark.jars"].split(",")
    # Spark's resolver names it io.delta_delta-spark_2.13-4.3.1.jar, Maven without the group.
    assert any(Path(f).name.endswith("delta-spark_2.13-4.3.1.jar") for f in files)
    assert all(Path(f).is_file() for f in files)
    assert jars.delta_package() == "io.delta:delta-spark_2.13:4.3.1"


def test_a_folder_of_local_jars_starts_delta_with_no_network(spark, tmp_path):
    folder = tmp_path / "jars"
    folder.mkdir()
    for jar in jars.plan({}).conf["spark.jars"].split(","):
        shutil.copy(jar, folder)

    done = _start(tmp_path, {jars.JARS_ENV: str(folder)}, prefix=_offline())

    assert "ROWS 3" in done.stdout, done.stderr[-2000:]
    assert "Fetching" not in done.stderr


def test_no_network_and_no_cache_gives_one_error_naming_the_setting(tmp_path):
    done = _start(tmp_path, {jars.CACHE_ENV: str(tmp_path / "cache")}, prefix=_offline())

    assert done.returncode == 3, done.stderr[-2000:]
    assert "Fetching Delta Lake's jars (io.delta:delta-spark_2.13:4.3.1)" in done.stderr
    message = done.stdout
    assert "are not in the cache" in message
    assert f"set {jars.JARS_ENV} to a folder holding these jars" in message


def test_an_empty_jars_folder_is_refused_naming_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv(jars.JARS_ENV, str(tmp_path))

    with pytest.raises(JarsUnavailableError, match=f"{jars.JARS_ENV}=.* holds no .jar"):
        jars.plan({})


def test_maven_fetches_the_jars_when_sparks_resolver_cannot(tmp_path):
    if shutil.which("mvn") is None:
        pytest.skip("mvn is not installed")
    broken = tmp_path / "ivysettings.xml"
    broken.write_text("<ivysettings><resolvers></resolvers></ivysettings>")
    cache = tmp_path / "cache"
    driver = _jar(tmp_path / "driver.jar")  # the user's own jar, a JDBC driver's say

    done = _start(
        tmp_path,
        {jars.CACHE_ENV: str(cache)},
        f"spark.jars.ivySettings={broken}",
        f"spark.jars={driver}",
    )

    assert "ROWS 3" in done.stdout, (done.stdout + done.stderr)[-3000:]
    manifest = next(cache.glob("manifest-*.txt")).read_text().split()
    assert any("maven-" in line and "delta-spark_2.13-4.3.1.jar" in line for line in manifest)
    # Kept beside the fetched jars, not replaced by them.
    assert driver in done.stdout.split("JARS ", 1)[1], done.stdout


def test_jars_spark_resolves_beside_the_users_own_are_recorded(spark, tmp_path):
    """A first start with a jar of the user's own (a JDBC driver's) and Delta Lake's
    package, resolved by Spark: spark-submit keeps what it resolved in
    spark.repl.local.jars, as the user's spark.jars, set again as the session starts,
    replaces the merged list. Recorded from there, the next start reads the cache instead
    of resolving again (a Spark Connect server's first start needs the record). Resolved
    with no network, from the tests' own ivy cache, linked into a cache of its own."""
    ivy = jars.cache_dir() / "ivy"
    group, artifact, version = jars.delta_package().split(":")
    if not (ivy / "jars" / f"{group}_{artifact}-{version}.jar").is_file():
        pytest.skip(
            "the tests' jars came from Maven, not Spark's resolver: no ivy cache to resolve "
            "Delta Lake from offline"
        )
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "ivy").symlink_to(ivy.resolve())
    driver = _jar(tmp_path / "driver.jar")
    env = {jars.CACHE_ENV: str(cache)}

    # No other process resolves into the tests' ivy cache meanwhile.
    with jars.resolving_alone():
        first = _start(tmp_path, env, f"spark.jars={driver}", prefix=_offline())
    shutil.rmtree(tmp_path / "table")
    again = _start(tmp_path, env, f"spark.jars={driver}", prefix=_offline())

    assert "ROWS 3" in first.stdout, (first.stdout + first.stderr)[-3000:]
    assert "Fetching Delta Lake's jars" in first.stderr
    recorded = next(cache.glob("manifest-*.txt")).read_text().split()
    assert any(Path(j).name == f"{group}_{artifact}-{version}.jar" for j in recorded)
    assert driver not in recorded
    assert "ROWS 3" in again.stdout, (again.stdout + again.stderr)[-3000:]
    assert "Fetching" not in again.stderr
    listed = again.stdout.split("JARS ", 1)[1]
    assert driver in listed and f"{group}_{artifact}-{version}.jar" in listed


def _jar(path: Path, cut: bool = False) -> str:
    """A small jar at ``path``; ``cut``: its first half only, as a copy interrupted leaves."""
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr("org/example/Thing.class", b"\xca\xfe\xba\xbe" + bytes(4000))
    if cut:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return str(path)


def test_a_cached_jar_cut_short_is_fetched_again_rather_than_loaded(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv(jars.CACHE_ENV, str(cache))
    monkeypatch.delenv(jars.JARS_ENV, raising=False)
    manifest = jars.plan({}).manifest
    delta = jars.delta_package().split(":")
    whole = _jar(tmp_path / f"{delta[0]}_{delta[1]}-{delta[2]}.jar")
    cut = _jar(tmp_path / "cut.jar", cut=True)

    manifest.write_text(f"{whole}\n")
    assert not jars.plan({}).resolving
    manifest.write_text(f"{whole}\n{cut}\n")
    # The JVM would start with it and fail at the first use of one of its classes.
    assert jars.plan({}).resolving
    assert not jars.usable(cut) and not jars.usable(tmp_path / "gone.jar")


def test_jars_of_a_session_already_running_are_not_recorded_for_other_packages(
    tmp_path, monkeypatch
):
    """A session asked for with the Azure connector in a JVM already running Delta alone is
    handed back as it is (getOrCreate): its jars are not the connector's, and recorded as
    its manifest they would start every later session without it (ClassNotFoundException
    at the first wasb path)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(jars.CACHE_ENV, str(cache))
    monkeypatch.delenv(jars.JARS_ENV, raising=False)
    ivy = cache / "ivy" / "jars"
    ivy.mkdir(parents=True)
    delta = jars.delta_package().split(":")
    delta_jar = _jar(ivy / f"{delta[0]}_{delta[1]}-{delta[2]}.jar")
    azure = {"spark.jars.packages": "org.apache.hadoop:hadoop-azure:3.4.2"}
    plan = jars.plan(azure)
    assert plan.resolving

    jars.record(plan, f"file://{delta_jar}")

    assert not plan.manifest.exists()
    assert jars.plan(azure).resolving
    # A manifest written so before this check is not read either: resolved again.
    plan.manifest.write_text(f"{delta_jar}\n")
    assert jars.plan(azure).resolving
    # With the connector's jar listed, it is recorded and read.
    azure_jar = _jar(ivy / "org.apache.hadoop_hadoop-azure-3.4.2.jar")
    jars.record(plan, f"file://{delta_jar},file://{azure_jar}")
    cached = jars.plan(azure)
    assert not cached.resolving
    assert cached.conf["spark.jars"].split(",") == [delta_jar, azure_jar]
    assert jars.missing(plan.packages, [delta_jar]) == ["org.apache.hadoop:hadoop-azure:3.4.2"]


def test_maven_copies_again_a_jar_it_left_cut_short(tmp_path, monkeypatch):
    if shutil.which("mvn") is None:
        pytest.skip("mvn is not installed")
    monkeypatch.setenv(jars.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(jars.JARS_ENV, raising=False)
    plan = jars.plan({})
    first = jars.fetch_with_maven(plan)
    delta = next(j for j in first.conf["spark.jars"].split(",") if "delta-spark" in j)
    size = Path(delta).stat().st_size
    # Cut short and newer than Maven's own copy: Maven alone would leave it as it is.
    Path(delta).write_bytes(Path(delta).read_bytes()[: size // 2])

    again = jars.fetch_with_maven(plan)

    assert Path(delta).stat().st_size == size
    listed = again.conf["spark.jars"].split(",")
    assert delta in listed and all(jars.usable(j) for j in listed)


def test_a_running_session_without_a_connector_asked_for_warns_naming_it(spark):
    """The tests' session started with the S3 connector: asked for again with it, nothing
    to say; asked for with Azure's, it is handed back as it is and the warning names
    hadoop-azure (a wasb path would fail later with ClassNotFoundException)."""
    aws = connectors.CONNECTORS["s3"].packages()
    azure = connectors.CONNECTORS["azure"].packages()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConnectorsMissingWarning)
        same = start_session({"spark.jars.packages": ",".join(aws)})

    with pytest.warns(ConnectorsMissingWarning, match=r"no org\.apache\.hadoop:hadoop-azure:"):
        handed = start_session({"spark.jars.packages": ",".join(azure)})

    assert same is spark and handed is spark
