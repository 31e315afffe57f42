"""Runtime cases that ended unclearly (issue 23): a full disk, a table name too long for
the folders named after it, JDBC URL parameters that load classes, and SSL settings that
do not fit the server. Each now ends in one line that names the table, the setting or
location, and the fix, with nothing committed.

A full disk is real: a small tmpfs mounted for the test (root only; elsewhere the tests
skip, and fail on CI), filled up to a few hundred KiB before the run that needs more.
The databases are real PostgreSQL servers (incremental_assets_tests/postgres.py), one of
them serving only SSL with a certificate made here by openssl.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import string
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from deltalake import DeltaTable
from pydantic import SecretStr

from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.engine import DeltaTarget, run_load
from incremental_assets.engine.errors import (
    ConnectionSettingError,
    DiskFullError,
    SourceAccessError,
)
from incremental_assets.engine.landing import run_landing_load
from incremental_assets.engine.sources.jdbc import JdbcSource
from incremental_assets.specs import SpecError, TableSpec, load_project
from incremental_assets.specs.models import ConnectionSpec
from incremental_assets.specs.names import MAX_TABLE_NAME, NAME_BYTES
from incremental_assets_tests.builders import (
    PROJECT_ROOT,
    DeltaSourceTable,
    ParquetFolder,
    at,
    day_request,
    drop,
    feed,
    invoice,
    landing_spec,
    make_spec,
    rows,
    staging_left,
)
from incremental_assets_tests.postgres import PostgresServer, skip_or_fail_on_ci, start_or_skip

# -- a small, real disk -----------------------------------------------------------------


class SmallDisk:
    """A tmpfs of ``size`` mounted at ``path``; ``fill`` leaves ``leave`` bytes free."""

    def __init__(self, path: Path, size: str):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            skip_or_fail_on_ci(f"cannot mount a tmpfs (root needed): {done.stderr.strip()}")
        self._filler = path / "filler"

    def fill(self, leave: int = 192 * 1024) -> None:
        chunk = b"\0" * (1 << 20)
        with self._filler.open("ab") as out:
            while (room := shutil.disk_usage(self.path).free - leave) > 0:
                out.write(chunk[: min(room, len(chunk))])
                out.flush()

    def free_up(self) -> None:
        self._filler.unlink(missing_ok=True)

    def close(self) -> None:
        # Lazily: a failed Spark writer may still hold a file open on it for a moment.
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    disk = SmallDisk(tmp_path / "small-disk", "16m")
    yield disk
    disk.close()


def bulky(day: int, count: int, seed: int = 7) -> list[tuple]:
    """``count`` orders with 200 random letters each (about 1 MB that does not compress)."""
    rng = random.Random(seed)
    return [
        (i, "".join(rng.choices(string.ascii_letters, k=200)), float(i), at(day, 1))
        for i in range(2, count + 2)
    ]


def _one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message, message
    assert "Exception" not in message and "\tat " not in message, message
    return message


# -- disk full --------------------------------------------------------------------------


@pytest.mark.parametrize("full", ["target", "staging"])
def test_a_full_disk_stops_the_run_in_one_line_naming_where_and_commits_nothing(
    spark, tmp_path, small_disk, full
):
    source = DeltaSourceTable(tmp_path / "source")
    source.upsert([(1, "placed", 1.0, at(1, 1))])
    spec = make_spec(source.path)
    on_disk = small_disk.path if full == "target" else tmp_path
    target = DeltaTarget("orders", str(on_disk / "warehouse" / "orders"))
    staging_dir = str((tmp_path if full == "target" else small_disk.path) / "staging")
    run_load(spark, spec, target, day_request(1), staging_dir=staging_dir)
    version = DeltaTable(target.path).version()
    changes = bulky(2, 5000)
    source.upsert(changes)
    small_disk.fill()

    with pytest.raises(DiskFullError) as failure:
        run_load(spark, spec, target, day_request(2), staging_dir=staging_dir)

    error = failure.value
    message = _one_line(error)
    where = target.path if full == "target" else staging_dir
    assert (error.location, error.path) == (full, where)
    named = "the target" if full == "target" else "the run's staging folder"
    assert message.startswith(f"table 'orders': no space left on the disk of {named} ({where}")
    assert "nothing was committed" in message
    assert ("VACUUM" if full == "target" else "staging_dir") in error.fix
    assert DeltaTable(target.path).version() == version
    # The failed run's folder is gone: its staging root holds no run (only what its
    # emptying leaves).
    assert staging_left(Path(staging_dir) / "orders__staging") == []

    small_disk.free_up()
    run_load(spark, spec, target, day_request(2), staging_dir=staging_dir)
    expected = [(1, "placed")] + [(i, status) for i, status, _, _ in changes]
    assert rows(target, "order_id", "status") == expected


def test_a_landing_load_that_fills_the_target_disk_names_it_and_commits_nothing(
    spark, tmp_path, small_disk
):
    folder = tmp_path / "landing"
    folder.mkdir()
    spec = landing_spec(folder)
    target = DeltaTarget(spec.name, str(small_disk.path / "warehouse" / spec.name))
    staging_dir = str(tmp_path / "staging")
    drop(folder, "a.json", [invoice(1)])
    run_landing_load(spark, spec, target, day_request(2), staging_dir=staging_dir)
    version = DeltaTable(target.path).version()
    rng = random.Random(3)
    stores = ["".join(rng.choices(string.ascii_letters, k=200)) for _ in range(3000)]
    drop(folder, "b.json", [invoice(n, store=store) for n, store in enumerate(stores, 2)])
    small_disk.fill()

    with pytest.raises(DiskFullError) as failure:
        run_landing_load(spark, spec, target, day_request(2), staging_dir=staging_dir)

    assert (failure.value.location, failure.value.path) == ("target", target.path)
    assert _one_line(failure.value).startswith(
        f"table '{spec.name}': no space left on the disk of the target ({target.path}"
    )
    assert DeltaTable(target.path).version() == version
    small_disk.free_up()
    again = run_landing_load(spark, spec, target, day_request(2), staging_dir=staging_dir)
    assert again.rows_inserted == len(stores)


# Spark's local folder is fixed when its session starts, so this run has a session of its
# own (in a child process, as a pytest process has one session): the folder on the small
# disk, filled once Spark has copied its jars there. The source holds both days already:
# the run of day 1 reads day 1 only (partitions cut the watermark).
_SPILL_RUN = textwrap.dedent(
    """
    import json, shutil, sys
    from pathlib import Path
    from deltalake import DeltaTable
    from incremental_assets.engine import DeltaTarget, run_load
    from incremental_assets.engine.errors import DiskFullError
    from incremental_assets.engine.spark_session import local_session
    from incremental_assets_tests.builders import CHILD_SPARK_CONF, day_request, make_spec

    root, local_dir = Path(sys.argv[1]), Path(sys.argv[2])
    spark = local_session("spill", **{**CHILD_SPARK_CONF, "spark.local.dir": str(local_dir)})
    spec = make_spec(str(root / "source"))
    target = DeltaTarget("orders", str(root / "warehouse" / "orders"))
    staging = str(root / "staging")
    run_load(spark, spec, target, day_request(1), staging_dir=staging)
    version = DeltaTable(target.path).version()
    with (local_dir / "filler").open("ab") as out:
        while (room := shutil.disk_usage(local_dir).free - 192 * 1024) > 0:
            out.write(bytes(min(room, 1 << 20)))
            out.flush()
    report = {"error": None}
    try:
        run_load(spark, spec, target, day_request(2), staging_dir=staging)
    except DiskFullError as exc:
        committed = DeltaTable(target.path).version() != version
        report = {"error": str(exc), "location": exc.location, "path": exc.path,
                  "fix": exc.fix, "committed": committed}
    spark.stop()
    print(json.dumps(report))
    """
)


@pytest.mark.slow
def test_a_full_spark_local_folder_is_named_as_the_spill_and_commits_nothing(
    tmp_path, small_disk_for_spark
):
    source = DeltaSourceTable(tmp_path / "source")
    source.upsert([(1, "placed", 1.0, at(1, 1)), *bulky(2, 5000)])
    local_dir = small_disk_for_spark.path

    done = subprocess.run(
        [sys.executable, "-c", _SPILL_RUN, str(tmp_path), str(local_dir)],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=600,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["error"] is not None, "the run did not fill the disk"
    assert "\n" not in report["error"]
    assert (report["location"], report["path"]) == ("spill", str(local_dir))
    assert report["error"].startswith(
        "table 'orders': no space left on the disk of Spark's local folder for shuffle and "
        f"spill (spark.local.dir; on a cluster, the executors' own) ({local_dir}"
    )
    assert "spark.local.dir" in report["fix"]
    assert not report["committed"]


@pytest.fixture
def small_disk_for_spark(tmp_path: Path) -> Iterator[SmallDisk]:
    """Room for the jars Spark copies into its local folder when it starts (~85 MB)."""
    disk = SmallDisk(tmp_path / "spark-local", "192m")
    yield disk
    disk.close()


# -- long names -------------------------------------------------------------------------

_FEED_TABLE = """
warehouse:
  root: ./warehouse
tables:
  - name: {name}
    source: {{format: parquet, path: ./feed}}
    keys: [id]
    watermark: {{column: lsn, kind: id}}
    strategy: {{kind: cdc, deletes: hard}}
    partitioning: {{granularity: daily, start: 2026-01-01, column: changed_at}}
"""


@pytest.mark.parametrize("length", [300, MAX_TABLE_NAME + 1])
def test_a_table_name_too_long_for_its_folders_is_refused_at_load(tmp_path, length):
    name = "t" * length
    (tmp_path / "tables.yaml").write_text(_FEED_TABLE.format(name=name))

    with pytest.raises(SpecError) as failure:
        load_project(tmp_path / "tables.yaml")

    ((table, field, message),) = failure.value.problems
    assert (table, field) == (name, "name")
    assert message.startswith(f"is {length} characters long; a table name has at most 200")
    assert "__source_file_stamps" in message and f"{NAME_BYTES} bytes" in message
    assert not (tmp_path / "warehouse").exists()


def test_a_target_folder_name_without_room_for_the_side_tables_is_refused_at_load(tmp_path):
    text = _FEED_TABLE.format(name="orders") + f"    target: {{path: ./wh/{'f' * 240}}}\n"
    (tmp_path / "tables.yaml").write_text(text)

    with pytest.raises(SpecError) as failure:
        load_project(tmp_path / "tables.yaml")

    ((table, field, message),) = failure.value.problems
    assert (table, field) == ("orders", "target.path")
    assert "240 bytes long; at most 235" in message


def test_a_table_name_at_the_limit_loads_and_keeps_its_side_tables(spark, tmp_path):
    """The longest name allowed: its Dagster definitions build (asset, checks, pool), and
    two runs load it, the second reading a late file through the ledger kept in
    <name>__source_file_stamps (the longest side-table name)."""
    name = "t" * MAX_TABLE_NAME
    (tmp_path / "tables.yaml").write_text(_FEED_TABLE.format(name=name))
    project = load_project(tmp_path / "tables.yaml")
    defs = build_definitions(project)
    assert defs.get_assets_def(name).op.pool == f"incremental_assets_{name}"
    spec = project.tables[0]
    target = defs.resources["warehouse"].target(project, spec)
    folder = ParquetFolder(tmp_path / "feed")

    folder.drop(feed((1, "a", "I", 5, at(2, 1))))
    run_load(spark, spec, target, day_request(2))
    folder.drop(feed((2, "b", "I", 3, at(1, 1))))  # late: below the cursor (lsn 5)
    late = run_load(spark, spec, target, day_request(2))

    assert (late.rows_late, late.files_late) == (1, 1)
    assert rows(target, "id", "name") == [(1, "a"), (2, "b")]
    stamps = Path(f"{target.path}__source_file_stamps")
    assert stamps.is_dir() and len(stamps.name) == MAX_TABLE_NAME + 20


# -- JDBC: driver parameters and SSL ----------------------------------------------------

PASSWORD = "runtime-errors-pw-5521"
USER = "loader"

_JDBC_TABLE = """
warehouse:
  root: ./warehouse
connections:
  shop:
    url: {url}
    driver: org.postgresql.Driver
    user: loader
    password_env: IA_TEST_RUNTIME_PASSWORD
    max_retries: 2
    retry_delay: 0.2s{properties}
tables:
  - name: orders
    source: {{format: jdbc, connection: shop, table: public.orders{options}}}
    keys: [order_id]
    watermark: {{column: updated_at, kind: timestamp}}
    strategy: upsert
    partitioning: {{granularity: daily, start: 2026-01-01}}
"""


def _jdbc_project(root: Path, url: str, properties: str = "", options: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "tables.yaml"
    props = f"\n    properties: {properties}" if properties else ""
    opts = f", options: {options}" if options else ""
    path.write_text(_JDBC_TABLE.format(url=url, properties=props, options=opts))
    return path


@pytest.mark.parametrize(
    ("url", "properties", "options", "field", "parameter"),
    [
        ("?socketFactory=org.example.Tunnel", "", "", "connections.shop.url", "socketFactory"),
        (
            "?sslmode=require&SSLFACTORY=org.postgresql.ssl.NonValidatingFactory",
            "",
            "",
            "connections.shop.url",
            "SSLFACTORY",
        ),
        (";sslhostnameverifier=org.example.Any", "", "", "connections.shop.url", "sslhost"),
        ("", "{socketFactoryArg: x}", "", "connections.shop.properties", "socketFactoryArg"),
        ("", "", "{queryInterceptors: org.example.Spy}", "source.options", "queryInterceptors"),
        ("", "", "{autoDeserialize: 'true'}", "source.options", "autoDeserialize"),
    ],
    ids=["url", "url_any_case", "url_semicolon", "properties", "options", "deserialize"],
)
def test_jdbc_parameters_that_load_classes_are_refused_at_load_naming_them(
    tmp_path, url, properties, options, field, parameter
):
    path = _jdbc_project(tmp_path, "jdbc:postgresql://db:5432/shop" + url, properties, options)

    with pytest.raises(SpecError) as failure:
        load_project(path)

    ((_table, where, message),) = failure.value.problems
    assert where == field
    assert f"'{parameter}" in message and "load a Java class" in message
    assert "no JDBC driver" not in message


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = start_or_skip()
    server.create_user(USER, PASSWORD)
    yield server
    server.close()


def _shop(pg: PostgresServer, name: str) -> None:
    pg.create_database(name)
    pg.sql(
        "CREATE TABLE orders (order_id bigint PRIMARY KEY, status text, amount float8, "
        "updated_at timestamptz); "
        "INSERT INTO orders VALUES (1, 'placed', 1.0, '2026-01-01 01:00+00'); "
        f'GRANT SELECT ON orders TO "{USER}";',
        database=name,
    )


def _source(pg: PostgresServer, database: str, url: str = "", **connection) -> TableSpec:
    """The orders table of ``database``; the connection built without validation, as a
    spec made in code may be."""
    settings = {
        "url": pg.jdbc_url(database) + url,
        "driver": "org.postgresql.Driver",
        "user": USER,
        "name": "shop",
        "password": SecretStr(PASSWORD),
        "password_env": None,
        "properties": {},
        "max_retries": 3,
        **connection,
    }
    return make_spec(
        "unused",
        source={
            "format": "jdbc",
            "path": None,
            "connection": ConnectionSpec.model_construct(**settings),
            "table": "public.orders",
        },
    )


def test_a_class_loading_parameter_in_a_spec_made_in_code_fails_before_connecting(spark, postgres):
    _shop(postgres, "shop_factory")
    spec = _source(postgres, "shop_factory", "?socketFactory=org.example.NoSuchFactory")
    since = postgres.log_position()

    with pytest.raises(ConnectionSettingError) as failure:
        JdbcSource(spark, "orders", spec.source)

    message = _one_line(failure.value)
    assert failure.value.setting == "socketFactory"
    assert "the JDBC parameter 'socketFactory' in the url of connection 'shop'" in message
    assert "no JDBC driver" not in message
    assert not postgres.statements(since, database="shop_factory")


def test_a_missing_driver_class_is_still_named_as_a_missing_driver(spark, postgres):
    _shop(postgres, "shop_driver")
    spec = _source(postgres, "shop_driver", driver="org.example.NoSuchDriver")

    with pytest.raises(SourceAccessError) as failure:
        JdbcSource(spark, "orders", spec.source)

    message = _one_line(failure.value)
    assert "found no JDBC driver" in message and "org.example.NoSuchDriver" in message


def test_sslmode_require_on_a_server_without_ssl_fails_once_naming_connection_and_sslmode(
    spark, postgres, tmp_path, monkeypatch
):
    """Before: retried as a lost connection (max_retries times, with backoff). (``spark``:
    the session with the driver's jar, which the project's resource then reuses.)"""
    _shop(postgres, "shop_nossl")
    monkeypatch.setenv("IA_TEST_RUNTIME_PASSWORD", PASSWORD)
    path = _jdbc_project(tmp_path, postgres.jdbc_url("shop_nossl"), "{sslmode: require}")
    project = load_project(path)
    defs = build_definitions(project)

    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [defs.get_assets_def("orders")],
            partition_key="2026-01-01",
            instance=instance,
            resources=defs.resources,
            raise_on_error=False,
        )

    assert not result.success
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.step_failure_data.error.message.strip()
    assert "\n" not in message
    assert "table 'orders': database connection 'shop'" in message
    assert "does not offer SSL, and the connection's sslmode 'require'" in message
    assert "not retried" in message and "sslmode: prefer" in message
    target = defs.resources["warehouse"].target(project, project.tables[0])
    assert not target.exists()


@pytest.fixture(scope="module")
def ssl_only_postgres() -> Iterator[tuple[PostgresServer, Path]]:
    """A server that refuses connections without SSL; its self-signed certificate (for
    the host name ``localhost``) is the second item."""
    if shutil.which("openssl") is None:
        skip_or_fail_on_ci("openssl is needed to make the test server's certificate")
    server = start_or_skip()
    data = server.data_dir
    subprocess.run(
        ["openssl", "req", "-new", "-x509", "-days", "2", "-nodes", "-subj", "/CN=localhost",
         "-keyout", str(data / "server.key"), "-out", str(data / "server.crt")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    os.chmod(data / "server.key", 0o600)
    shutil.chown(data / "server.key", user="postgres")
    shutil.chown(data / "server.crt", user="postgres")
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
    hba = (data / "pg_hba.conf").read_text()
    (data / "pg_hba.conf").write_text("hostnossl all all all reject\n" + hba)
    server.stop()
    server.resume()
    server.create_user(USER, PASSWORD)
    certificate = Path(str(server.root)) / "ca.crt"
    shutil.copy(data / "server.crt", certificate)
    yield server, certificate
    server.close()


def test_ssl_settings_that_do_not_fit_an_ssl_only_server_are_named_not_retried(
    spark, ssl_only_postgres
):
    server, certificate = ssl_only_postgres
    _shop(server, "shop_ssl")

    # Without SSL: before, "refused the login of user 'loader'" (check the password).
    no_ssl = _source(server, "shop_ssl", properties={"sslmode": "disable"})
    with pytest.raises(ConnectionSettingError) as failure:
        JdbcSource(spark, "orders", no_ssl.source)
    message = _one_line(failure.value)
    assert "accepts only SSL connections, and the connection's sslmode 'disable'" in message
    assert "refused the login" not in message
    assert "sslmode: verify-full" in failure.value.fix
    assert not getattr(failure.value, "retryable", False)

    # A certificate that cannot be verified: before, retried as a lost connection.
    unverified = _source(server, "shop_ssl", "?sslmode=verify-full")
    with pytest.raises(ConnectionSettingError) as failure:
        JdbcSource(spark, "orders", unverified.source)
    message = _one_line(failure.value)
    assert "sslmode 'verify-full' (in its url)" in message
    assert "sslrootcert" in failure.value.fix
    assert not getattr(failure.value, "retryable", False)

    # The fix the messages give works: SSL, checked against the server's certificate.
    fixed = _source(
        server, "shop_ssl", properties={"sslmode": "verify-ca", "sslrootcert": str(certificate)}
    )
    source = JdbcSource(spark, "orders", fixed.source)
    assert source.read().count() == 1
