"""Lineage resolution, checked against NeMo Gym 0.7.0 vectors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.support.vectors import (
    RESOLUTION_DEFAULTS,
    case_ids,
    load_vectors,
    resolution_answer,
    wire_entry,
)
from token_finalizer.core.lineage_resolution import (
    MAX_DELTA_DEPTH,
    Resolution,
    ResolutionRequestError,
    cumulative_token_ids,
    resolve_items,
    resolve_lineage,
)
from token_finalizer.core.token_digest import token_digest
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    context_digests,
)

CASES = load_vectors("resolution.json")["cases"]
WIRE_CASES = [case for case in CASES if case["request"] is not None]


ITEMS = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "more"},
]
FINGERPRINT = assistant_fingerprint(ITEMS)
DIGESTS = context_digests(ITEMS)


def _entry(wire: dict[str, Any]) -> SimpleNamespace:
    """A duck-typed entry with int32 token arrays, like the finalizer's TokenEntry."""
    return wire_entry(wire, RESOLUTION_DEFAULTS)


def _stamped(
    call_id: str, prompt: list[int], generation: list[int], **extra: Any
) -> SimpleNamespace:
    """A full-prompt entry that the request ITEMS continues (context = its first item)."""
    fields: dict[str, Any] = {
        "model_call_id": call_id,
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "continuation_fingerprint": FINGERPRINT,
        "continuation_context_len": 1,
        "continuation_context_digest": DIGESTS[1],
        "fingerprint_version": FINGERPRINT_VERSION,
        "cum_len": len(prompt) + len(generation),
        "digest": token_digest(prompt + generation),
        **extra,
    }
    return _entry(fields)


def _delta_chain(depth: int) -> list[SimpleNamespace]:
    """An anchor "a" followed by ``depth`` delta entries d1..dN, each adding two tokens."""
    entries = [_entry({"model_call_id": "a", "prompt_token_ids": [1], "generation_token_ids": [2]})]
    for step in range(1, depth + 1):
        parent = "a" if step == 1 else f"d{step - 1}"
        entries.append(
            _entry(
                {
                    "model_call_id": f"d{step}",
                    "prompt_token_ids": [3],
                    "generation_token_ids": [4],
                    "prompt_is_delta": True,
                    "parent_call_id": parent,
                }
            )
        )
    return entries


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_resolve_items_matches_vector(case: dict[str, Any]) -> None:
    """Resolving request items gives the vector's status, reason and match."""
    entries = [_entry(e) for e in case["entries"]]
    assert resolution_answer(resolve_items(entries, case["request_items"])) == case["expected"]


@pytest.mark.parametrize("case", WIRE_CASES, ids=case_ids(WIRE_CASES))
def test_wire_form_matches_vector(case: dict[str, Any]) -> None:
    """Resolving the wire form (fingerprint + prefix digests) gives the same answer."""
    request = case["request"]
    resolution = resolve_lineage(
        [_entry(e) for e in case["entries"]],
        request["fingerprint"],
        request["fingerprint_version"],
        request["context_digests"],
    )
    assert resolution_answer(resolution) == case["expected"]


def test_delta_chain_at_max_depth_resolves() -> None:
    """Exactly MAX_DELTA_DEPTH delta entries above the anchor still rebuild."""
    entries = _delta_chain(MAX_DELTA_DEPTH)
    by_id = {entry.model_call_id: entry for entry in entries}
    tokens = cumulative_token_ids(by_id[f"d{MAX_DELTA_DEPTH}"], by_id)
    assert len(tokens) == 2 + 2 * MAX_DELTA_DEPTH


def test_delta_chain_beyond_max_depth_is_refused() -> None:
    """One delta entry more than MAX_DELTA_DEPTH is a broken chain."""
    entries = _delta_chain(MAX_DELTA_DEPTH + 1)
    by_id = {entry.model_call_id: entry for entry in entries}
    with pytest.raises(ValueError, match="exceeds"):
        cumulative_token_ids(by_id[f"d{MAX_DELTA_DEPTH + 1}"], by_id)


def test_delta_depth_does_not_depend_on_entry_order() -> None:
    """The deepest delta is refused and its parent resolves, whatever the commit order."""
    entries = _delta_chain(MAX_DELTA_DEPTH + 1)
    deepest, parent = entries[-1], entries[-2]
    answers = set()
    for ordered in (entries, entries[::-1]):
        for winner in (deepest, parent):
            stamp = {
                "continuation_fingerprint": FINGERPRINT,
                "continuation_context_len": 1,
                "continuation_context_digest": DIGESTS[1],
            }
            others = [e for e in ordered if e is not winner]
            candidate = SimpleNamespace(**{**vars(winner), **stamp})
            answers.add((winner.model_call_id, resolve_items([*others, candidate], ITEMS).status))
    assert answers == {
        (deepest.model_call_id, "unresolved"),
        (parent.model_call_id, "resolved"),
    }


def test_empty_fingerprint_is_root_without_reading_entries() -> None:
    """A request with no model-authored item is a root, even over unreadable entries."""
    resolution = resolve_lineage([object()], "", FINGERPRINT_VERSION, DIGESTS)  # type: ignore[list-item]  # a hostile entry on purpose
    assert resolution == Resolution("root", "", None)


def test_unknown_fingerprint_version_is_a_request_error() -> None:
    """A fingerprint version other than 2 is refused (a 422 over the wire)."""
    with pytest.raises(ResolutionRequestError, match="fingerprint_version"):
        resolve_lineage([], FINGERPRINT, 1, DIGESTS)


def test_malformed_context_digest_is_a_request_error() -> None:
    """A context digest that is not 64 lowercase hex digits is refused."""
    with pytest.raises(ResolutionRequestError, match="context digest"):
        resolve_lineage([], FINGERPRINT, FINGERPRINT_VERSION, [DIGESTS[0], "ABC"])


def test_missing_context_digests_are_a_request_error() -> None:
    """At least d0 must be sent."""
    with pytest.raises(ResolutionRequestError, match="non-empty"):
        resolve_lineage([], FINGERPRINT, FINGERPRINT_VERSION, [])


def test_malformed_fingerprint_is_a_request_error() -> None:
    """A fingerprint that is neither "" nor 64 lowercase hex digits is refused."""
    with pytest.raises(ResolutionRequestError, match="fingerprint must be"):
        resolve_lineage([], "xyz", FINGERPRINT_VERSION, DIGESTS)


def test_resolved_match_carries_prev_len_equal_to_cum_len() -> None:
    """prev_len is the match's cum_len (the full cumulative length)."""
    match = resolve_items([_stamped("c1", [1, 2], [3, 4])], ITEMS).match
    assert match is not None and match.prev_len == 4


def test_identical_duplicate_is_one_candidate() -> None:
    """An exact repeat of a committed entry does not make the lookup ambiguous."""
    entry = _stamped("c1", [1, 2], [3])
    assert resolve_items([entry, _stamped("c1", [1, 2], [3])], ITEMS).status == "resolved"


def test_conflicting_duplicate_is_a_lookup_error() -> None:
    """Two different payloads under one call id answer lookup_error."""
    entries = [_stamped("c1", [1, 2], [3]), _stamped("c1", [1, 2], [4])]
    assert resolve_items(entries, ITEMS) == Resolution("unresolved", "lookup_error", None)


def test_malformed_entry_is_a_lookup_error() -> None:
    """An entry object the resolver cannot read answers lookup_error instead of raising."""
    broken = SimpleNamespace(continuation_fingerprint=FINGERPRINT)  # no model_call_id
    assert resolve_items([broken], ITEMS) == Resolution("unresolved", "lookup_error", None)


def test_out_of_range_token_in_match_is_a_lookup_error() -> None:
    """A match whose tokens cannot be digested answers lookup_error."""
    entry = _stamped("c1", [1, 2], [3])
    entry.prompt_token_ids = np.array([1, -2], dtype=np.int32)
    assert resolve_items([entry], ITEMS).reason == "lookup_error"


def test_interchangeable_candidates_without_cum_len_collapse() -> None:
    """Candidates sharing a digest collapse on their computed length when cum_len is absent."""
    entries = [
        _stamped("c2", [1, 2], [3], cum_len=None),
        _stamped("c1", [1, 2], [3], cum_len=None),
    ]
    match = resolve_items(entries, ITEMS).match
    assert match is not None and match.model_call_id == "c1"


def test_empty_generation_arrays_keep_an_integer_dtype() -> None:
    """An empty float array among the pieces does not turn the cumulative ids into floats."""
    anchor = SimpleNamespace(
        model_call_id="a",
        prompt_token_ids=np.array([1, 2], dtype=np.int32),
        generation_token_ids=np.asarray([]),
        prompt_is_delta=False,
    )
    assert cumulative_token_ids(anchor, {"a": anchor}).dtype.kind == "i"


def test_wire_form_equals_item_form() -> None:
    """resolve_items is resolve_lineage over the items' fingerprint and prefix digests."""
    entries = [_stamped("c1", [1, 2], [3])]
    by_items = resolve_items(entries, ITEMS)
    by_wire = resolve_lineage(entries, FINGERPRINT, FINGERPRINT_VERSION, DIGESTS)
    assert resolution_answer(by_items) == resolution_answer(by_wire)


def test_lineage_fields_are_read_from_a_nested_lineage_record() -> None:
    """An entry keeping its 0.7 fields on ``entry.lineage`` resolves like a flat one."""
    flat = _stamped("c1", [1, 2], [3])
    lineage_names = set(RESOLUTION_DEFAULTS)
    nested = SimpleNamespace(
        model_call_id="c1",
        prompt_token_ids=flat.prompt_token_ids,
        generation_token_ids=flat.generation_token_ids,
        lineage=SimpleNamespace(**{k: v for k, v in vars(flat).items() if k in lineage_names}),
    )
    assert resolution_answer(resolve_items([nested], ITEMS)) == resolution_answer(
        resolve_items([flat], ITEMS)
    )
