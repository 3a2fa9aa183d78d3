"""Reading a configuration's YAML: duplicate keys, nesting depth and alias expansion refused."""

from __future__ import annotations

import pytest

from token_finalizer._config_yaml import ConfigShapeError, check_shape, load_config_yaml
from token_finalizer._constants import CONFIG_MAX_DEPTH, CONFIG_MAX_VALUES

# About 1 KB of YAML standing for 9**9 (387 million) values once aliases are expanded.
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n"
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
)


def test_a_duplicate_key_is_refused_with_its_line() -> None:
    """The second `auth` would replace the first: refused, naming the key and its line."""
    with pytest.raises(
        ConfigShapeError, match=r"key 'auth' appears twice in one mapping \(line 2\)"
    ):
        load_config_yaml("auth: {bearer_tokens: [t]}\nauth: {}\n")


def test_a_duplicate_key_in_a_nested_mapping_is_refused() -> None:
    """Every mapping is checked, not only the top level."""
    with pytest.raises(ConfigShapeError, match="key 'dir' appears twice"):
        load_config_yaml("sources:\n  local:\n    kind: file\n    dir: a\n    dir: b\n")


def test_merge_keys_may_be_overridden_key_by_key() -> None:
    """`<<: *defaults` then a key of the defaults is what a merge is for, not a duplicate."""
    text = "base: &base {kind: file, dir: a}\nlocal:\n  <<: *base\n  dir: b\n"
    assert load_config_yaml(text)["local"] == {"kind": "file", "dir": "b"}


def test_nesting_past_the_bound_is_refused_without_recursing() -> None:
    """20,000 nested lists are refused by depth, with the line, before any recursion limit."""
    text = "x: " + "[" * 20_000 + "]" * 20_000 + "\n"
    with pytest.raises(ConfigShapeError, match=f"nests deeper than {CONFIG_MAX_DEPTH} levels"):
        load_config_yaml(text)


def test_nesting_at_the_bound_is_read() -> None:
    """A document exactly CONFIG_MAX_DEPTH levels deep (the top mapping counted) is fine."""
    depth = CONFIG_MAX_DEPTH - 1
    text = "x: " + "[" * depth + "]" * depth + "\n"
    assert load_config_yaml(text) is not None


def test_an_alias_bomb_is_refused_by_its_expanded_size() -> None:
    """A 1 KB file of aliases repeating aliases is refused once it passes the value bound."""
    assert len(ALIAS_BOMB) < 1024
    with pytest.raises(ConfigShapeError, match=f"more than {CONFIG_MAX_VALUES} values"):
        load_config_yaml(ALIAS_BOMB)


def test_a_few_aliases_are_fine() -> None:
    """Anchors and aliases in an ordinary configuration are read as before."""
    text = "a: &t [x, y]\nb: *t\nc: *t\n"
    assert load_config_yaml(text) == {"a": ["x", "y"], "b": ["x", "y"], "c": ["x", "y"]}


def test_check_shape_counts_shared_values_as_often_as_they_are_reached() -> None:
    """One list reached 1,001 times counts 1,001 times its values (what a walk would visit)."""
    shared = list(range(100))
    with pytest.raises(ConfigShapeError, match="more than"):
        check_shape({str(i): shared for i in range(1_001)})
