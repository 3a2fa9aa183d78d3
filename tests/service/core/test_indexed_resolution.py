"""Resolution over the lineage index answers exactly what resolution over every entry answers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.random_captures import RandomCapture, captures, resolve_requests
from tests.support.vectors import (
    RESOLUTION_DEFAULTS,
    case_ids,
    load_vectors,
    resolution_answer,
    wire_entry,
)
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.indexed_resolution import resolve_indexed
from token_finalizer.core.lineage_chains import ChainCache, ScopedChains, remember_committed
from token_finalizer.core.lineage_index import RolloutLineage
from token_finalizer.core.lineage_resolution import (
    ResolutionRequestError,
    resolve_lineage,
)
from token_finalizer.core.token_digest import token_digest

CASES = [case for case in load_vectors("resolution.json")["cases"] if case["request"] is not None]
FINGERPRINT, CONTEXT = "f" * 64, "c" * 64


class Indexed:
    """A rollout's index fed entry by entry, as a store feeds it on each commit."""

    def __init__(self, cache: ChainCache, *, seed: bool = True) -> None:
        self.first: dict[str, Any] = {}
        self.read: list[str] = []  # call ids read back, in order
        self.index = RolloutLineage(self._load)
        self.chains = ScopedChains(cache, self.index.scope)
        self.seed = seed

    def _load(self, call_id: str) -> Any:
        self.read.append(call_id)
        return self.first.get(call_id)

    def commit(self, entry: Any) -> None:
        self.first.setdefault(entry.model_call_id, entry)
        link = self.index.add(entry)
        if link is not None and self.seed:
            remember_committed(entry, link, self.chains)

    def resolve(self, fingerprint: str, digests: list[str]) -> dict[str, Any]:
        return resolution_answer(resolve_indexed(self.index, self.chains, fingerprint, 2, digests))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capture=captures(),
    requests=resolve_requests(),
    budget=st.sampled_from([3, 10_000]),
    seed=st.booleans(),
)
def test_index_answers_as_resolution_over_all_committed_entries(
    capture: RandomCapture, requests: list[tuple[str, list[str]]], budget: int, seed: bool
) -> None:
    """After every commit, each request resolves over the index as over the entries so far."""
    entries = [TokenEntry.from_dict(payload) for payload in capture.payloads]
    indexed = Indexed(ChainCache(budget), seed=seed)
    for count, entry in enumerate(entries, 1):
        indexed.commit(entry)
        for fingerprint, digests in requests:
            expected = resolution_answer(resolve_lineage(entries[:count], fingerprint, 2, digests))
            assert indexed.resolve(fingerprint, digests) == expected


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_index_matches_the_resolution_vector(case: dict[str, Any]) -> None:
    """Each NeMo Gym 0.7 resolution vector resolves over the index as the vector says."""
    indexed = Indexed(ChainCache(1_000))
    for wire in case["entries"]:
        indexed.commit(wire_entry(wire, RESOLUTION_DEFAULTS))
    request = case["request"]
    answer = indexed.resolve(request["fingerprint"], request["context_digests"])
    assert answer == case["expected"]


def _call(call_id: str, fingerprint: str, **fields: Any) -> Any:
    stamped = {
        "model_call_id": call_id,
        "generation_token_ids": [],
        "continuation_fingerprint": fingerprint,
        "continuation_context_len": 0,
        "continuation_context_digest": CONTEXT,
        **fields,
    }
    return wire_entry(stamped, RESOLUTION_DEFAULTS)


def _delta(call_id: str, parent: str, prompt: list[int], cumulative: list[int]) -> Any:
    return _call(
        call_id,
        call_id * 64,
        prompt_token_ids=prompt,
        prompt_is_delta=True,
        parent_call_id=parent,
        digest=token_digest(cumulative),
    )


def test_answer_reads_only_the_delta_after_a_cached_parent() -> None:
    """Resolving a call whose parent's chain is cached reads that call alone."""
    indexed = Indexed(ChainCache(1_000), seed=False)
    indexed.commit(_call("a", "a" * 64, prompt_token_ids=[1, 2]))
    indexed.commit(_delta("b", "a", [3], [1, 2, 3]))
    indexed.commit(_delta("c", "b", [4], [1, 2, 3, 4]))
    assert indexed.resolve("b" * 64, [CONTEXT])["match"]["cumulative_token_ids"] == [1, 2, 3]
    indexed.read.clear()
    assert indexed.resolve("c" * 64, [CONTEXT])["match"]["cumulative_token_ids"] == [1, 2, 3, 4]
    assert indexed.read == ["c"]


def test_answer_rebuilds_a_chain_from_its_anchor_once() -> None:
    """A miss rebuilds the whole delta chain; the same request again reads nothing."""
    indexed = Indexed(ChainCache(1_000), seed=False)
    indexed.commit(_call("a", "a" * 64, prompt_token_ids=[1, 2]))
    indexed.commit(_delta("b", "a", [3], [1, 2, 3]))
    indexed.commit(_delta("c", "b", [4], [1, 2, 3, 4]))
    indexed.resolve("c" * 64, [CONTEXT])
    assert sorted(indexed.read) == ["a", "b", "c"]
    indexed.read.clear()
    assert indexed.resolve("c" * 64, [CONTEXT])["match"]["cumulative_token_ids"] == [1, 2, 3, 4]
    assert indexed.read == []


def test_a_malformed_request_is_refused() -> None:
    """A request with a bad fingerprint version raises, as resolution over entries does."""
    indexed = Indexed(ChainCache(1_000))
    with pytest.raises(ResolutionRequestError):
        resolve_indexed(indexed.index, indexed.chains, FINGERPRINT, 3, [CONTEXT])


def test_an_empty_fingerprint_is_a_root() -> None:
    """A request without model-authored items resolves `root` without looking anything up."""
    indexed = Indexed(ChainCache(1_000))
    assert indexed.resolve("", [CONTEXT]) == {"status": "root", "reason": "", "match": None}


def test_duck_typed_entries_are_indexed() -> None:
    """Any object with the CallView attributes can be committed (not only TokenEntry)."""
    indexed = Indexed(ChainCache(1_000))
    indexed.commit(
        SimpleNamespace(
            model_call_id="a",
            prompt_token_ids=[1],
            generation_token_ids=[2],
            continuation_fingerprint=FINGERPRINT,
            continuation_context_digest=CONTEXT,
        )
    )
    assert indexed.resolve(FINGERPRINT, [CONTEXT])["match"] == {
        "model_call_id": "a",
        "cumulative_token_ids": [1, 2],
        "digest": "",
        "prev_len": 2,
    }
