"""What the Dagster UI shows of the project's resources: no secret.

Dagster shows each resource's configured values on its resource page, and a run launched
from the launchpad copies them into its run config, where they stay in run storage. A value
given as ``dg.EnvVar("NAME")`` is shown (and stored) as the variable's name, and read from
the environment when a run starts; any other value is shown as it is. So the definitions
refuse a literal value where a secret goes: under a secret-named field (``passwords``,
``secret_access_key``, ``account_key``, a Spark setting named like a secret) or in a value
that sets one (``-Ddb.Password=...``, a URL with ``user:pw@``), by the same rules as the
specs (specs/options.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from incremental_assets.specs.options import is_secret_key, secret_in_value

# dagster-deltalake fields named like a secret that hold where the secret is (a file).
_LOCATIONS = frozenset({"application_credentials"})


def refuse_literal_secrets(resources: Mapping[str, object]) -> None:
    """Raise ValueError naming each resource and field whose shown value is a secret
    written as a literal (never the value); resources given as EnvVar pass."""
    found = [
        (key, field, what)
        for key, resource in resources.items()
        for field, what in literal_secrets(_shown_config(resource))
    ]
    if found:
        listed = "; ".join(f"resource '{k}', field '{field}': {what}" for k, field, what in found)
        raise ValueError(
            f"{listed}. The Dagster UI shows a resource's configured values, and runs "
            "launched from it keep them in their run config (the value is not shown here). "
            "Pass the secret as dg.EnvVar('NAME'), so that only the variable's name is shown "
            "and the value is read from the environment when a run starts"
        )


def literal_secrets(
    config: object, path: tuple[str, ...] = (), secret: bool = False
) -> list[tuple[str, str]]:
    """(field, what) for each secret written as a literal in a resource's shown config;
    ``secret``: the field (or one holding it) is named like a secret."""
    if isinstance(config, Mapping):
        if set(config) == {"env"}:
            return []  # an EnvVar: shown as its name
        return [
            hit
            for key, value in config.items()
            for hit in literal_secrets(value, (*path, str(key)), secret or _names_secret(str(key)))
        ]
    if isinstance(config, (list, tuple)):
        return [
            hit
            for index, item in enumerate(config)
            for hit in literal_secrets(item, (*path, str(index)), secret)
        ]
    if config is None or isinstance(config, bool):
        return []  # nothing secret is shown
    if secret:
        return [(_dotted(path), "a secret given as a literal value")]
    if isinstance(config, str) and (what := secret_in_value(config)):
        return [(_dotted(path), f"a value that sets {what}")]
    return []


def _names_secret(key: str) -> bool:
    return is_secret_key(key) and key not in _LOCATIONS


def _shown_config(resource: object) -> Any:
    """The configured values the Dagster UI shows for ``resource``."""
    # Pythonic resources and IO managers (ConfigurableResource, ConfigurableIOManager).
    definition = getattr(resource, "get_resource_definition", None)
    if callable(definition):
        resource = definition()
    if isinstance(resource, dg.ResourceDefinition):
        schema = resource.config_schema
        return schema.default_value if schema is not None and schema.default_provided else {}
    return {}


def _dotted(path: tuple[str, ...]) -> str:
    # Spark settings are dotted themselves: quote those.
    return "".join(
        f"[{part!r}]" if "." in part else (f".{part}" if i else part) for i, part in enumerate(path)
    )
