"""Every error string NeMo Gym 0.7.0 defines for a record is ours byte for byte.

tests/vectors/nemo_gym_0_7/errors.json was extracted from the wheel by
`generate_errors.py`: the errors Gym's masking helpers are given (read from
its source) and what Gym's own `finalize_rollout_token_capture` answers for
records reaching each branch. Downstream code counts mask reasons by Gym's
text (Gym's own `max_mask_fraction` message does), so our guidance goes in
`hint`, never into the error (docs/records-and-builds.md#error-strings).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.asgi import in_process
from tests.support.vectors import case_ids, load_vectors
from token_finalizer import MemoryTokenStore
from token_finalizer.api import create_app
from token_finalizer.core.delivery import TOKEN_CAPTURE_KEY, finalize_rollout_token_capture
from token_finalizer.settings import settings_from_mapping

_VECTORS = load_vectors("errors.json")
# A case Gym reaches only with its consumer replaced: neither side can answer it
# (Gym's trajectories_from_source and our finalize always answer a build).
_REACHABLE = [case for case in _VECTORS["cases"] if "patched" not in case]


class _FailingSource(MemoryTokenStore):
    """A store whose freeze raises what the case says."""

    def __init__(self, raises: dict[str, str]) -> None:
        super().__init__()
        self._raises = raises

    async def freeze(self, rollout_id: str) -> Any:
        error_class = {"RuntimeError": RuntimeError}[self._raises["class"]]
        raise error_class(self._raises["message"])


def _source(case: dict[str, Any]) -> MemoryTokenStore:
    raises = case["inputs"]["freeze_raises"]
    return MemoryTokenStore() if raises is None else _FailingSource(raises)


@pytest.mark.anyio
@pytest.mark.parametrize("case", _REACHABLE, ids=case_ids(_REACHABLE))
async def test_the_record_error_is_gyms(case: dict[str, Any]) -> None:
    """The record's `_ng_token_capture.error` equals the one NeMo Gym 0.7.0 writes."""
    record = copy.deepcopy(case["inputs"]["record"])
    await finalize_rollout_token_capture(record, _source(case))
    assert record[TOKEN_CAPTURE_KEY]["error"] == case["expected"]["record_error"]


@pytest.mark.anyio
@pytest.mark.parametrize("case", _REACHABLE, ids=case_ids(_REACHABLE))
async def test_the_build_error_is_gyms(case: dict[str, Any]) -> None:
    """The build's `error` equals the one NeMo Gym 0.7.0 answers."""
    build = await finalize_rollout_token_capture(
        copy.deepcopy(case["inputs"]["record"]), _source(case)
    )
    assert build is not None and build["error"] == case["expected"]["build_error"]


def test_every_literal_error_gym_defines_has_a_case() -> None:
    """The cases cover each literal error of Gym's source: none is left unchecked."""
    literals = {item["literal"] for item in _VECTORS["defined"] if "literal" in item}
    answered = {case["expected"]["build_error"] for case in _VECTORS["cases"]}
    assert literals and literals <= answered


def test_the_only_unreachable_case_is_gyms_dead_branch() -> None:
    """Only `nothing recorded` is left out, Gym's branch for a consumer that answers no build."""
    left_out = [case["expected"]["build_error"] for case in _VECTORS["cases"] if "patched" in case]
    assert left_out == ["nothing recorded"]


def test_the_finalize_answer_carries_gyms_error_and_our_hint_apart() -> None:
    """Through POST /finalize the empty capture's error is Gym's; the guidance is its `hint`."""
    settings = settings_from_mapping({"sources": {"default": "m", "m": {"kind": "memory"}}}, env={})
    with in_process(create_app(settings)) as client:
        answer = client.post("/finalize", json={"_ng_rollout_id": "r-empty"}).json()
    capture, build = answer["record"][TOKEN_CAPTURE_KEY], answer["build"]
    assert (capture["error"], build["error"]) == ("capture contains no token records",) * 2
    assert capture["hint"] == build["hint"]
    assert "token-finalizer store delete r-empty" in build["hint"]


def test_an_error_without_guidance_has_no_hint() -> None:
    """`no capture key` says all there is: neither the record nor the build has a `hint`."""
    settings = settings_from_mapping({"sources": {"default": "m", "m": {"kind": "memory"}}}, env={})
    with in_process(create_app(settings)) as client:
        answer: dict[str, Any] = client.post("/finalize", json={"reward": 0.0}).json()
    assert "hint" not in answer["record"][TOKEN_CAPTURE_KEY] and "hint" not in answer["build"]
