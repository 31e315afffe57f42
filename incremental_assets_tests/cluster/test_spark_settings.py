"""A project's Spark settings come from one function (engine/spark/settings.py), used by
the Dagster resource, the CLI and the demo: the object-store connectors are added only
for the schemes the project's paths use (or the setting names), at the Hadoop version of
pyspark's Spark; s3a takes its endpoint, region and addressing from the warehouse's
storage options and no credential from anywhere in the spec; a local session keeps the
AWS SDK on the driver's class path instead of copying it for each session."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.engine import jars
from incremental_assets.engine.errors import (
    ConnectorSettingError,
    SparkMasterError,
    SparkRemoteError,
)
from incremental_assets.engine.spark import connectors, cores, remote
from incremental_assets.engine.spark.settings import project_conf
from incremental_assets.engine.spark_session import (
    REQUIRED_CONF,
    SNAPSHOT_PARTITIONS,
    start_session,
)
from incremental_assets.specs import SpecError, load_project
from incremental_assets_tests.postgres import free_port

TABLE = """
  - name: orders
    source: {{format: delta, path: {source}}}
    keys: [id]
    watermark: {{column: updated_at, kind: timestamp}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
"""


def _project(tmp_path: Path, root: str, source: str = "./source", extra: str = ""):
    path = tmp_path / "tables.yaml"
    path.write_text(f"warehouse: {{root: {root}{extra}}}\ntables:{TABLE.format(source=source)}")
    return load_project(path)


@pytest.fixture(autouse=True)
def _no_connector_setting(monkeypatch):
    monkeypatch.delenv(connectors.CONNECTORS_ENV, raising=False)
    monkeypatch.delenv("INCREMENTAL_ASSETS_SPARK_MASTER", raising=False)
    monkeypatch.delenv(remote.REMOTE_ENV, raising=False)


def test_a_local_project_asks_for_no_connector(tmp_path):
    conf = project_conf(_project(tmp_path, "./warehouse"))

    assert "spark.jars.packages" not in conf
    assert not [key for key in conf if "s3" in key]


def test_an_s3_warehouse_adds_hadoop_aws_and_s3a_settings_from_storage_options(tmp_path):
    options = ", storage_options: {endpoint: 'http://minio:9000', region: eu-west-1}"
    conf = project_conf(_project(tmp_path, "s3://lake/warehouse", extra=options))

    version = connectors.hadoop_version()
    assert conf["spark.jars.packages"] == f"org.apache.hadoop:hadoop-aws:{version}"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert "DefaultCredentialsProvider" in conf["spark.hadoop.fs.s3a.aws.credentials.provider"]
    assert not [k for k in conf if k.endswith((".access.key", ".secret.key", ".session.token"))]


def test_the_version_of_hadoop_aws_is_the_one_of_pysparks_hadoop():
    import pyspark

    shipped = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))

    assert shipped
    assert shipped[-1].name == f"hadoop-client-api-{connectors.hadoop_version()}.jar"


def test_a_source_on_abfss_adds_hadoop_azure_and_the_setting_adds_s3(tmp_path, monkeypatch):
    source = "abfss://raw@account.dfs.core.windows.net/orders"
    project = _project(tmp_path, "./warehouse", source=source)

    assert project_conf(project)["spark.jars.packages"].split(",") == [
        f"org.apache.hadoop:hadoop-azure:{connectors.hadoop_version()}"
    ]
    monkeypatch.setenv(connectors.CONNECTORS_ENV, "s3")
    packages = project_conf(project)["spark.jars.packages"].split(",")
    assert [p.split(":")[1] for p in packages] == ["hadoop-azure", "hadoop-aws"]


def test_azure_blob_settings_come_from_storage_options_and_the_key_from_the_environment(
    tmp_path, monkeypatch
):
    blob = "az://lake@acct.blob.core.windows.net/w"
    source = "abfss://raw@other.dfs.core.windows.net/orders"
    monkeypatch.delenv(connectors.AZURE_KEY_ENV, raising=False)
    keyless = project_conf(_project(tmp_path, blob, source=source))
    monkeypatch.setenv(connectors.AZURE_KEY_ENV, "c2VjcmV0")
    keyed = project_conf(_project(tmp_path, blob, source=source))
    emulated = project_conf(
        _project(tmp_path, blob, extra=", storage_options: {use_emulator: 'true'}")
    )

    assert "hadoop-azure" in keyless["spark.jars.packages"]
    assert not [k for k in keyless if k.startswith("spark.hadoop.fs.azure")]
    assert {k: v for k, v in keyed.items() if k.startswith("spark.hadoop.fs.azure")} == {
        "spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net": "c2VjcmV0",
        "spark.hadoop.fs.azure.account.key.other.dfs.core.windows.net": "c2VjcmV0",
    }
    assert re.search(keyed["spark.redaction.regex"], "fs.azure.account.key.acct")
    assert emulated["spark.hadoop.fs.azure.storage.emulator.account.name"] == (
        "devstoreaccount1.blob.core.windows.net"
    )
    assert "c2VjcmV0" not in emulated.values()


def test_an_unknown_connector_name_is_refused_naming_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv(connectors.CONNECTORS_ENV, "s3,gcs")

    with pytest.raises(ConnectorSettingError, match=f"{connectors.CONNECTORS_ENV}=s3,gcs"):
        project_conf(_project(tmp_path, "./warehouse"))


def test_the_projects_own_spark_settings_win_over_the_connectors(tmp_path):
    path = tmp_path / "tables.yaml"
    path.write_text(
        "warehouse: {root: 's3a://lake/w', storage_options: {endpoint: 'http://a:1'}}\n"
        "spark:\n  conf:\n"
        "    spark.hadoop.fs.s3a.endpoint: 'http://b:2'\n"
        "    spark.jars.packages: org.apache.hadoop:hadoop-aws:3.4.1\n"
        f"tables:{TABLE.format(source='./source')}"
    )

    conf = project_conf(load_project(path))

    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://b:2"
    assert conf["spark.jars.packages"] == "org.apache.hadoop:hadoop-aws:3.4.1"


_WAREHOUSE = "warehouse: {root: ./warehouse}\n"


@pytest.mark.parametrize(
    ("master", "tasks"),
    [
        *[("local", "1"), ("local[2]", "2"), ("local[3,2]", "3"), ("local[16]", "8")],
        *[("spark://h:7077", "8"), ("yarn", "8"), ("local-cluster[2,1,1024]", "8")],
    ],
)
def test_delta_rebuilds_snapshots_in_as_many_tasks_as_a_local_master_has_cores(
    tmp_path, master, tasks
):
    path = tmp_path / "tables.yaml"
    path.write_text(
        f"{_WAREHOUSE}spark: {{master: '{master}'}}\ntables:{TABLE.format(source='./s')}"
    )

    conf = project_conf(load_project(path))

    assert conf[SNAPSHOT_PARTITIONS] == tasks


def test_local_star_counts_the_cores_this_process_may_use(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda root=None: None)
    path = tmp_path / "tables.yaml"
    path.write_text(
        f"{_WAREHOUSE}spark: {{master: 'local[*]'}}\ntables:{TABLE.format(source='./s')}"
    )

    assert project_conf(load_project(path))[SNAPSHOT_PARTITIONS] == "3"


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"cpu.max": "150000 100000\n"}, 2),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_a_containers_cpu_limit_bounds_local_star_as_it_bounds_the_jvm(
    tmp_path, monkeypatch, files, limit
):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)

    assert cores.cgroup_cpu_limit(tmp_path) == limit
    assert cores.usable_cores(tmp_path) == (16 if limit is None else limit)


def test_a_local_master_is_read_as_spark_reads_it():
    masters = ["local[4, 2]", "local[*,3]", "local[ 3 ]", "local [2]", "locally"]

    found = [cores.local_cores(m) for m in masters]

    assert found == [4, cores.usable_cores(), None, None, None]


def test_the_projects_snapshot_tasks_win_over_the_cores(tmp_path):
    path = tmp_path / "tables.yaml"
    path.write_text(
        f"{_WAREHOUSE}spark:\n  master: local[2]\n  conf: {{{SNAPSHOT_PARTITIONS}: '12'}}\n"
        f"tables:{TABLE.format(source='./s')}"
    )

    assert project_conf(load_project(path))[SNAPSHOT_PARTITIONS] == "12"


def test_the_dagster_resource_starts_spark_with_the_projects_settings(tmp_path):
    project = _project(tmp_path, "s3://lake/warehouse")

    config = build_definitions(project).resources["spark"].spark_config

    assert config == project_conf(project)
    assert "hadoop-aws" in config["spark.jars.packages"]


def test_a_local_session_keeps_the_aws_sdk_on_the_driver_class_path():
    bundle = "/cache/ivy/jars/software.amazon.awssdk_bundle-2.29.52.jar"
    delta = "/cache/ivy/jars/io.delta_delta-spark_2.13-4.3.1.jar"
    plan = jars.JarPlan(("p",), {"spark.jars": f"{delta},{bundle}"})

    local = jars.placed({"spark.master": "local[2]"}, plan)
    cluster = jars.placed({"spark.master": "spark://127.0.0.1:7077"}, plan)

    # Delta's jars stay in spark.jars (Spark's own jars come first for their dependencies).
    assert (local["spark.jars"], local["spark.driver.extraClassPath"]) == (delta, bundle)
    # Executors elsewhere need every jar shipped.
    assert cluster["spark.jars"] == f"{delta},{bundle}"
    assert "spark.driver.extraClassPath" not in cluster


def _remote_project(tmp_path: Path, spark: str):
    path = tmp_path / "tables.yaml"
    path.write_text(
        f"warehouse: {{root: 's3a://lake/w'}}\nspark:\n{spark}tables:{TABLE.format(source='./s')}"
    )
    return load_project(path)


def test_a_connect_server_takes_the_place_of_the_local_jvm(tmp_path, monkeypatch):
    spark = "  remote: sc://10.0.0.5:15002\n  conf: {spark.sql.shuffle.partitions: '4'}\n"
    project = _remote_project(tmp_path, spark)

    conf = project_conf(project)
    monkeypatch.setenv(remote.REMOTE_ENV, "sc://127.0.0.1:15003")
    from_environment = project_conf(project)

    # Jars, connectors, s3a settings and the master are the server's.
    assert conf == {
        "spark.remote": "sc://10.0.0.5:15002",
        "spark.sql.shuffle.partitions": "4",
        **REQUIRED_CONF,
    }
    assert from_environment["spark.remote"] == "sc://127.0.0.1:15003"


@pytest.mark.parametrize(
    ("spark", "says"),
    [
        ("  remote: sc://h:1\n  master: local[2]\n", "set spark.master"),
        ("  remote: 'sc://h:443/;token=dapi123'\n", "INCREMENTAL_ASSETS_SPARK_REMOTE instead"),
        ("  remote: 'http://h:1'\n", "not a Spark Connect URL"),
    ],
)
def test_a_bad_remote_setting_is_refused_at_load(tmp_path, spark, says):
    with pytest.raises(SpecError, match="remote") as info:
        _remote_project(tmp_path, spark)

    assert says in str(info.value)
    assert "dapi123" not in str(info.value)


def test_an_unreachable_connect_server_is_one_error_naming_the_setting():
    url = f"sc://127.0.0.1:{free_port()}"

    with pytest.raises(SparkRemoteError) as info:
        start_session({"spark.remote": url, **REQUIRED_CONF})

    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"the Spark Connect server {url} ({remote.SETTING}) cannot be reached"
    )
    assert "nothing was run" in message
    assert "Fix: start the server (./dev spark-server prints its URL)" in message


def test_an_unreachable_master_is_one_error_naming_the_setting_in_seconds():
    import time

    master = f"spark://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"  # with a standby
    started = time.monotonic()

    with pytest.raises(SparkMasterError) as info:
        start_session({"spark.master": master, **REQUIRED_CONF})

    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"the Spark master {master} (spark.master (tables file) / ")
    assert "INCREMENTAL_ASSETS_SPARK_MASTER) cannot be reached" in message
    assert "Connection refused" in message and "nothing was started" in message
    # Spark itself retries for about a minute before it gives up.
    assert time.monotonic() - started < 15
