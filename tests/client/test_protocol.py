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
    call_path,
    check_call_id,
    check_new_rollout_id,
    check_rollout_id,
    rollout_path,
)

_UNSAFE_IDS = ["", ".", "..", "a/b", "a\\b", "a%2Fb", "a b", "a\x00b", "ａｂ", "é", "a\nb", None, 3]
# Call ids engines and harnesses use, all accepted by NeMo Gym 0.7.
_ENGINE_CALL_IDS = [
    "chatcmpl-9f86d081884c7d659a2feaa0c55ad015",
    "agent:3/call-7",
    "resp_abc:def",
    "a b",
    "50%2F",
    ".",
    "..",
    "../etc/passwd",
    "é-ü-調用",
    "a\u2028b",
    "  padded  ",
]


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


@pytest.mark.parametrize("bad", ["_x1", "-x1", ".x1", "__", "-"])
def test_a_new_rollout_id_starts_with_a_letter_or_digit(bad: str) -> None:
    """Writers refuse an id starting with `_`, `-` or `.`, naming it and Gym's rule."""
    with pytest.raises(InvalidIdError) as refused:
        check_new_rollout_id(bad)
    assert f"rollout_id {bad!r} must match ^[A-Za-z0-9][A-Za-z0-9._-]*$" in str(refused.value)


@pytest.mark.parametrize("bad", _UNSAFE_IDS)
def test_a_new_rollout_id_is_a_store_id_first(bad: object) -> None:
    """Every store id refusal holds for writers too, in the same words."""
    with pytest.raises(InvalidIdError, match="must be a non-empty string"):
        check_new_rollout_id(bad)


@pytest.mark.parametrize("rollout_id", ["x1", "7-0", "a._-b", "9", "A" * MAX_ID_LENGTH])
def test_a_new_rollout_id_keeping_the_rule_passes_unchanged(rollout_id: str) -> None:
    """Ids finalize takes are written as they are."""
    assert check_new_rollout_id(rollout_id) == rollout_id


def test_a_store_id_breaking_the_writers_rule_still_addresses_a_capture() -> None:
    """Reads and deletes take `_x1`: a capture written before the rule can still be removed."""
    assert rollout_path("_x1", "freeze") == "/ng-rollout/_x1/training-token-capture/freeze"


@pytest.mark.parametrize("call_id", _ENGINE_CALL_IDS)
def test_call_ids_engines_use_are_accepted_unchanged(call_id: str) -> None:
    """Colons, slashes, spaces, `%`, dots and non-ASCII letters: any id 0.7 accepts passes."""
    assert check_call_id(call_id) == call_id


@pytest.mark.parametrize("bad", ["", None, 3, b"c1"])
def test_call_ids_that_are_not_a_non_empty_string_are_refused(bad: object) -> None:
    """An empty call id, or one that is not a string, is refused."""
    with pytest.raises(InvalidIdError, match="must be a non-empty string"):
        check_call_id(bad)


@pytest.mark.parametrize(
    "bad", ["a\x00b", "a\nb", "a\rb", "tab\there", "del\x7f", "c1\x85", "\ud800"]
)
def test_call_ids_with_control_characters_or_lone_surrogates_are_refused(bad: str) -> None:
    """C0 and C1 controls, DEL and lone surrogates are refused, naming the character."""
    with pytest.raises(InvalidIdError, match="control characters and lone surrogates"):
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
        check_rollout_id("/" * 1000)
    expected = f"rollout_id '{'/' * 200}...' must be a non-empty string of ASCII letters, "
    assert str(refused.value).startswith(expected)


def test_a_call_id_one_character_too_long_is_refused_with_its_length() -> None:
    """A call id is bounded like a rollout id: 201 characters are refused, saying so."""
    with pytest.raises(InvalidIdError) as refused:
        check_call_id("/" * 201)
    assert str(refused.value) == "model_call_id is 201 characters long; at most 200 are accepted"


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


@pytest.mark.parametrize(
    ("call_id", "segment"),
    [
        ("c1", "c1"),
        ("agent:3/call-7", "agent%3A3%2Fcall-7"),
        ("50%2F", "50%252F"),
        ("a b?#", "a%20b%3F%23"),
        ("é", "%C3%A9"),
        (".", "%2E"),
        ("..", "%2E%2E"),
    ],
)
def test_call_path_percent_encodes_the_call_id_into_one_segment(call_id: str, segment: str) -> None:
    """Every reserved character is encoded, and `.`/`..` too (URL normalization eats them)."""
    assert call_path("r-1", call_id) == f"/ng-rollout/r-1/training-token-capture/calls/{segment}"


def test_call_path_checks_both_ids_first() -> None:
    """Neither an unsafe rollout id nor a call id with a control character becomes a path."""
    for rollout_id, call_id in (("../x", "c1"), ("r-1", "a\nb")):
        with pytest.raises(InvalidIdError):
            call_path(rollout_id, call_id)


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
