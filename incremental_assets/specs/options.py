"""Option mappings a spec may hold: no secrets, and for databases no SQL.

Secrets (``source.options``, a connection's ``properties``, ``spark.conf``,
``warehouse.storage_options``): a key that names a password, secret, token, key, SAS or
credential is refused when the specs load, naming the mapping and the key, never the value.
The key is read word by word (split at ``.``, ``_``, ``-`` and camelCase):

- refused: any word holding ``password``, ``passwd``, ``passphrase``, ``secret``,
  ``token`` or ``credential``; a word ``key``, ``sas``, ``pwd`` (or ``apikey``, ...).
  So ``fs.s3a.secret.key``, ``fs.s3a.access.key``, ``fs.azure.account.key.<account>``,
  ``fs.azure.sas.<container>.<account>``, ``sslpassword``, ``keyStorePassword``;
- accepted: keys whose last word says the value is where a secret is, or how it is
  obtained, not the secret: ``provider``, ``type``, ``class``, ``file``, ``path``,
  ``location``, ``store``, ``enabled`` (``fs.s3a.aws.credentials.provider``,
  ``spark.authenticate.secret.file``, ``spark.ssl.keyStore``,
  ``hadoop.security.credential.provider.path``), and words that only contain ``key``
  (``keytab``, ``keystore``, pgjdbc's ``sslkey``: paths of files holding the key). The
  passwords of those stores and files are secrets and are refused.

Words that name a password in few letters (``pw``, ``pass``, ``pswd``) count as secret
names too: ``spark.executorEnv.DB_PW``. A key whose last word is ``url`` or ``uri`` says
where something is (``clientCertificateKeyStoreUrl``); a URL's own user and password are
found in the value instead.

Secrets in values (``spark.conf``, a connection's ``url``, the Dagster resources' config):
a value is refused when it sets a secret-named property or parameter (``-Ddb.Password=...``
in ``spark.driver.extraJavaOptions``, ``;password=`` or ``?sslpassword=`` in a URL) or
holds a URL with a user and password (``scheme://user:pw@host``); a JDBC URL may hold no
user-info at all. The message names the key, the property or parameter, never the value.

Database options (``source.options`` of a jdbc source, a connection's ``properties``):
Spark JDBC options that carry SQL or override the connection are refused,
case-insensitively, since Spark reads options case-insensitively; see ``JDBC_RESERVED``.

Driver parameters that make the JDBC driver load a Java class named in the spec, or run
code the server sends, are refused in those mappings and in a connection's ``url`` (its
``?a=1&b=2`` or ``;a=1`` parameters) alike: ``socketFactory``, ``sslfactory``,
``queryInterceptors``, ``autoDeserialize``, ... (``JDBC_CLASS_LOADING``, and any name
ending in ``factory``, ``factoryarg``, ``interceptor(s)``, ``callback``, ``verifier``,
``classname`` or ``plugin(s)``). The class would be instantiated on the driver and every
executor, so a spec could run any code on the classpath; and a class that is missing made
the driver's failure read as "no JDBC driver".
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_SECRET_WORDS = (
    "password", "passwd", "passphrase", "passcode", "secret", "token", "credential",
)  # fmt: skip
_SECRET_NAMES = frozenset(
    {
        "key",
        "sas",
        "pwd",
        "pw",
        "pass",
        "pswd",
        "apikey",
        "accesskey",
        "accountkey",
        "privatekey",
        "sharedkey",
        "masterkey",
    }
)
_NOT_THE_SECRET = frozenset(
    {
        "provider", "providers", "type", "class", "file", "path", "location", "store",
        "enabled", "url", "uri",
    }
)  # fmt: skip
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")

DATABASE_SECRET = (
    "the database password goes in an environment variable named by the connection's "
    "password_env (e.g. password_env: SHOP_DB_PASSWORD)"
)
OBJECT_STORE_SECRET = (
    "object-store credentials go in the environment (e.g. AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, AZURE_STORAGE_ACCOUNT_KEY)"
)
SPARK_SECRET = (
    "Spark's settings are shown in the Dagster UI, so secrets reach Spark from the "
    "environment of the processes running it: its object-store connectors read credentials "
    "from the environment (e.g. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3a) or "
    "from a Hadoop credential provider (hadoop.security.credential.provider.path); a "
    "database's password goes in its connection's password_env"
)

JDBC_RESERVED: dict[str, tuple[str, str]] = {
    name.lower(): (name, instead)
    for name, instead in (
        ("dbtable", "name the table in source.table (for a query, create a view and name it)"),
        ("query", "name the table in source.table (for a query, create a view and name it)"),
        ("prepareQuery", "name a table or view in source.table"),
        (
            "sessionInitStatement",
            "the loader runs only its own read queries; set session settings on the "
            "database role (ALTER ROLE ... SET) or with the driver's options property",
        ),
        ("url", "set the connection's url"),
        ("driver", "set the connection's driver"),
        ("user", "set the connection's user"),
        ("password", "name the environment variable holding it in the connection's password_env"),
        ("partitionColumn", "use source.slices (column and count)"),
        ("lowerBound", "use source.slices; the loader takes the bounds from the window"),
        ("upperBound", "use source.slices; the loader takes the bounds from the window"),
        ("numPartitions", "use source.slices.count"),
        (
            "customSchema",
            "the loader reads the database's column types; cast a column in a view",
        ),
        (
            "pushDownPredicate",
            "the loader's window must be executed by the database; remove it",
        ),
    )
}
"""Spark JDBC options a spec may not set (lower case -> (name, what to use instead))."""


_NO_CLASS = "remove it: a spec may not name Java classes for the driver to load"
JDBC_CLASS_LOADING: dict[str, str] = {
    name.lower(): instead
    for name, instead in (
        (
            "socketFactory",
            "remove it: reach the database at the URL's host and port (run a tunnel or "
            "proxy outside Spark); for TLS set sslmode",
        ),
        ("socketFactoryArg", "remove it, with socketFactory"),
        (
            "sslfactory",
            "remove it: set sslmode (e.g. verify-full) and sslrootcert (the CA's file); "
            "sslcert and sslkey for a client certificate",
        ),
        ("sslfactoryarg", "remove it: name the CA's file in sslrootcert"),
        ("sslhostnameverifier", "remove it: sslmode verify-full checks the host name"),
        ("sslpasswordcallback", _NO_CLASS),
        ("authenticationPluginClassName", _NO_CLASS),
        ("authenticationPlugins", _NO_CLASS),
        ("defaultAuthenticationPlugin", _NO_CLASS),
        ("clientInfoProvider", _NO_CLASS),
        ("propertiesTransform", _NO_CLASS),
        ("autoDeserialize", "remove it: it deserializes Java objects the server sends"),
        ("allowLoadLocalInfile", "remove it: it lets the server read local files"),
        ("allowUrlInLocalInfile", "remove it: it lets the server read local files and URLs"),
    )
}
"""Driver parameters refused as unsafe (lower case -> what to do instead); see the module."""
_CLASS_LOADING_ENDINGS = (
    "factory",
    "factoryarg",
    "interceptor",
    "interceptors",
    "callback",
    "verifier",
    "classname",
    "plugin",
    "plugins",
)
_URL_PARAMETER = re.compile(r"[?&;]\s*([^=&;?\s]+)\s*=")


def url_parameters(url: str) -> list[str]:
    """The names of a JDBC URL's parameters: ``?a=1&b=2`` (PostgreSQL, MySQL) and
    ``;a=1`` (SQL Server, DB2, H2)."""
    return _URL_PARAMETER.findall(url)


def loads_classes(key: str) -> bool:
    """Whether a driver parameter named ``key`` loads a class or runs code (see module)."""
    lower = key.strip().lower()
    return lower in JDBC_CLASS_LOADING or lower.endswith(_CLASS_LOADING_ENDINGS)


def refuse_class_loading(keys: list[str]) -> None:
    """ValueError naming each driver parameter in ``keys`` that loads a class or runs code
    (see module), with what to do instead."""
    refused = [k for k in keys if loads_classes(k)]
    if refused:
        listed = "; ".join(
            f"{k!r}: {JDBC_CLASS_LOADING.get(k.strip().lower(), _NO_CLASS)}" for k in refused
        )
        raise ValueError(
            "unsafe JDBC driver parameter(s): the driver would load a Java class (or run "
            f"code) that the spec names, on every Spark machine: {listed}"
        )


def is_secret_key(key: str) -> bool:
    """Whether an option named ``key`` holds a secret (see module docstring)."""
    words = [w.lower() for w in _WORDS.findall(key)]
    if not words or words[-1] in _NOT_THE_SECRET:
        return False
    return any(w in _SECRET_NAMES or any(s in w for s in _SECRET_WORDS) for w in words)


def refuse_secrets(options: Mapping[str, str], instead: str) -> Mapping[str, str]:
    """``options`` unchanged, or ValueError naming the keys that hold secrets (never their
    values) and where the secret goes (``instead``)."""
    secret = [k for k in options if is_secret_key(k)]
    if secret:
        raise ValueError(
            f"{', '.join(repr(k) for k in secret)}: secrets are never written in "
            f"tables.yaml (the value is not shown); remove {'them' if len(secret) > 1 else 'it'}"
            f": {instead}"
        )
    return options


def refuse_jdbc_options(options: Mapping[str, str]) -> Mapping[str, str]:
    """``options`` unchanged, or ValueError naming each Spark JDBC option that carries SQL
    or overrides the connection, or driver parameter that loads a class, and what to use
    instead."""
    refused = [(k, JDBC_RESERVED[k.lower()]) for k in options if k.lower() in JDBC_RESERVED]
    if refused:
        listed = "; ".join(f"{key!r} ({name}): {instead}" for key, (name, instead) in refused)
        raise ValueError(
            "the loader sets these JDBC options itself, and a spec may not send SQL or "
            f"override the connection through them: {listed}"
        )
    refuse_class_loading(list(options))
    return options


def database_options(options: Mapping[str, str]) -> Mapping[str, str]:
    """A jdbc source's options or a connection's properties, checked: secrets first (so a
    password is refused as a secret), then the reserved JDBC options."""
    return refuse_jdbc_options(refuse_secrets(options, DATABASE_SECRET))


def without_reserved(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` less the reserved JDBC options (refused at load; dropped again where the
    reader is built, so a spec made without validation cannot set them either)."""
    return {k: v for k, v in options.items() if k.lower() not in JDBC_RESERVED}


# A property or parameter set inside a value: ``-Dname=`` (Java options), or ``name=``
# after a start, a space or a URL's separator (``?``, ``&``, ``;``, ``,``).
_SET_IN_VALUE = re.compile(r"(?:-D|(?<![^\s?&;,]))([A-Za-z_][\w.-]*)\s*=")
# A URL's user-info: whatever stands between ``//`` and an ``@`` before the host ends.
_USER_INFO = re.compile(r"//([^/?#;@\s]+)@")
# Oracle's thin and OCI URLs put the user and password before the ``@``: user/pw@host.
_ORACLE_USER = re.compile(r"^jdbc:oracle:\w+:([^@/]+/[^@]*)@", re.IGNORECASE)


def secret_in_value(value: str) -> str | None:
    """What in ``value`` is a secret (the property, the parameter, a URL's password),
    described without the value; None when nothing is."""
    for match in _SET_IN_VALUE.finditer(value):
        name = match.group(1)
        if is_secret_key(name):
            java = match.group(0).startswith("-D")
            return f"the {'Java system property' if java else 'parameter'} {name!r}"
    if any(":" in user for user in _USER_INFO.findall(value)):
        return "a URL with a user and a password before its '@'"
    return None


def jdbc_url_secret(url: str) -> str | None:
    """What in a JDBC URL is a secret or may hold one (see :func:`secret_in_value`); a
    JDBC URL may name no user either: the connection's ``user`` and ``password_env`` do."""
    if _USER_INFO.search(url) or _ORACLE_USER.match(url):
        return "a user (and perhaps a password) before the host's '@'"
    return secret_in_value(url)


def refuse_secret_values(options: Mapping[str, str], instead: str) -> Mapping[str, str]:
    """``options`` unchanged, or ValueError naming each key whose value holds a secret and
    what the secret is (never the value), and where the secret goes (``instead``)."""
    found = [(k, what) for k, v in options.items() if (what := secret_in_value(str(v)))]
    if found:
        listed = "; ".join(f"{key!r} sets {what}" for key, what in found)
        raise ValueError(
            f"{listed}: secrets are never written in tables.yaml (the value is not shown); "
            f"remove {'them' if len(found) > 1 else 'it'}: {instead}"
        )
    return options


SUBSTITUTION_SETTING = "spark.sql.variable.substitute"
"""Kept off in every session the project uses (engine/spark_session.py REQUIRED_CONF)."""


def refuse_substitution_setting(conf: Mapping[str, str]) -> Mapping[str, str]:
    """``conf`` unchanged, or ValueError when it sets ``spark.sql.variable.substitute``:
    the project turns it off whatever the spec says, so a spec setting it is refused
    rather than silently overridden."""
    if any(key.strip().lower() == SUBSTITUTION_SETTING for key in conf):
        raise ValueError(
            f"{SUBSTITUTION_SETTING!r}: the project keeps variable substitution off in every "
            "Spark session (with it on, Spark substitutes environment variables, Java system "
            "properties and settings into SQL text: ${env:NAME}, ...); remove it"
        )
    return conf
