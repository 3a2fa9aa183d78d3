"""The in-memory lineage index: which calls are candidates, what a repeat does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from token_finalizer.core.lineage_index import RolloutLineage, candidate_of, link_of

FINGERPRINT, CONTEXT = "f" * 64, "c" * 64


def _call(call_id: str = "c1", prompt: list[int] | None = None, **fields: Any) -> Any:
    stamped = {
        "model_call_id": call_id,
        "prompt_token_ids": np.array(prompt or [1, 2], dtype=np.int32),
        "generation_token_ids": np.array([3], dtype=np.int32),
        "continuation_fingerprint": FINGERPRINT,
        "continuation_context_len": 1,
        "continuation_context_digest": CONTEXT,
        "fingerprint_version": 2,
        **fields,
    }
    return SimpleNamespace(**stamped)


def test_a_stamped_call_is_a_candidate_of_its_fingerprint() -> None:
    """A call with a current fingerprint and a recorded context is indexed under it."""
    found = candidate_of(_call())
    assert found is not None
    fingerprint, candidate = found
    assert (fingerprint, candidate.context_len, candidate.context_digest) == (
        FINGERPRINT,
        1,
        CONTEXT,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"continuation_fingerprint": ""},
        {"continuation_fingerprint": "not hex"},
        {"fingerprint_version": 1},
        {"continuation_context_digest": ""},
        {"continuation_context_digest": "ZZ"},
        {"continuation_context_len": -1},
    ],
    ids=["no-fingerprint", "not-hex", "old-version", "no-context", "bad-context", "negative"],
)
def test_a_call_no_request_can_match_is_no_candidate(fields: dict[str, Any]) -> None:
    """What no well-formed request can equal is left out of the index."""
    assert candidate_of(_call(**fields)) is None


def test_an_absent_fingerprint_version_still_counts() -> None:
    """A call stamped without fingerprint_version is a candidate, as in resolution."""
    assert candidate_of(_call(fingerprint_version=None)) is not None


def test_context_digests_decide_whether_a_request_continues_a_candidate() -> None:
    """The request must hold the candidate's context digest at its context length."""
    found = candidate_of(_call())
    assert found is not None
    candidate = found[1]
    assert candidate.continued_by(["x", CONTEXT])
    assert not candidate.continued_by([CONTEXT])  # too short
    assert not candidate.continued_by(["x", "y"])


def test_link_holds_what_rebuilding_the_call_needs() -> None:
    """Parent, delta flag, own length, cum_len and digest, read from the entry."""
    link = link_of(_call(parent_call_id="p", prompt_is_delta=True, cum_len=9, digest="d"))
    assert (link.parent_call_id, link.prompt_is_delta, link.own_length) == ("p", True, 3)
    assert (link.cum_len, link.digest) == (9, "d")


def test_an_identical_repeat_changes_nothing() -> None:
    """The same payload again under a call id is not a second candidate."""
    first = _call()
    index = RolloutLineage({"c1": first}.get)
    index.add(first)
    assert index.add(_call()) is None
    assert len(index.candidates(FINGERPRINT)) == 1 and not index.conflicted


def test_a_different_repeat_marks_the_rollout_conflicted() -> None:
    """A call id committed again with other tokens makes the whole rollout unresolvable."""
    first = _call()
    index = RolloutLineage({"c1": first}.get)
    index.add(first)
    index.add(_call(prompt=[1, 9]))
    assert index.conflicted
