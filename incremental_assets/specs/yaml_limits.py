"""What a YAML spec may cost to read: how many values it holds once its aliases are
expanded, and how deeply it nests.

A few lines of YAML can describe an enormous value: each ``*alias`` stands for the whole
value its ``&anchor`` names, so nine anchors of nine aliases each are 9**9 values ("an
alias bomb"). Read naively, anything that walks the value (turning options into text,
rendering templates, validating) runs for minutes and fills the memory; a value nested
100,000 levels deep overflows Python's stack. Both are refused while the file is read,
before any value is built, naming the line:

- :class:`LimitedComposer`: a mix-in for a PyYAML loader that counts each node once per
  use (an alias counts every value its anchor holds) and the nesting depth;
- :func:`value_problem`: the same limits over a value already parsed by someone else
  (Dagster parses a component's ``defs.yaml``), without expanding what aliases share.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_VALUES = 200_000
"""Values a spec file may hold once its aliases are expanded (a table takes about 30)."""
MAX_DEPTH = 64
"""Levels a spec file may nest (a table spec nests 7: quality, rules, a rule, its check)."""

_TOO_MANY = (
    f"the file holds more than {MAX_VALUES:,} values once its aliases are expanded (each "
    "*alias counts every value of its anchor); write the values out, or use fewer aliases "
    "of aliases"
)
_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep; a table spec needs 7"
_RECURSIVE = "an alias used inside the value its anchor names (a value that contains itself)"

Path = list[Any]


class LimitedComposer:
    """Mix in before ``yaml.SafeLoader``: refuses documents past :data:`MAX_VALUES` or
    :data:`MAX_DEPTH` with a ``ComposerError`` at the node that crossed the limit.

    The counting happens while nodes are composed, before any Python value is built, and
    costs one addition per alias, so a bomb is refused after reading a few lines.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)  # type: ignore[call-arg]
        self._values = 0
        self._depth = 0
        self._sizes: dict[str, int] = {}  # anchor -> values it holds, once composed

    def compose_document(self) -> Any:
        self._sizes = {}  # anchors are per document
        return super().compose_document()  # type: ignore[misc]

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[attr-defined]
        if isinstance(event, yaml.AliasEvent):
            anchor = event.anchor
            if anchor in self.anchors and anchor not in self._sizes:  # type: ignore[attr-defined]
                # PyYAML would build a list that contains itself; nothing in a spec needs one.
                raise yaml.composer.ComposerError(None, None, _RECURSIVE, event.start_mark)
            self._count(self._sizes.get(anchor, 0), event)
            return super().compose_node(parent, index)  # type: ignore[misc]
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, _TOO_DEEP, event.start_mark)
        before = self._values
        self._count(1, event)
        self._depth += 1
        try:
            node = super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            self._depth -= 1
        if event.anchor is not None:
            self._sizes[event.anchor] = self._values - before
        return node

    def _count(self, values: int, event: Any) -> None:
        self._values += values
        if self._values > MAX_VALUES:
            raise yaml.composer.ComposerError(None, None, _TOO_MANY, event.start_mark)


def yaml_problem(exc: yaml.YAMLError, source: str) -> str:
    """A YAML error as one line: ``<source>, line L, column C: <problem> (<context>)``."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return f"{source}: {' '.join(str(exc).split())}"
    mark = exc.problem_mark
    text = f"{source}, line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
    if exc.context:
        where = f" at line {exc.context_mark.line + 1}" if exc.context_mark else ""
        text += f" ({exc.context}{where})"
    return text


def value_problem(value: Any) -> tuple[Path, str] | None:
    """Where a parsed value crosses :data:`MAX_VALUES` or :data:`MAX_DEPTH` (the path of
    keys and indexes, and what is wrong), or None.

    Lists and mappings shared by several places (what aliases parse to) are measured once
    and counted once per place, so this costs as much as the file's text, not the value's
    expansion; it walks with its own stack, so depth cannot overflow Python's.
    """
    done: dict[int, tuple[int, int]] = {}  # id -> (values, depth) of a finished container
    open_ids: set[int] = set()
    # A frame: the container, its path, its children still to visit, values, depth so far.
    stack: list[list[Any]] = []

    def enter(item: Any, path: Path) -> tuple[Path, str] | None:
        """Push a container, or account for a scalar or a finished container."""
        if not isinstance(item, (dict, list)):
            return _add(stack, 1, 1, path)
        if id(item) in open_ids:
            return path, _RECURSIVE
        if id(item) in done:
            values, depth = done[id(item)]
            if len(stack) + depth > MAX_DEPTH:
                return path, _TOO_DEEP
            return _add(stack, values, depth, path)
        if len(stack) >= MAX_DEPTH:
            return path, _TOO_DEEP
        children = (
            [c for k, v in item.items() for c in ((k, None), (v, k))]
            if isinstance(item, dict)
            else [(v, i) for i, v in enumerate(item)]
        )
        open_ids.add(id(item))
        stack.append([item, path, iter(children), 1, 1])
        return None

    found = enter(value, [])
    while stack and found is None:
        frame = stack[-1]
        item, path, children = frame[0], frame[1], frame[2]
        child = next(children, None)
        if child is not None:
            # A mapping's key is counted as a value; its problems are reported at the mapping.
            found = enter(child[0], path if child[1] is None else [*path, child[1]])
            continue
        stack.pop()
        open_ids.discard(id(item))
        done[id(item)] = (frame[3], frame[4])
        found = _add(stack, frame[3], frame[4], path) if stack else None
        if found is None and frame[3] > MAX_VALUES:
            found = path, _TOO_MANY
    return found


def _add(stack: list[list[Any]], values: int, depth: int, path: Path) -> tuple[Path, str] | None:
    if not stack:
        return (path, _TOO_MANY) if values > MAX_VALUES else None
    parent = stack[-1]
    parent[3] += values
    parent[4] = max(parent[4], depth + 1)
    if parent[3] > MAX_VALUES:
        return path, _TOO_MANY
    return None
