"""The shared wire contract (`token_finalizer_client.protocol`): id rule, paths, and its purity."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from token_finalizer_client import protocol
from token_finalizer_client.protocol import (
    MAX_ID_LENGTH,
    ROLLOUT_ROUTE,
    InvalidIdError,
    check_call_id,
    check_rollout_id,
    rollout_path,
)

_UNSAFE_IDS = ["", ".", "..", "a/b", "a\\b", "a%2Fb", "a b", "a\x00b", "ａｂ", "é", "a\nb", None, 3]


def _loaded_after(statement: str) -> list[str]:
    """The modules a fresh interpreter has loaded after running `statement`."""
    probe = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(result.stdout)
    return loaded


# -- the id rule -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", _UNSAFE_IDS)
def test_rollout_ids_outside_the_safe_alphabet_are_refused(bad: object) -> None:
    """A rollout id admits only ASCII letters, digits, '.', '_' and '-', and is not '.' or '..'."""
    with pytest.raises(InvalidIdError, match="must be a non-empty string"):
        check_rollout_id(bad)


@pytest.mark.parametrize("bad", _UNSAFE_IDS)
def test_call_ids_outside_the_safe_alphabet_are_refused(bad: object) -> None:
    """A model call id follows the same rule as a rollout id today."""
    with pytest.raises(InvalidIdError, match="must be a non-empty string"):
        check_call_id(bad)


def test_ids_of_the_longest_length_pass_unchanged() -> None:
    """An id of exactly MAX_ID_LENGTH (200) safe characters is returned as it is."""
    longest = "a" * MAX_ID_LENGTH
    assert (MAX_ID_LENGTH, check_rollout_id(longest), check_call_id(longest)) == (
        200,
        longest,
        longest,
    )


def test_an_id_one_character_too_long_is_refused_with_its_length() -> None:
    """201 characters: refused, and the message gives the length and the limit."""
    message = "rollout_id is 201 characters long; at most 200 are accepted"
    with pytest.raises(InvalidIdError) as refused:
        check_rollout_id("a" * 201)
    assert str(refused.value) == message


def test_a_huge_unsafe_id_is_not_echoed_whole() -> None:
    """An unsafe id over the limit is shown cut at the limit, with '...'."""
    with pytest.raises(InvalidIdError) as refused:
        check_call_id("/" * 1000)
    expected = f"model_call_id '{'/' * 200}...' must be a non-empty string of ASCII letters, "
    assert str(refused.value).startswith(expected)


def test_the_message_names_the_field_it_was_given() -> None:
    """`what` names the id in the message: callers say which field was wrong."""
    with pytest.raises(InvalidIdError) as refused:
        check_rollout_id("a b", "rollout id")
    assert str(refused.value) == (
        "rollout id 'a b' must be a non-empty string of ASCII letters, digits, '.', '_' or '-'"
    )


def test_invalid_id_error_is_a_value_error() -> None:
    """Callers catching ValueError (NeMo Gym's sinks do) also catch a bad id."""
    assert issubclass(InvalidIdError, ValueError)


# -- protocol paths -------------------------------------------------------------------------------


def test_rollout_path_keeps_the_correlation_segment() -> None:
    """A protocol path is `/ng-rollout/{id}/training-token-capture/{operation}`."""
    assert rollout_path("3-0", "calls/c1") == "/ng-rollout/3-0/training-token-capture/calls/c1"


def test_rollout_path_checks_the_id_first() -> None:
    """An unsafe rollout id never becomes part of a path."""
    with pytest.raises(InvalidIdError):
        rollout_path("../x", "freeze")


def test_the_route_template_is_the_path_prefix() -> None:
    """A server mounting ROLLOUT_ROUTE serves exactly the paths rollout_path builds."""
    mounted = ROLLOUT_ROUTE.format(rollout_id="r-1")
    assert rollout_path("r-1", "freeze") == f"{mounted}/freeze"


# -- purity --------------------------------------------------------------------------------------


def test_importing_the_protocol_loads_no_http_library() -> None:
    """`import token_finalizer_client.protocol` loads neither httpx nor zstandard nor stamina."""
    loaded = _loaded_after("import token_finalizer_client.protocol")
    heavy = [name for name in loaded if name.split(".")[0] in {"httpx", "zstandard", "stamina"}]
    assert ("token_finalizer_client.protocol" in loaded, heavy) == (True, [])


def test_package_names_still_import_on_first_use() -> None:
    """`from token_finalizer_client import FinalizerClient` works: the package loads it lazily."""
    loaded = _loaded_after("from token_finalizer_client import FinalizerClient")
    assert "token_finalizer_client._client" in loaded


def test_every_public_name_is_in_all() -> None:
    """The module's `__all__` lists exactly its public names."""
    public = {name for name in vars(protocol) if not name.startswith("_")} - {"annotations"}
    assert public == set(protocol.__all__)
