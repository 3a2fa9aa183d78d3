"""Rollout identity (docs/records-and-builds.md#rollout-identity) and store-key validation."""

from __future__ import annotations

import pytest

from token_finalizer import InvalidRolloutId, check_store_id, rollout_id_of
from token_finalizer.core.identity import check_model_call_id, check_new_store_id


def test_explicit_rollout_id_wins() -> None:
    """_ng_rollout_id is used as is, even when task and rollout indices are present."""
    record = {"_ng_rollout_id": "abc.1_x-2", "_ng_task_index": 3, "_ng_rollout_index": 0}
    assert rollout_id_of(record) == "abc.1_x-2"


def test_task_and_rollout_index_compose_the_id() -> None:
    """Without _ng_rollout_id the id is '<task>-<rollout>'."""
    assert rollout_id_of({"_ng_task_index": 3, "_ng_rollout_index": 0}) == "3-0"


def test_attempt_above_zero_appends_suffix() -> None:
    """A positive attempt index appends '-a<attempt>'."""
    record = {"_ng_task_index": 3, "_ng_rollout_index": 0, "_ng_attempt_index": 2}
    assert rollout_id_of(record) == "3-0-a2"


def test_attempt_zero_appends_nothing() -> None:
    """Attempt 0 is the first attempt and leaves the id unchanged."""
    record = {"_ng_task_index": 3, "_ng_rollout_index": 0, "_ng_attempt_index": 0}
    assert rollout_id_of(record) == "3-0"


def test_attempt_applies_to_explicit_id() -> None:
    """The attempt suffix is appended to an explicit id too."""
    assert rollout_id_of({"_ng_rollout_id": "r", "_ng_attempt_index": "1"}) == "r-a1"


def test_missing_rollout_index_means_no_id() -> None:
    """Only one of the two indices present: there is no capture key."""
    assert rollout_id_of({"_ng_task_index": 3}) is None


def test_non_object_record_has_no_id() -> None:
    """A record that is not a JSON object has no id."""
    assert rollout_id_of([1, 2]) is None


@pytest.mark.parametrize("bad", ["", "-lead", "a/b", "a b", "é", "..", 7, "a%2Fb"])
def test_malformed_explicit_id_is_refused(bad: object) -> None:
    """A malformed _ng_rollout_id raises instead of being rewritten."""
    with pytest.raises(InvalidRolloutId):
        rollout_id_of({"_ng_rollout_id": bad})


def test_non_integer_attempt_is_malformed() -> None:
    """A non-integer attempt index is a malformed id."""
    with pytest.raises(InvalidRolloutId, match="_ng_attempt_index"):
        rollout_id_of({"_ng_rollout_id": "r", "_ng_attempt_index": "two"})


@pytest.mark.parametrize(
    "bad",
    [
        "",
        ".",
        "..",
        "a/b",
        "a\\b",
        "%2e%2e",
        "a%2Fb",
        "a b",
        "a\x00b",
        "ａｂ",
        "é",
        "a\nb",
        None,
        3,
    ],
)
def test_store_ids_outside_the_safe_alphabet_are_refused(bad: object) -> None:
    """Store keys admit only ASCII letters, digits, '.', '_' and '-'."""
    with pytest.raises(InvalidRolloutId):
        check_store_id(bad)


def test_store_id_accepts_the_safe_alphabet() -> None:
    """A key made of the safe alphabet passes unchanged."""
    assert check_store_id("Run_1.attempt-2") == "Run_1.attempt-2"


def test_store_id_refusal_names_the_id_and_the_alphabet() -> None:
    """A refused key's message quotes it and names the safe alphabet, word for word."""
    with pytest.raises(InvalidRolloutId) as refused:
        check_store_id("a/b")
    assert str(refused.value) == (
        "rollout id 'a/b' must be a non-empty string of ASCII letters, digits, '.', '_' or '-'"
    )


def test_store_id_of_201_characters_is_refused_with_its_length() -> None:
    """Ids become file and key names: more than 200 characters is refused, saying how many."""
    assert check_store_id("r" * 200) == "r" * 200
    with pytest.raises(InvalidRolloutId) as refused:
        check_store_id("r" * 201, what="rollout_id")
    assert str(refused.value) == "rollout_id is 201 characters long; at most 200 are accepted"


def test_model_call_id_refusal_is_an_invalid_rollout_id_naming_the_field() -> None:
    """A bad model call id raises InvalidRolloutId (what stores handle) naming model_call_id."""
    with pytest.raises(InvalidRolloutId, match=r"^model_call_id 'a\\nb' holds '\\n'"):
        check_model_call_id("a\nb")


@pytest.mark.parametrize("call_id", ["call_1.retry-2", "agent:3/call-7", "..", "é 1", "50%"])
def test_model_call_id_accepts_what_engines_name_calls(call_id: str) -> None:
    """Colons, slashes, dots, spaces, `%` and non-ASCII letters pass unchanged."""
    assert check_model_call_id(call_id) == call_id


@pytest.mark.parametrize("bad", ["_x1", "-x1", ".x1"])
def test_a_new_store_id_keeps_gyms_rule(bad: str) -> None:
    """A write's id starting with `_`, `-` or `.` is an InvalidRolloutId naming it and the rule."""
    with pytest.raises(InvalidRolloutId) as refused:
        check_new_store_id(bad)
    assert f"{bad!r} must match ^[A-Za-z0-9][A-Za-z0-9._-]*$" in str(refused.value)


def test_the_writers_rule_is_the_one_finalize_applies() -> None:
    """An id a writer may use is one `_ng_rollout_id` may name, and the other way round."""
    for rollout_id in ("x1", "_x1", "-x1", ".x1", "7-0.a_b"):
        record = {"_ng_rollout_id": rollout_id}
        try:
            check_new_store_id(rollout_id)
        except InvalidRolloutId:
            with pytest.raises(InvalidRolloutId):
                rollout_id_of(record)
        else:
            assert rollout_id_of(record) == rollout_id
