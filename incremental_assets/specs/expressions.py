"""Quality-rule checks: Spark SQL expressions over one row, and nothing more.

A rule's ``check`` is evaluated by Spark on every extracted row, and the number of rows
failing it is published as metadata. Spark SQL can do far more than judge a row: call any
static Java method (``reflect``, ``java_method``), read files, run subqueries against other
tables, run several statements. So a check is tokenized here and refused when the specs
load if it holds:

- a ``${`` anywhere, quoted or not: Spark would substitute environment variables, Java
  system properties and settings into the text before parsing it (specs/sql_text.py);
- a statement separator (``;``) or a comment (``--``, ``/*``);
- a subquery or a table reference (SELECT, FROM, TABLE, VALUES, EXISTS, WITH, the pipe
  operator ``|>``);
- a qualified function name (``a.b(...)``) or a function not in :data:`ALLOWED_FUNCTIONS`.

The allowed functions are deterministic and row-level: the same row always gets the same
verdict, so re-running a window or replaying the quarantine judges it the same way. For
that reason the clock functions (``current_date``, ``current_timestamp``, ``now``) are
refused too: their answer depends on when the run happens, so a row quarantined on one day
would pass a re-run of the same window on the next.

The engine repeats the function and subquery checks on Spark's own parse tree before it
evaluates a check (``engine.quality``), using the same lists.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from incremental_assets.specs.sql_text import substitution_refusal

ALLOWED_FUNCTIONS: frozenset[str] = frozenset(
    {
        # conditionals and null handling
        "if", "coalesce", "nvl", "nvl2", "ifnull", "nullif", "isnull", "isnotnull",
        "isnan", "nanvl", "equal_null", "zeroifnull", "nullifzero", "not", "between",
        # pattern matching
        "like", "ilike", "rlike", "regexp", "regexp_like", "regexp_extract",
        "regexp_replace",
        # strings
        "length", "char_length", "character_length", "octet_length", "bit_length",
        "lower", "lcase", "upper", "ucase", "initcap", "trim", "ltrim", "rtrim", "btrim",
        "substring", "substr", "concat", "concat_ws", "startswith", "endswith", "contains",
        "replace", "translate", "lpad", "rpad", "instr", "locate", "position", "left",
        "right", "reverse", "split", "split_part", "ascii", "char", "chr",
        # numbers
        "abs", "round", "bround", "floor", "ceil", "ceiling", "greatest", "least", "mod",
        "pmod", "sign", "signum", "power", "pow", "sqrt", "exp", "ln", "log", "log10",
        "log2", "negative", "positive", "try_add", "try_subtract", "try_multiply",
        "try_divide",
        # casts (CAST / TRY_CAST syntax, and the type-named cast functions)
        "cast", "try_cast", "boolean", "tinyint", "smallint", "int", "bigint", "float",
        "double", "decimal", "string", "date", "timestamp",
        # dates and times (no clock: see the module docstring)
        "to_date", "to_timestamp", "try_to_timestamp", "year", "month", "day",
        "dayofmonth", "dayofweek", "dayofyear", "weekday", "weekofyear", "quarter", "hour",
        "minute", "second", "date_add", "date_sub", "datediff", "date_diff", "date_trunc",
        "trunc", "date_format", "last_day", "add_months", "months_between", "make_date",
        "extract", "date_part", "unix_date", "unix_seconds", "unix_millis",
        "to_unix_timestamp", "timestamp_seconds", "timestamp_millis",
        # arrays
        "array", "array_contains", "size", "cardinality", "array_size", "element_at",
    }
)  # fmt: skip
"""Functions a check may call (lower case)."""

_JAVA = (
    "calls a Java method, which can read the machine's environment variables, files and "
    "settings (and leak them through the rule's failure counts)"
)
_REFUSED: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"reflect", "java_method", "try_reflect"}), _JAVA),
    (
        frozenset(
            {
                "input_file_name", "input_file_block_start", "input_file_block_length",
                "read_files", "read_csv", "read_json", "read_parquet", "read_text",
            }
        ),
        "reads files or file names, not the row's values",
    ),
    (
        frozenset(
            {
                "rand", "randn", "random", "randstr", "uniform", "uuid", "shuffle",
                "monotonically_increasing_id", "spark_partition_id",
            }
        ),
        "is not deterministic: re-running a window or replaying the quarantine would judge "
        "the same row differently, which breaks idempotent merges",
    ),
    (
        frozenset(
            {
                "current_date", "current_timestamp", "current_time", "curdate", "now",
                "localtimestamp", "current_timezone", "unix_timestamp",
            }
        ),
        "reads the clock: its answer depends on when the run happens, so re-running a "
        "window or replaying the quarantine would judge the same row differently; compare "
        "with a fixed value instead, e.g. updated_at < TIMESTAMP'2100-01-01 00:00:00'",
    ),
    (
        frozenset(
            {
                "current_user", "user", "session_user", "system_user", "current_role",
                "current_database", "current_schema", "current_catalog", "version",
                "secret", "try_secret",
            }
        ),
        "reads the session (user, catalog, secrets), not the row's values",
    ),
    (
        frozenset(
            {
                "sum", "count", "count_if", "avg", "mean", "min", "max", "min_by", "max_by",
                "any", "some", "every", "bool_and", "bool_or", "first", "last", "any_value",
                "collect_list", "collect_set", "array_agg", "listagg", "string_agg",
                "stddev", "stddev_pop", "stddev_samp", "variance", "var_pop", "var_samp",
                "median", "mode", "percentile", "percentile_approx", "approx_percentile",
                "approx_count_distinct", "count_min_sketch", "corr", "covar_pop",
                "covar_samp", "kurtosis", "skewness", "histogram_numeric", "grouping",
                "grouping_id",
            }
        ),
        "aggregates over many rows; a rule judges one row at a time",
    ),
    (
        frozenset(
            {
                "row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile",
                "lag", "lead", "nth_value", "first_value", "last_value",
            }
        ),
        "is a window function over many rows; a rule judges one row at a time",
    ),
    (
        frozenset(
            {"explode", "explode_outer", "posexplode", "posexplode_outer", "inline", "stack"}
        ),
        "produces rows, not a value for one row",
    ),
)  # fmt: skip

# Keywords that read or name other tables, or start a subquery.
_SUBQUERY = frozenset({"select", "table", "values", "with", "exists", "lateral"})
# Keywords written before '(' that are syntax, not a function call.
_SYNTAX_BEFORE_PAREN = frozenset(
    {
        "and", "or", "not", "in", "is", "case", "when", "then", "else", "between",
        "escape", "interval", "as", "div", "from", "for", "both", "leading", "trailing",
        "distinct", "to",
    }
)  # fmt: skip
# ANY / SOME / ALL are syntax after LIKE (``x LIKE ANY ('a%', 'b%')``), aggregates elsewhere.
_LIKE_QUANTIFIERS = frozenset({"any", "some", "all"})
_LIKE = frozenset({"like", "ilike", "rlike", "regexp"})
# Calls whose arguments may use FROM: ``trim(BOTH 'x' FROM s)``, ``substring(s FROM 2)``,
# ``extract(YEAR FROM ts)``.
_FROM_CALLS = frozenset({"trim", "ltrim", "rtrim", "btrim", "substring", "substr", "extract"})
# Names Spark reads as a function when written without parentheses (and no column has the
# name). `user` is left to the engine, which knows the columns: it is a common column name.
LITERAL_FUNCTIONS = frozenset(
    {"current_date", "current_timestamp", "current_time", "current_user", "user", "session_user"}
)
_BARE_FUNCTIONS = LITERAL_FUNCTIONS - {"user"}
# Type names taking parameters (``CAST(x AS DECIMAL(10, 2))``): integers only.
_PARAMETERIZED_TYPES = frozenset({"decimal", "dec", "numeric", "varchar", "char", "character"})

_OPERATORS = (
    "<=>", "|>", "->", "=>", "::", "<>", "!=", "<=", ">=", "==", "||", "&&",
    "=", "<", ">", "!", "+", "-", "*", "/", "%", "&", "|", "^", "~",
    "(", ")", "[", "]", ",", ".", ":",
)  # fmt: skip
_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?)(?:[eE][+-]?\d+)?(?:[bB][dD]|[lLsSyYdDfF])?(?![\w$])")
_WORD = re.compile(r"[\w$]+")
_ASCII_WORD = re.compile(r"[A-Za-z0-9_]+")
_QUOTES = {"'": "string", '"': "string", "`": "quoted"}


class RuleExpressionError(ValueError):
    """A check that is not an expression over one row. ``reason`` says why."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class Token:
    """``kind``: word (an unquoted identifier or keyword), quoted (a backquoted name),
    string, number or op. ``text`` is the name or the string's value, unquoted."""

    kind: str
    text: str
    pos: int

    @property
    def key(self) -> str:
        return self.text.lower()


def tokenize(text: str, what: str = "a check") -> list[Token]:
    """Split a Spark SQL expression (or query: ``what`` names it in errors) into tokens.

    Raises:
        RuleExpressionError: a ``${`` (even inside a string or a quoted name), a statement
            separator, a comment, an unterminated string or quoted name, or a character
            Spark SQL expressions do not use.
    """
    # Spark substitutes ${...} in the raw text before it tokenizes, so quotes do not
    # protect it: a string '${env:X}' would reach the row as the variable's value.
    substituted = substitution_refusal(text)
    if substituted:
        raise RuleExpressionError(substituted)
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c == ";":
            raise RuleExpressionError(f"';' at position {i + 1} separates SQL statements")
        elif text.startswith(("--", "/*"), i):
            raise RuleExpressionError(
                f"{text[i : i + 2]!r} at position {i + 1} starts a comment; comments can hide "
                f"what {what} runs, so they are not allowed in {what}"
            )
        elif c in _QUOTES:
            value, end = _quoted(text, i)
            tokens.append(Token(_QUOTES[c], value, i))
            i = end
        elif c.isdigit() and (number := _NUMBER.match(text, i)):
            tokens.append(Token("number", number.group(), i))
            i = number.end()
        elif word := _WORD.match(text, i):
            end = word.end()
            if word.group() in ("r", "R") and end < n and text[end] in "'\"":
                # A raw string: no escapes, it ends at the next quote of its kind.
                close = text.find(text[end], end + 1)
                if close < 0:
                    raise RuleExpressionError(f"the string at position {i + 1} is not closed")
                tokens.append(Token("string", text[end + 1 : close], i))
                i = close + 1
                continue
            if not _ASCII_WORD.fullmatch(word.group()):
                # Spark refuses such unquoted names; its keyword matching upper-cases
                # letters, so a long s (U+017F) in 'select' would still read as SELECT.
                raise RuleExpressionError(
                    f"{word.group()!r} at position {i + 1}: an unquoted name uses ASCII letters, "
                    f"digits and '_' only; write it in backquotes (`{word.group()}`)"
                )
            tokens.append(Token("word", word.group(), i))
            i = end
        else:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op is None:
                raise RuleExpressionError(
                    f"{c!r} at position {i + 1} is not part of a Spark SQL expression"
                )
            tokens.append(Token("op", op, i))
            i += len(op)
    return tokens


def _quoted(text: str, start: int) -> tuple[str, int]:
    """A string ('...' or "...", backslash escapes and doubled quotes) or a backquoted name
    (doubled backquotes) starting at ``start``: its value and the index after it."""
    quote = text[start]
    out: list[str] = []
    i = start + 1
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "`" and i + 1 < len(text):
            out.append(text[i : i + 2])
            i += 2
        elif c == quote:
            if text.startswith(quote, i + 1):
                out.append(quote)
                i += 2
            else:
                return "".join(out), i + 1
        else:
            out.append(c)
            i += 1
    what = "quoted name" if quote == "`" else "string"
    raise RuleExpressionError(f"the {what} at position {start + 1} is not closed")


def function_refusal(name: str) -> str | None:
    """Why a check may not call the function ``name``; None when it may."""
    key = name.lower()
    if key in ALLOWED_FUNCTIONS:
        return None
    for names, reason in _REFUSED:
        if key in names:
            return f"{name}() {reason}"
    if key == "identifier":
        return (
            "IDENTIFIER() names a column or function through text, which hides what the check "
            "calls; write the column's name instead (in backquotes if it has odd characters)"
        )
    close = difflib.get_close_matches(key, sorted(ALLOWED_FUNCTIONS), n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]}()?)" if close else ""
    return (
        f"{name}() is not one of the functions a check may call: only deterministic "
        f"row-level built-in functions are allowed, never UDFs or other functions{hint}"
    )


# The groups of refused functions a layer's SELECT may not call either: it may aggregate,
# rank and explode, but what it computes must depend on the rows alone (a layer refreshed
# from what changed must give what a full recompute gives).
_ROW_SOURCE_GROUPS = 5


def select_function_refusal(name: str) -> str | None:
    """Why a layer's SELECT may not call the function ``name`` (Java, files, randomness,
    the clock, the session); None when it may."""
    key = name.lower()
    for names, reason in _REFUSED[:_ROW_SOURCE_GROUPS]:
        if key in names:
            return f"{name}() {reason}"
    return None


def refusal(check: str) -> str | None:
    """Why ``check`` is not an expression over one row; None when it is (Spark may still
    find it invalid for the source's columns, which is reported when the table runs)."""
    if not check.strip():
        return "the check is empty"
    try:
        tokens = tokenize(check)
    except RuleExpressionError as exc:
        return exc.reason
    calls: list[str | None] = []  # for each open '(': the function it belongs to, if any
    for index, token in enumerate(tokens):
        before = tokens[index - 1] if index else None
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        if token.kind == "op":
            if token.text == "|>":
                return "the pipe operator |> runs a query on a table"
            if token.text == "(":
                named = before is not None and before.kind in ("word", "quoted")
                calls.append(before.key if named else None)
            elif token.text == ")" and calls:
                calls.pop()
            continue
        is_call = after is not None and after.kind == "op" and after.text == "("
        reason = _word_refusal(token, before, calls, is_call) if token.kind == "word" else None
        if reason is None and is_call and token.kind != "number":
            reason = _call_refusal(tokens, index)
        if reason:
            return reason
    return None


def _word_refusal(
    token: Token, before: Token | None, calls: list[str | None], is_call: bool
) -> str | None:
    """Why an unquoted word is refused as a keyword (or as a bare clock or user name)."""
    key = token.key
    backquote = f" (a column called {token.text} is written in backquotes: `{token.text}`)"
    if key in _SUBQUERY:
        return (
            f"{token.text.upper()} starts a subquery or names a table; a check may only read "
            f"the row's own columns{backquote}"
        )
    if key == "from" and not _from_allowed(before, calls):
        return (
            "FROM reads a table; a check may only read the row's own columns (FROM is "
            "allowed in IS [NOT] DISTINCT FROM, trim(... FROM s), substring(s FROM n) and "
            "extract(... FROM ts))"
        )
    if key in ("over", "window"):
        return (
            f"{token.text.upper()} makes a window over many rows; a check judges one row at a "
            f"time{backquote}"
        )
    if key in _BARE_FUNCTIONS and not is_call:
        return function_refusal(token.text)
    return None


def _call_refusal(tokens: list[Token], index: int) -> str | None:
    """Why the name at ``index``, followed by '(', is refused as a function call."""
    token = tokens[index]
    before = tokens[index - 1] if index else None
    if before is not None and before.kind == "op" and before.text == ".":
        return (
            f"{token.text}() is called with a qualified name (a catalog, schema or package); "
            "a check may only call built-in functions by their plain name"
        )
    if token.kind == "word":
        key = token.key
        if key in _SYNTAX_BEFORE_PAREN:
            return None
        if key in _LIKE_QUANTIFIERS and before is not None and before.key in _LIKE:
            return None
        if key in _PARAMETERIZED_TYPES and _integer_arguments(tokens, index + 1):
            return None
    return function_refusal(token.text)


def _from_allowed(before: Token | None, calls: list[str | None]) -> bool:
    if before is not None and before.kind == "word" and before.key == "distinct":
        return True
    return bool(calls) and calls[-1] in _FROM_CALLS


def _integer_arguments(tokens: list[Token], open_index: int) -> bool:
    """The parenthesis at ``open_index`` holds only integers and commas, as a type's
    parameters do (``DECIMAL(10, 2)``)."""
    for token in tokens[open_index + 1 :]:
        if token.kind == "op" and token.text == ")":
            return True
        if not (token.kind == "number" and token.text.isdigit()) and token.text != ",":
            return False
    return False


def validate_check(name: str | None, check: str) -> str:
    """``check`` unchanged when it is an expression over one row.

    Raises:
        ValueError: naming the rule and the reason.
    """
    reason = refusal(check)
    if reason is None:
        return check
    rule = f"rule {name!r}" if name else "this rule"
    raise ValueError(
        f"{rule} is refused: {reason}. Change the check to one expression over the row's "
        "columns, using operators, CASE, IN, BETWEEN, LIKE, CAST and the functions the "
        "docs/quality.md lists (section 'What a rule may contain')"
    )
