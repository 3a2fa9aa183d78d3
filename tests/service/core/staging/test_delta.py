"""build_staged_call computes what NeMo Gym 0.7.0's worker stages for a call."""

from __future__ import annotations

import numpy as np
import pytest

from tests.service.core.staging._calls import staged_call
from tests.support.staging_core_vectors import load_core_vectors, verification_inputs
from token_finalizer.core.staging import StagedCallRecord, build_staged_call

VECTORS = load_core_vectors("core_verify.json")
EXTRAS = {"routed_experts": [[[1, 2]], [[3, 4]]]}
# The reference worker's clean chain: (call id, carry, generated, extras).
TURNS = [
    ("a", [1, 2, 3], [101, 102], EXTRAS),
    ("b", [11, 12], [103], None),
    ("c", [21], [104, 105], None),
]


def _reference_snapshots() -> dict[str, dict[str, object]]:
    case = next(case for case in VECTORS["cases"] if case["name"] == "clean_chain")
    _, snapshots = verification_inputs(VECTORS, case)
    return {snapshot.model_call_id: snapshot.to_json() for snapshot in snapshots}


def _stage_chain() -> list[StagedCallRecord]:
    staged: list[StagedCallRecord] = []
    prompt: list[int] = []
    parent: StagedCallRecord | None = None
    for call_id, carry, generated, extras in TURNS:
        prompt = prompt + carry
        record = build_staged_call(
            rollout_id="rollout-7",
            model_call_id=call_id,
            parent=parent,
            prompt_token_ids=prompt,
            generated_token_ids=generated,
            generated_log_probs=[-0.125 * (index + 1) for index in range(len(generated))],
            weight_version=3,
            extras=extras,
        )
        prompt = prompt + generated
        staged.append(record)
        parent = record
    return staged


def test_chain_matches_reference_worker() -> None:
    """Each staged call equals the reference worker's, field for field."""
    reference = _reference_snapshots()
    assert {
        record.model_call_id: record.base_snapshot().to_json() for record in _stage_chain()
    } == (reference)


def test_extras_travel_with_the_record() -> None:
    """The root's extras are kept and bound by its extras digest."""
    assert _stage_chain()[0].extras == EXTRAS


def test_prompt_shorter_than_parent_is_refused() -> None:
    """The prompt must reach the parent's end."""
    root = _stage_chain()[0]
    with pytest.raises(ValueError, match="outside prompt length"):
        staged_call(rollout_id="rollout-7", model_call_id="x", parent=root, prompt=[1])


def test_log_probs_must_match_generation() -> None:
    """One log probability per generated token."""
    with pytest.raises(ValueError, match="lengths differ"):
        staged_call(generated=[2, 3], log_probs=[-1.0])


def test_empty_delta_is_refused() -> None:
    """A call with no new token at all cannot be staged."""
    root = _stage_chain()[0]
    with pytest.raises(ValueError, match="at least one token"):
        staged_call(
            rollout_id="rollout-7",
            model_call_id="x",
            parent=root,
            prompt=np.arange(5),
            generated=[],
        )


def test_generation_free_call_is_all_carry() -> None:
    """A call that generated nothing stages its carry, masked 0.0."""
    root = _stage_chain()[0]
    record = staged_call(
        rollout_id="rollout-7",
        model_call_id="x",
        parent=root,
        prompt=[1, 2, 3, 101, 102, 7],
        generated=[],
    )
    assert (record.token_ids_delta.tolist(), record.token_mask_delta.tolist()) == ([7], [0.0])
