"""SQL text a spec carries (quality rules' checks, ``source.schema``, and any SQL a spec
field will hold later): never a ``${``.

Spark's SQL parser replaces ``${env:NAME}``, ``${system:NAME}`` and ``${<setting>}`` in
SQL text with the machine's environment variables, Java system properties and session
settings before it parses the text (``spark.sql.variable.substitute``, on by default). A
spec could then read a secret of the machine that runs it and leak it through a result, an
error message or a rule's failure counts. The project turns substitution off in every
session it starts or is handed (engine/spark_session.py); the specs refuse ``${`` as well,
so such a spec fails at load whatever the session, naming the field.

Example:
    >>> substitution_refusal("amount >= 0") is None
    True
    >>> no_substitution("cast('${env:DB_PASSWORD}' as int) > 0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: '${' at position 7: ...
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

SUBSTITUTION = "${"


def substitution_refusal(text: str) -> str | None:
    """Why ``text`` may not be given to Spark's SQL parser; None when it may."""
    position = text.find(SUBSTITUTION)
    if position < 0:
        return None
    return (
        f"'${{' at position {position + 1}: Spark would substitute environment variables, "
        "Java system properties and session settings into SQL text (${env:NAME}, "
        "${system:NAME}, ${spark.<setting>}), which could expose a secret of the machine "
        "running it; remove it (to match the characters '${', write '$' || '{')"
    )


def no_substitution(text: str) -> str:
    """``text`` unchanged, or ValueError saying why it holds a ``${`` Spark would expand."""
    reason = substitution_refusal(text)
    if reason:
        raise ValueError(reason)
    return text


SqlText = Annotated[str, AfterValidator(no_substitution)]
"""A spec field holding SQL text (see module docstring)."""
