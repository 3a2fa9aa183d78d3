"""Synthetic captures: single entries and whole multi-turn agent rollouts.

Shared by tests and benchmarks so both exercise the same shapes.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["agent_rollout", "make_entry", "record_for"]


def make_entry(
    rollout_id: str,
    model_call_id: str,
    prompt: list[int],
    generation: list[int],
    *,
    log_probs: list[float] | None = None,
    output_items: list[dict[str, Any]] | None = None,
    token_item_index: int | None = None,
    created_at: float = 0.0,
    **extra: Any,
) -> dict[str, Any]:
    """A TokenEntry payload; log probs default to -0.5 - i/1000 per generated token."""
    if log_probs is None:
        log_probs = [-0.5 - i / 1000 for i in range(len(generation))]
    if output_items is None:
        output_items = [
            {"type": "message", "role": "assistant", "content": f"call {model_call_id}"}
        ]
        token_item_index = 0 if token_item_index is None else token_item_index
    return {
        "schema_version": 1,
        "rollout_id": rollout_id,
        "model_call_id": model_call_id,
        "model": "policy",
        "prompt_token_ids": list(prompt),
        "generation_token_ids": list(generation),
        "generation_log_probs": list(log_probs),
        "output_items": output_items,
        "token_item_index": token_item_index,
        "created_at": created_at,
        **extra,
    }


def agent_rollout(
    rollout_id: str,
    *,
    calls: int,
    new_tokens_per_turn: int,
    generation_share: float = 0.25,
    first_prompt: int | None = None,
    seed: int = 0,
    vocab: int = 150_000,
) -> list[dict[str, Any]]:
    """A single-chain agent rollout: each call's prompt is the previous context plus tool output.

    Every turn adds `new_tokens_per_turn` tokens to the context, split between
    the model's generation and the interstitial (tool output) that follows it.
    """
    rng = random.Random(seed)
    generation_len = max(1, int(new_tokens_per_turn * generation_share))
    interstitial_len = new_tokens_per_turn - generation_len
    context = [rng.randrange(vocab) for _ in range(first_prompt or new_tokens_per_turn)]
    entries = []
    for turn in range(calls):
        generation = [rng.randrange(vocab) for _ in range(generation_len)]
        log_probs = [-rng.random() * 5 for _ in range(generation_len)]
        entries.append(
            make_entry(
                rollout_id,
                f"call-{turn:05d}",
                context,
                generation,
                log_probs=log_probs,
                output_items=[
                    {"type": "function_call", "name": "bash", "arguments": f'{{"turn": {turn}}}'}
                ],
                token_item_index=0,
                created_at=1_700_000_000.0 + turn,
            )
        )
        context = context + generation + [rng.randrange(vocab) for _ in range(interstitial_len)]
    return entries


def record_for(rollout_id: str, **fields: Any) -> dict[str, Any]:
    """A finished rollout record naming `rollout_id`, with a text-only response."""
    return {
        "_ng_rollout_id": rollout_id,
        "reward": 1.0,
        "agent_ref": {"name": "swe_agent"},
        "response": {
            "id": "resp-1",
            "model": "policy",
            "object": "response",
            "output": [{"type": "message", "role": "assistant", "content": "done"}],
        },
        **fields,
    }


def snapshot_of(entries: list[dict[str, Any]], *, incomplete: bool = False) -> Any:
    """A frozen Snapshot of entry payloads, as a source would hand it over."""
    from token_finalizer import Snapshot, TokenEntry

    parsed = tuple(TokenEntry.from_dict(e) for e in entries)
    rollout_id = parsed[0].rollout_id if parsed else "r"
    return Snapshot(rollout_id, parsed, incomplete, "snap-1", 7)


def assert_prefix_contiguous(output: list[dict[str, Any]]) -> None:
    """Every token-bearing item's prompt extends all tokens seen before it."""
    seen: list[int] = []
    bearing = [item for item in output if "generation_token_ids" in item]
    assert bearing, "no token-bearing item"
    for item in bearing:
        prompt = list(item["prompt_token_ids"])
        assert prompt[: len(seen)] == seen, "prompt does not extend the tokens before it"
        seen = prompt + list(item["generation_token_ids"])
