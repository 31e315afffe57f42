"""No secret out through a rule or a setting (issue 23, items 1 and 8).

Spark substitutes ``${env:NAME}``, ``${system:NAME}`` and ``${<setting>}`` in SQL text
unless ``spark.sql.variable.substitute`` is off: a quality rule could read the database
password from the environment and leak it through an error, the run's event log or its
failure counts. Every session the project starts or is handed has substitution off (read
back, not assumed), and ``${`` is refused in every SQL text a spec carries. Secrets in
``spark.conf`` values, in a JDBC URL's user-info and in the resource config the Dagster UI
shows are refused without echoing the value.

The leak tests run the attacks through a real Dagster instance in a temporary folder, on a
session where substitution was turned on first (a session handed over that way), with the
secret where substitution would find it, and search the instance's event log, run storage
and compute logs for it: every file under the instance's folder, byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster_pyspark import PySparkResource
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from incremental_assets.dagster_layer.build import build_definitions
from incremental_assets.dagster_layer.connections import DatabaseConnections
from incremental_assets.dagster_layer.resources import spark_session
from incremental_assets.engine.errors import SessionSettingError
from incremental_assets.engine.spark_session import (
    REQUIRED_CONF,
    ensure_required_conf,
    refuse_unapplied,
)
from incremental_assets.specs import SpecError, load_project
from incremental_assets.specs.loader import parse_project
from incremental_assets.specs.models import QualitySpec, RuleSpec
from incremental_assets_tests.builders import ORDERS_YAML, Project, at

# Spark redacts a substituted setting whose name or value matches spark.redaction.regex
# (secret, password, token, ...); a real password rarely does, and this one does not.
SECRET = "lw-Hunter7Qx93-unique"
PASSWORD_ENV = "SHOP_DB_PASSWORD"
SUBSTITUTE = "spark.sql.variable.substitute"
# Where substitution finds the secret in the test's session: a setting (the JVM's
# environment is fixed when the session starts, so a variable set by a test is not in it),
# named so that Spark's redaction does not hide it (as spark.executorEnv.DB_PW would not be).
SECRET_SETTING = "spark.ia_test.db_pw"
ISSUE_RULES = [
    "cast('${env:SHOP_DB_PASSWORD}' as int) > 0",
    "`${env:SHOP_DB_PASSWORD}` IS NULL",
    "substr('${env:SHOP_DB_PASSWORD}',1,1)='l'",
]


@pytest.fixture
def password_in_env(monkeypatch) -> str:
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    return SECRET


def orders_table(**changes: Any) -> dict[str, Any]:
    table = {
        "name": "orders",
        "source": {"format": "delta", "path": "./source/orders"},
        "keys": ["order_id"],
        "watermark": {"column": "updated_at", "kind": "timestamp"},
        "strategy": "upsert",
        "partitioning": {"granularity": "daily", "start": "2026-01-01"},
    }
    return {**table, **changes}


def project(*tables: dict[str, Any], **sections: Any) -> dict[str, Any]:
    return {"warehouse": {"root": "./warehouse"}, "tables": list(tables), **sections}


def refusals(raw: dict[str, Any], tmp_path: Path) -> tuple[list[tuple], str]:
    with pytest.raises(SpecError) as info:
        parse_project(raw, source="tables.yaml", base_dir=tmp_path)
    return info.value.problems, str(info.value)


# -- SQL text from a spec is never expanded ------------------------------------------------


@pytest.mark.parametrize(
    "check",
    [*ISSUE_RULES, "'${system:user.home}' = ''", "'${spark.app.name}' <> 'x'"],
)
def test_a_rule_reading_a_variable_through_substitution_is_refused_at_load(
    tmp_path, password_in_env, check
):
    rules = {"rules": [{"name": "leak", "check": check, "action": "warn"}]}
    raw = project(orders_table(quality=rules))

    problems, text = refusals(raw, tmp_path)

    ((table, field, message),) = problems
    assert (table, field) == ("orders", "quality.rules.check")
    assert message.startswith("rule 'leak' is refused: '${' at position")
    assert "Spark would substitute environment variables" in message
    assert password_in_env not in text


@pytest.mark.parametrize("landing", [False, True], ids=["csv", "landing json"])
def test_a_schema_with_a_substitution_is_refused_at_load(tmp_path, password_in_env, landing):
    source = {
        "format": "json" if landing else "csv",
        "path": "./source/events",
        "schema": "id BIGINT, ts TIMESTAMP, `${env:SHOP_DB_PASSWORD}` STRING",
    }
    if landing:
        table = {
            "name": "events",
            "source": {**source, "landing": {}},
            "partitioning": {"granularity": "daily", "start": "2026-01-01"},
        }
    else:
        table = orders_table(
            name="events",
            source=source,
            keys=["id"],
            watermark={"column": "ts", "kind": "timestamp"},
        )

    problems, text = refusals(project(table), tmp_path)

    ((table_name, field, message),) = problems
    assert (table_name, field) == ("events", "source.schema")
    position = source["schema"].index("${") + 1
    assert f"'${{' at position {position}: Spark would substitute" in message
    assert password_in_env not in text


def test_a_rule_and_a_schema_without_substitution_still_load(tmp_path):
    rules = {"rules": [{"name": "cheap", "check": "concat('$', '{') <> status"}]}
    events = orders_table(
        name="events",
        source={"format": "csv", "path": "./events", "schema": "id BIGINT, `a$b` STRING"},
        keys=["id"],
        watermark={"column": "id", "kind": "id"},
        partitioning={"granularity": "daily", "start": "2026-01-01", "column": "ts"},
    )

    loaded = parse_project(project(orders_table(quality=rules), events), "t.yaml", tmp_path)

    assert [t.name for t in loaded.tables] == ["orders", "events"]


def test_the_projects_session_returns_substitution_text_literally(spark):
    text = "${env:PATH}|${spark.app.name}|${system:java.version}"

    selected = spark.sql(f"select '{text}' as v").first()["v"]
    expressed = spark.range(1).select(F.expr(f"'{text}'").alias("v")).first()["v"]

    assert spark.conf.get(SUBSTITUTE) == "false"
    assert selected == expressed == text


def test_a_session_handed_over_with_substitution_on_is_fixed(spark):
    spark.conf.set(SUBSTITUTE, "true")
    try:
        # The attack is live in this session as handed over...
        # (the setting, not sparkContext.appName: a builder earlier in the session may
        # have set another name on the shared session)
        assert spark.sql("select '${spark.app.name}' as v").first()["v"] == spark.conf.get(
            "spark.app.name"
        )

        ensure_required_conf(spark)

        # ...and gone once the project has it.
        assert spark.conf.get(SUBSTITUTE) == "false"
        assert spark.sql("select '${spark.app.name}' as v").first()["v"] == "${spark.app.name}"
    finally:
        spark.conf.set(SUBSTITUTE, "false")


@pytest.mark.classic_only("dagster-pyspark's own resource starts a local session")
def test_a_pyspark_resource_made_elsewhere_has_its_session_fixed_as_a_step_takes_it(spark):
    # The project's resource checks the settings as it starts its session; a step handed
    # dagster-pyspark's own resource checks them as it takes the session.
    resource = PySparkResource(spark_config={})
    resource.setup_for_execution(dg.build_init_resource_context())
    spark.conf.set(SUBSTITUTE, "true")
    try:
        session = spark_session(resource)

        assert session.conf.get(SUBSTITUTE) == spark.conf.get(SUBSTITUTE) == "false"
    finally:
        spark.conf.set(SUBSTITUTE, "false")


def test_a_session_that_keeps_substitution_on_is_refused_naming_the_setting():
    read_back = {**REQUIRED_CONF, SUBSTITUTE: "true"}

    with pytest.raises(SessionSettingError) as info:
        refuse_unapplied(read_back)

    assert info.value.key == SUBSTITUTE
    assert f"keeps {SUBSTITUTE}=true after the project set it to false" in str(info.value)
    assert "Nothing was run" in str(info.value)
    assert f"Fix: set {SUBSTITUTE}=false" in str(info.value)
    refuse_unapplied(dict(REQUIRED_CONF))  # the settings as required pass


def test_spark_conf_turning_substitution_on_is_refused_at_load(tmp_path):
    problems, _ = refusals(project(orders_table(), spark={"conf": {SUBSTITUTE: "true"}}), tmp_path)

    ((table, field, message),) = problems
    assert (table, field) == (None, "spark.conf")
    assert "keeps variable substitution off in every Spark session" in message


# -- secrets in spark.conf, a JDBC URL, connection properties ------------------------------

SPARK_CONF_SECRETS = [
    ("spark.driver.extraJavaOptions", f"-Xmx2g -Ddb.Password={SECRET}", "'db.Password'"),
    ("spark.executor.extraJavaOptions", f"-Djavax.net.ssl.keyStorePassword={SECRET}", "keyStore"),
    ("spark.executorEnv.DB_PW", SECRET, "secrets are never written"),
    ("spark.executorEnv.DB_PASS", SECRET, "secrets are never written"),
    ("spark.yarn.appMasterEnv.API_TOKEN", SECRET, "secrets are never written"),
    (
        "spark.hadoop.javax.jdo.option.ConnectionURL",
        f"jdbc:postgresql://hive:{SECRET}@metastore:5432/hive",
        "a URL with a user and a password",
    ),
    ("spark.hadoop.some.endpoint", f"https://api.internal/v1?client=x&token={SECRET}", "'token'"),
]


@pytest.mark.parametrize(("key", "value", "named"), SPARK_CONF_SECRETS)
def test_a_secret_in_spark_conf_is_refused_by_key_or_value_without_the_value(
    tmp_path, key, value, named
):
    problems, text = refusals(project(orders_table(), spark={"conf": {key: value}}), tmp_path)

    ((table, field, message),) = problems
    assert (table, field) == (None, "spark.conf")
    assert repr(key) in message and named in message
    assert "the value is not shown" in message
    assert SECRET not in text


def test_spark_conf_values_that_only_say_where_a_secret_is_still_load(tmp_path):
    conf = {
        "spark.driver.extraJavaOptions": (
            "-Dlog4j2.configurationFile=/etc/spark/log4j2.xml "
            "-Djavax.net.ssl.trustStore=/etc/spark/truststore.jks -XX:+UseG1GC"
        ),
        "spark.sql.warehouse.dir": "abfss://lake@account.dfs.core.windows.net/warehouse",
        "spark.executorEnv.HOME": "/home/spark",
        "spark.executorEnv.PGPASSFILE": "/etc/spark/pgpass",
        "spark.hadoop.fs.s3a.endpoint": "http://minio:9000",
    }

    loaded = parse_project(project(orders_table(), spark={"conf": conf}), "t.yaml", tmp_path)

    assert loaded.spark.conf == conf


def jdbc_project(url: str, **connection: Any) -> dict[str, Any]:
    table = orders_table(source={"format": "jdbc", "connection": "shop", "table": "orders"})
    shop = {"url": url, "user": "loader", "password_env": PASSWORD_ENV, **connection}
    return project(table, connections={"shop": shop})


@pytest.mark.parametrize(
    "url",
    [
        f"jdbc:postgresql://loader:{SECRET}@db.internal:5432/shop",
        f"jdbc:mysql://loader:{SECRET}@db.internal/shop",
        "jdbc:postgresql://loader@db.internal:5432/shop",
        f"jdbc:oracle:thin:loader/{SECRET}@db.internal:1521:orcl",
        f"jdbc:sqlserver://db.internal;databaseName=shop;user=loader;PWD={SECRET}",
        f"jdbc:postgresql://db.internal/shop?user=loader&sslpassword={SECRET}",
    ],
    ids=["userinfo", "mysql userinfo", "user only", "oracle", "PWD", "sslpassword"],
)
def test_a_jdbc_url_with_user_info_or_a_secret_parameter_is_refused(tmp_path, url):
    problems, text = refusals(jdbc_project(url), tmp_path)

    ((table, field, message),) = problems
    assert (table, field) == (None, "connections.shop.url")
    assert "the URL is not shown" in message and "password_env" in message
    assert SECRET not in text


def test_jdbc_urls_with_harmless_parameters_still_load(tmp_path):
    for url in (
        "jdbc:postgresql://db.internal:5432/shop?ssl=true&sslmode=require&sslkey=/etc/k.pk8",
        "jdbc:oracle:thin:@//db.internal:1521/shop",
        "jdbc:sqlserver://db.internal;databaseName=shop;encrypt=true",
        "jdbc:mysql://db.internal/shop?clientCertificateKeyStoreUrl=file:/etc/ks.jks",
    ):
        loaded = parse_project(jdbc_project(url), "t.yaml", tmp_path)
        assert loaded.connections["shop"].url == url


@pytest.mark.parametrize("name", ["pw", "PW", "pass", "db_pw", "pswd", "passcode"])
def test_a_password_ish_connection_property_is_refused(tmp_path, name):
    raw = jdbc_project("jdbc:postgresql://db.internal/shop", properties={name: SECRET})

    problems, text = refusals(raw, tmp_path)

    ((table, field, message),) = problems
    assert (table, field) == (None, "connections.shop.properties")
    assert f"{name!r}: secrets are never written in tables.yaml" in message
    assert SECRET not in text


# -- what the Dagster UI shows ------------------------------------------------------------


def shown_by_the_ui(defs: dg.Definitions) -> str:
    """The repository snapshot the UI reads (resource pages included), serialized."""
    return dg.serialize_value(RepositorySnap.from_def(defs.get_repository_def()))


def test_the_ui_shows_a_password_given_as_env_var_by_name_only(tmp_path, monkeypatch):
    monkeypatch.setenv("IA_TEST_VAULT_PASSWORD", SECRET)
    spec = load_project_file(tmp_path)
    databases = DatabaseConnections(passwords={"shop": dg.EnvVar("IA_TEST_VAULT_PASSWORD")})

    shown = shown_by_the_ui(build_definitions(spec, resources={"databases": databases}))

    assert "IA_TEST_VAULT_PASSWORD" in shown
    assert SECRET not in shown
    # A literal would be shown as it is: the reason it is refused below.
    literal = DatabaseConnections(passwords={"shop": SECRET})
    assert SECRET in shown_by_the_ui(dg.Definitions(resources={"databases": literal}))


def test_a_password_given_as_a_literal_is_refused_by_the_definitions(tmp_path):
    spec = load_project_file(tmp_path)
    databases = DatabaseConnections(passwords={"shop": SECRET})

    with pytest.raises(ValueError) as info:
        build_definitions(spec, resources={"databases": databases})

    message = str(info.value)
    assert "resource 'databases', field 'passwords.shop': a secret given as a literal" in message
    assert "dg.EnvVar('NAME')" in message
    assert SECRET not in message


def load_project_file(root: Path, text: str = ORDERS_YAML):
    (root / "tables.yaml").write_text(text)
    return load_project(root / "tables.yaml")


# -- nothing reaches Dagster's storage ----------------------------------------------------


@pytest.fixture
def instance(tmp_path) -> Iterator[dg.DagsterInstance]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        yield instance


@pytest.fixture
def secret_in_a_session_with_substitution_on(spark) -> Iterator[str]:
    """The secret in a setting of the session, and substitution on, as a session handed
    over by a cluster might be; both undone afterwards."""
    spark.conf.set(SECRET_SETTING, SECRET)
    spark.conf.set(SUBSTITUTE, "true")
    # The attack is live: substitution reads the secret in this session.
    assert spark.sql(f"select '${{{SECRET_SETTING}}}' as v").first()["v"] == SECRET
    try:
        yield SECRET
    finally:
        spark.conf.set(SUBSTITUTE, "false")
        spark.conf.unset(SECRET_SETTING)


def files_holding(instance: dg.DagsterInstance, text: str) -> list[str]:
    """Files under the instance's folder (event log, run storage, compute logs) that hold
    ``text``."""
    needle = text.encode()
    root = Path(instance.root_directory)
    return [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and needle in p.read_bytes()
    ]


def assert_nowhere_in_dagster(instance: dg.DagsterInstance, run_id: str, secret: str) -> None:
    logs = dg.serialize_value(instance.all_logs(run_id))
    run = instance.get_run_by_id(run_id)
    assert secret not in logs
    assert secret not in dg.serialize_value(run)
    # The folder is the right place to look: the run's records are there...
    assert files_holding(instance, run_id)
    # ...and the secret is not.
    assert files_holding(instance, secret) == []


@pytest.mark.parametrize("check", ISSUE_RULES)
def test_a_rule_leaking_a_secret_through_substitution_leaks_nothing_through_dagster(
    tmp_path, spark, instance, secret_in_a_session_with_substitution_on, password_in_env, check
):
    secret = secret_in_a_session_with_substitution_on
    built = Project(tmp_path / "project")
    built.source.upsert([(1, "placed", 1.0, at(1, 5)), (2, "lost", 2.0, at(1, 6))])
    # A spec changed after loading skips validation: the engine and the session must hold.
    attack = check.replace(f"env:{PASSWORD_ENV}", SECRET_SETTING)
    rule = RuleSpec.model_construct(name="leak", check=attack, action="warn")
    spec = built.spec.tables[0].model_copy(
        update={"quality": QualitySpec.model_construct(rules=[rule], min_score=0.0)}
    )
    defs = build_definitions(built.spec.model_copy(update={"tables": [spec]}))

    result = dg.materialize(
        [defs.get_assets_def("orders")],
        partition_key="2026-01-01",
        instance=instance,
        resources=defs.resources,
        raise_on_error=False,
    )

    assert_nowhere_in_dagster(instance, result.run_id, secret)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    message = failure.step_failure_data.error.message
    assert "table 'orders': quality rule 'leak' is refused: '${' at position" in message
    assert not Path(built.target.path).exists()
    assert spark.conf.get(SUBSTITUTE) == "false"  # the run's resource turned it off


def test_maintenance_sql_on_a_path_with_a_substitution_leaks_nothing_through_dagster(
    tmp_path, spark, instance, secret_in_a_session_with_substitution_on
):
    secret = secret_in_a_session_with_substitution_on
    # OPTIMIZE and VACUUM name the table's path in SQL text.
    target = f"\n    target: {{path: './warehouse/orders_${{{SECRET_SETTING}}}'}}\n"
    spec = load_project_file(tmp_path, ORDERS_YAML.rstrip() + target)
    target_path = spec.target_path(spec.tables[0])
    assert target_path.endswith(f"orders_${{{SECRET_SETTING}}}")
    for i in range(3):
        write_deltalake(target_path, order_ids([i]), mode="append")
    defs = build_definitions(spec)

    result = defs.get_job_def("maintain_tables").execute_in_process(
        instance=instance, raise_on_error=False
    )

    assert_nowhere_in_dagster(instance, result.run_id, secret)
    assert result.success
    assert len(DeltaTable(target_path).file_uris()) == 1  # the table named was compacted
    assert spark.conf.get(SUBSTITUTE) == "false"


def order_ids(ids: list[int]) -> pa.Table:
    return pa.table({"order_id": pa.array(ids, pa.int64())})
