"""Reading a configuration file's YAML without being surprised or stalled by it.

PyYAML's safe loader, with three refusals a configuration needs
(docs/configuration.md#loading):

- a key twice in one mapping (the second would silently replace the first:
  a second `auth: {}` would switch authentication off);
- nesting deeper than CONFIG_MAX_DEPTH (the loader recurses per level: 20,000
  levels would end in a RecursionError);
- more than CONFIG_MAX_VALUES values once aliases are expanded (a 1 KB file of
  aliases repeating aliases stands for billions of values, which every later
  walk over the configuration would visit).

Every refusal is a `ConfigShapeError` with one line naming the problem and,
where there is one, its line in the file.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node

from token_finalizer._constants import CONFIG_MAX_DEPTH, CONFIG_MAX_VALUES

__all__ = ["ConfigShapeError", "check_shape", "load_config_yaml", "yaml_problem"]

_MERGE_TAG = "tag:yaml.org,2002:merge"


class ConfigShapeError(ValueError):
    """A configuration refused for its shape (duplicate key, too deep, too many values)."""


def _line(node: Node) -> str:
    return f"line {node.start_mark.line + 1}"


class _ConfigLoader(yaml.SafeLoader):
    """The safe loader, refusing duplicate keys and deep nesting while it composes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._depth += 1
        try:
            if self._depth > CONFIG_MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]  # stubs
                raise ConfigShapeError(
                    f"nests deeper than {CONFIG_MAX_DEPTH} levels (line {mark.line + 1})"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # `<<: *defaults` may be overridden key by key
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable):
                if key in seen:
                    raise ConfigShapeError(
                        f"key {key!r} appears twice in one mapping ({_line(key_node)}); "
                        "the second would silently replace the first"
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


def check_shape(data: Any, *, what: str = "the configuration") -> None:
    """ConfigShapeError when `data` nests too deep or holds too many values, aliases expanded.

    Walked without recursion, and stopped as soon as a bound is passed: an
    alias bomb is refused after CONFIG_MAX_VALUES steps, not after billions.
    """
    pending: list[tuple[Any, int]] = [(data, 1)]
    values = 0
    while pending:
        value, depth = pending.pop()
        values += 1
        if values > CONFIG_MAX_VALUES:
            raise ConfigShapeError(
                f"{what} holds more than {CONFIG_MAX_VALUES} values once its aliases are "
                "expanded (aliases repeating aliases?)"
            )
        if depth > CONFIG_MAX_DEPTH:
            raise ConfigShapeError(f"{what} nests deeper than {CONFIG_MAX_DEPTH} levels")
        if isinstance(value, dict):
            pending.extend((item, depth + 1) for pair in value.items() for item in pair)
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)


def load_config_yaml(text: str) -> Any:
    """The parsed document; ConfigShapeError or yaml.YAMLError when it cannot be used."""
    loader = _ConfigLoader(text)
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    check_shape(data)
    return data


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong, and where."""
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        where = "" if mark is None else f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = error.problem or error.context or "invalid YAML"
        return f"{problem}{where}"
    return " ".join(str(error).split())
