"""Text printed on a terminal. What people typed (a rewind's ``--reason`` and ``--by``) and
what the Delta log holds (paths, names, sources) is kept as given and printed escaped, so
no value can forge a line of the output or send the terminal an escape sequence.

Example:
    >>> printable("restored\\n* orders: reset by admin\\x1b[2J")
    'restored\\\\n* orders: reset by admin\\\\x1b[2J'
"""

from __future__ import annotations

import unicodedata

# Control characters (C0, DEL, C1), format characters (bidirectional overrides, zero-width
# ones), line and paragraph separators, and lone surrogates.
_ESCAPED = {"Cc", "Cf", "Zl", "Zp", "Cs"}
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every character of ``_ESCAPED`` written as an escape (``\\n``,
    ``\\x1b``, ``\\u202e``). With ``lines``, newlines are kept: for the program's own
    messages of several lines, whose values were escaped already or are not typed text."""
    if text.isprintable():  # the common case: nothing to escape
        return text
    return "".join(_escape(c) if _shown_escaped(c, lines) else c for c in text)


def _shown_escaped(char: str, lines: bool) -> bool:
    if char == "\n" and lines:
        return False
    return unicodedata.category(char) in _ESCAPED


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
