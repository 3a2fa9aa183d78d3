"""Projection: the main chain as Responses output items with one unbroken token sequence.

See docs/records-and-builds.md#projection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from token_finalizer.core.build import BuildFailed, MaskReason
from token_finalizer.core.call_graph import Call
from token_finalizer.core.token_ids import same_ids

__all__ = [
    "NOT_CONTIGUOUS_ERROR",
    "NO_CHAIN_ERROR",
    "NO_TOKENS_ERROR",
    "project_response",
]

# Worded as NeMo Gym words them: harnesses compare these texts.
NO_CHAIN_ERROR = "ValueError: capture produced no safe trainable chain"
NO_TOKENS_ERROR = "ValueError: capture produced no trainable generated tokens"
NOT_CONTIGUOUS_ERROR = "AssertionError: projection is not prefix-contiguous"

Ids = npt.NDArray[np.integer[Any]]


def _token_targets(call: Call, items: list[dict[str, Any]]) -> list[int]:
    """Indices of the items of one call that receive its token fields."""
    index = call.entry.token_item_index
    if index is not None:
        return [index]
    inline = [i for i, item in enumerate(items) if item.get("generation_token_ids") is not None]
    return inline or [len(items) - 1]


def _extends(prompt: Ids, seen: tuple[Ids, Ids]) -> bool:
    previous_prompt, previous_generation = seen
    split = len(previous_prompt)
    end = split + len(previous_generation)
    return (
        len(prompt) >= end
        and same_ids(prompt[:split], previous_prompt)
        and same_ids(prompt[split:end], previous_generation)
    )


def project_response(chain: Sequence[Call], *, rollout_id: str, model: str) -> dict[str, Any]:
    """Build the rebuilt response of the main chain; BuildFailed when it is not trainable.

    Token fields hold numpy arrays that share memory with the snapshot: the
    service serializes them directly, and the delivery API turns them into
    lists for in-process callers. Every link's parent sequence is a prefix of
    its prompt, so the running sequence before a link plus its interstitial is
    exactly that link's full prompt: each item's `prompt_token_ids` is its
    call's own (full) prompt array.
    """
    output: list[dict[str, Any]] = []
    seen: tuple[Ids, Ids] | None = None
    input_tokens: int | None = None
    output_tokens = 0
    for call in chain:
        entry = call.entry
        items = [dict(item) for item in entry.output_items] or [{"type": "message"}]
        for index in _token_targets(call, items):
            if seen is not None and not _extends(call.prompt, seen):
                raise BuildFailed(
                    f"{NOT_CONTIGUOUS_ERROR}: the prompt of model call {call.call_id} "
                    "does not extend the tokens before it",
                    reason=MaskReason.NOT_PREFIX_CONTIGUOUS,
                )
            fields: dict[str, Any] = {
                "prompt_token_ids": call.prompt,
                "generation_token_ids": entry.generation_token_ids,
                "generation_log_probs": entry.generation_log_probs,
            }
            if entry.routed_experts is not None:
                fields["routed_experts"] = entry.routed_experts
            items[index].update(fields)
            seen = (call.prompt, entry.generation_token_ids)
            if input_tokens is None:
                input_tokens = len(call.prompt)
            output_tokens += len(entry.generation_token_ids)
        output.extend(items)
    if input_tokens is None or output_tokens == 0:
        raise BuildFailed(NO_TOKENS_ERROR, reason=MaskReason.NO_TRAINABLE_TOKENS)
    return {
        "id": f"proj-{rollout_id}",
        "model": model,
        "object": "response",
        "output": output,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }
