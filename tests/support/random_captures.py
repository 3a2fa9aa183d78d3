"""Random NeMo Gym 0.7-shaped captures and resolve requests, for property tests of the index.

A capture is a tree of calls grown turn by turn: each call continues an
earlier one (its prompt extends the parent's cumulative ids) or starts a new
root, stores its prompt whole or as a delta, and is stamped with a
fingerprint and context drawn from small pools so that requests often match
several calls. Damage is drawn too: wrong or missing digests and cum_lens,
delta entries whose parent never commits, a two-call cycle, interchangeable
and differing retries, identical and conflicting repeats of a call id, and
any commit order. Payloads are valid TokenEntry objects (the stores accept
them); `conflicting` repeats are the only ones a store would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from token_finalizer.core.token_digest import token_digest

__all__ = ["FINGERPRINTS", "RandomCapture", "captures", "resolve_requests"]

FINGERPRINTS = ("a" * 64, "b" * 64)
CONTEXTS = ("c" * 64, "d" * 64)
_WRONG_DIGEST = "e" * 64
ROLLOUT_ID = "prop-1"


@dataclass(frozen=True)
class RandomCapture:
    """Payloads in commit order; `conflicting` names the repeats a store would refuse."""

    payloads: list[dict[str, Any]]
    conflicting: frozenset[int]  # indexes into payloads


def _payload(call_id: str, prompt: list[int], generation: list[int]) -> dict[str, Any]:
    return {
        "rollout_id": ROLLOUT_ID,
        "model_call_id": call_id,
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": [-0.5] * len(generation),
    }


def _tokens(draw: st.DrawFn) -> list[int]:
    return draw(st.lists(st.integers(0, 4), max_size=3))


def _stamp(draw: st.DrawFn, payload: dict[str, Any], cumulative: list[int]) -> None:
    """Lookup metadata, digest and cum_len: right most of the time, else wrong or absent."""
    digest = draw(st.sampled_from(["right"] * 6 + ["wrong", "none"]))
    if digest != "none":
        payload["digest"] = token_digest(cumulative) if digest == "right" else _WRONG_DIGEST
    cum_len = draw(st.sampled_from(["right"] * 6 + ["wrong", "none"]))
    if cum_len != "none":
        payload["cum_len"] = len(cumulative) + (cum_len == "wrong")
    payload["continuation_fingerprint"] = draw(
        st.sampled_from([*FINGERPRINTS, *FINGERPRINTS, "", "not-hex"])
    )
    payload["fingerprint_version"] = draw(st.sampled_from([2, 2, 2, None, 1]))
    payload["continuation_context_len"] = draw(st.sampled_from([0, 0, 1, 2, 5]))
    payload["continuation_context_digest"] = draw(st.sampled_from([*CONTEXTS, *CONTEXTS, "", "zz"]))


@st.composite
def captures(draw: st.DrawFn, max_calls: int = 8) -> RandomCapture:
    """One random capture (see the module docstring)."""
    calls: list[tuple[dict[str, Any], list[int]]] = []  # (payload, its cumulative ids)
    for turn in range(draw(st.integers(1, max_calls))):
        call_id = f"c{turn}"
        if calls and draw(st.integers(0, 5)) == 0:  # a retry of an earlier call
            source, cumulative = calls[draw(st.integers(0, len(calls) - 1))]
            retry = dict(source, model_call_id=call_id)
            if draw(st.booleans()):  # it sampled something else
                retry["generation_token_ids"] = [*source["generation_token_ids"], 9]
                retry["generation_log_probs"] = [-0.5] * len(retry["generation_token_ids"])
                cumulative = [*cumulative, 9]
            calls.append((retry, cumulative))
            continue
        parent = draw(st.none() | st.integers(0, len(calls) - 1)) if calls else None
        new_prompt, generation = _tokens(draw), _tokens(draw)
        if parent is None:
            payload = _payload(call_id, new_prompt, generation)
            resolution = draw(st.sampled_from(["root", "unresolved", None]))
            if resolution is not None:
                payload["parent_resolution"] = resolution
            cumulative = [*new_prompt, *generation]
        else:
            parent_payload, parent_cumulative = calls[parent]
            prompt = [*parent_cumulative, *new_prompt]
            delta = draw(st.integers(0, 2)) > 0
            payload = _payload(call_id, new_prompt if delta else prompt, generation)
            payload.update(
                parent_resolution="resolved",
                parent_call_id=parent_payload["model_call_id"],
                prompt_is_delta=delta,
            )
            if delta and draw(st.integers(0, 9)) == 0:
                payload["parent_call_id"] = "ghost"  # its parent never commits
            cumulative = [*prompt, *generation]
        _stamp(draw, payload, cumulative)
        calls.append((payload, cumulative))
    payloads = [payload for payload, _ in calls]
    if draw(st.integers(0, 5)) == 0:  # two delta entries naming each other
        for call_id, parent_id in (("x1", "x2"), ("x2", "x1")):
            cycle = _payload(call_id, _tokens(draw), _tokens(draw))
            cycle.update(
                parent_resolution="resolved", parent_call_id=parent_id, prompt_is_delta=True
            )
            _stamp(draw, cycle, [])
            payloads.append(cycle)
    repeats = draw(st.lists(st.integers(0, len(payloads) - 1), max_size=2))
    conflicting_sources = set()
    if draw(st.integers(0, 3)) == 0:
        conflicting_sources.add(draw(st.integers(0, len(payloads) - 1)))
    extra = [dict(payloads[index]) for index in repeats]
    for index in conflicting_sources:
        changed = dict(payloads[index])
        changed["prompt_token_ids"] = [*changed["prompt_token_ids"], 7]
        extra.append(changed)
    ordered = draw(st.permutations(payloads))
    # Repeats commit after their first copy, anywhere later.
    for repeat in extra:
        first = next(
            i for i, p in enumerate(ordered) if p["model_call_id"] == repeat["model_call_id"]
        )
        ordered.insert(draw(st.integers(first + 1, len(ordered))), repeat)
    conflicting = frozenset(
        i
        for i, payload in enumerate(ordered)
        if any(payload is repeat for repeat in extra[len(repeats) :])
    )
    return RandomCapture(payloads=ordered, conflicting=conflicting)


def resolve_requests(max_requests: int = 4) -> st.SearchStrategy[list[tuple[str, list[str]]]]:
    """Wire-form requests (fingerprint, context digests) drawn from the captures' pools."""
    request = st.tuples(
        st.sampled_from(FINGERPRINTS),
        st.lists(st.sampled_from(CONTEXTS), min_size=1, max_size=4),
    )
    return st.lists(request, min_size=1, max_size=max_requests)
