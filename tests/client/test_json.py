"""JSON both ways: orjson when installed, and a stdlib path that writes the same bytes."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import orjson
import pytest

from token_finalizer_client import _json

# Payloads without floats: both encoders must write the very same bytes.
EXACT: list[Any] = [
    {"rollout_id": "r-1", "model_call_id": "c/1:2", "prompt_token_ids": [1, 2, 3], "x": None},
    {"text": 'héllo \u2028 ☃ 🎉 "quoted" back\\slash / tab\t nl\n cr\r bell\x07 del\x7f'},
    {"ids": [0, 2**32, 2**63 - 1, 2**63, 2**64 - 1], "flags": [True, False], "nested": [[], {}]},
    ["a", 1, None, {"k": [{"deep": "er"}]}],
]


@pytest.mark.parametrize("payload", EXACT, ids=["entry", "text", "ids", "nested"])
def test_both_encoders_write_the_same_bytes(payload: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without floats, orjson's bytes and the stdlib fallback's are identical."""
    fast = _json.dumps(payload)
    monkeypatch.setattr(_json, "_orjson", None)
    assert _json.dumps(payload) == fast


def test_orjson_writes_a_payload_it_can_encode_exactly() -> None:
    """A payload of finite floats is orjson's own encoding (the fast path is taken)."""
    payload = {"generation_log_probs": [-0.5, -1.25e-7, 0.0], "token": 7}
    assert _json.dumps(payload) == orjson.dumps(payload)


@pytest.mark.parametrize(
    "log_probs",
    [[-0.5, -math.inf], [math.nan], [math.inf, -math.inf]],
    ids=["minus-inf", "nan", "both-infinities"],
)
def test_non_finite_floats_are_kept(log_probs: list[float]) -> None:
    """NaN and infinities travel as the stdlib writes them, never as orjson's null."""
    payload = {"generation_log_probs": log_probs, "parent": None}
    decoded = json.loads(_json.dumps(payload))["generation_log_probs"]
    assert [repr(value) for value in decoded] == [repr(value) for value in log_probs]


def test_a_non_finite_float_in_an_array_is_kept() -> None:
    """A numpy array holding -inf is written as the stdlib writes its list."""
    payload = {"generation_log_probs": np.array([-1.0, -np.inf]), "x": None}
    assert json.loads(_json.dumps(payload))["generation_log_probs"] == [-1.0, -math.inf]


def test_arrays_are_written_as_lists() -> None:
    """numpy arrays (of any dtype) become JSON lists, the same through both encoders."""
    payload = {"ids": np.array([1, 2**40], dtype=np.int64), "lp": np.array([-0.25])}
    assert json.loads(_json.dumps(payload)) == {"ids": [1, 2**40], "lp": [-0.25]}


def test_integers_beyond_64_bits_fall_back_to_the_stdlib() -> None:
    """An id of 2**64 or more (which the store refuses by name) is still written, exactly."""
    assert _json.dumps({"ids": [2**70]}) == b'{"ids":[1180591620717411303424]}'


def test_the_word_null_in_a_string_does_not_change_the_encoding() -> None:
    """A `null` inside a string sends the payload through the finite check, which passes."""
    payload = {"content": "nullable null", "lp": [-0.5]}
    assert _json.dumps(payload) == orjson.dumps(payload)


def test_what_is_not_json_is_a_type_error() -> None:
    """An object neither encoder can write raises TypeError."""
    with pytest.raises(TypeError, match="not JSON serializable"):
        _json.dumps({"x": object()})


@pytest.mark.parametrize("body", [b'{"lp": [-Infinity, NaN]}', b'{"id": 18446744073709551616}'])
def test_loads_reads_what_orjson_refuses(body: bytes) -> None:
    """Bodies with NaN, infinities or >64-bit integers are parsed by the stdlib instead."""
    assert _json.loads(body) == json.loads(body)


@pytest.mark.parametrize("number", [2**64, 2**64 + 1, -(2**64) - 7, 10**30])
def test_integers_beyond_64_bits_are_read_exactly(number: int) -> None:
    """An integer orjson would read as a float comes back as the exact int."""
    assert _json.loads(f'{{"reward": {number}, "ids": [1, 2]}}'.encode()) == {
        "reward": number,
        "ids": [1, 2],
    }


@pytest.mark.parametrize("number", [2**64 - 1, 2**63 + 5, 10**19])
def test_largest_token_ids_are_read_exactly(number: int) -> None:
    """Ids up to 2**64 - 1 (20 digits) are exact whichever parser reads them."""
    assert _json.loads(f"[{number}, 3]".encode()) == [number, 3]


def test_long_digit_runs_are_found_with_and_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The digit-run check answers the same through numpy and through bytes.translate."""
    bodies = [b"[1,2,3]", b'{"a": 12345678901234567890}', b'"1234567890123456789"', b"9" * 25]
    monkeypatch.setattr(_json, "_numpy", np)
    with_numpy = [_json._has_long_digit_run(body) for body in bodies]
    monkeypatch.setattr(_json, "_numpy", False)
    assert (
        [_json._has_long_digit_run(body) for body in bodies]
        == with_numpy
        == [
            False,
            True,
            False,
            True,
        ]
    )


@pytest.mark.parametrize("numpy_module", [np, False], ids=["numpy", "translate"])
def test_a_fractions_long_digits_are_no_long_integer(
    numpy_module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty digits after a `.` or a letter are no integer; twenty after a `-` are one."""
    monkeypatch.setattr(_json, "_numpy", numpy_module)
    bodies = [
        b"[-0.00012345678901234567]",
        b'["ab12345678901234567890cd"]',
        b"[-12345678901234567890]",
    ]
    assert [_json._has_long_digit_run(body) for body in bodies] == [False, False, True]
