"""Projection: the main chain as Responses output items with one unbroken token sequence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.prefix_merging import BuildFailed

__all__ = ["project_response"]


def _token_targets(entry: TokenEntry, items: list[dict[str, Any]]) -> list[int]:
    """Indices of the items of one call that receive its token fields."""
    if entry.token_item_index is not None:
        return [entry.token_item_index]
    inline = [
        i
        for i, item in enumerate(items)
        if item.get("generation_token_ids") is not None and len(item["generation_token_ids"])
    ]
    return inline or [len(items) - 1]


def _extends(prompt: np.ndarray, seen: tuple[np.ndarray, np.ndarray]) -> bool:
    previous_prompt, previous_generation = seen
    split = len(previous_prompt)
    end = split + len(previous_generation)
    return (
        len(prompt) >= end
        and np.array_equal(prompt[:split], previous_prompt)
        and np.array_equal(prompt[split:end], previous_generation)
    )


def project_response(chain: Sequence[TokenEntry], *, rollout_id: str, model: str) -> dict[str, Any]:
    """Build the rebuilt response of the main chain.

    Token fields hold numpy arrays that share memory with the snapshot: the
    service serializes them directly, and the delivery API turns them into
    lists for in-process callers.

    Because every link's parent sequence is a prefix of its prompt, the running
    sequence before a link plus its interstitial is exactly that link's prompt,
    so each item's `prompt_token_ids` is its call's own prompt array.
    """
    output: list[dict[str, Any]] = []
    seen: tuple[np.ndarray, np.ndarray] | None = None
    input_tokens: int | None = None
    output_tokens = 0
    for entry in chain:
        items = [dict(item) for item in entry.output_items] or [{"type": "message"}]
        for index in _token_targets(entry, items):
            prompt = entry.prompt_token_ids
            if seen is not None and not _extends(prompt, seen):
                raise BuildFailed(
                    f"prefix contiguity violated: the prompt of model call "
                    f"{entry.model_call_id} does not extend the tokens before it"
                )
            fields: dict[str, Any] = {
                "prompt_token_ids": prompt,
                "generation_token_ids": entry.generation_token_ids,
                "generation_log_probs": entry.generation_log_probs,
            }
            if entry.routed_experts is not None:
                fields["routed_experts"] = entry.routed_experts
            items[index].update(fields)
            seen = (prompt, entry.generation_token_ids)
            if input_tokens is None:
                input_tokens = len(prompt)
            output_tokens += len(entry.generation_token_ids)
        output.extend(items)
    if input_tokens is None or output_tokens == 0:
        raise BuildFailed("the rebuilt output carries no generated tokens")
    return {
        "id": f"proj-{rollout_id}",
        "model": model,
        "object": "response",
        "output": output,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
