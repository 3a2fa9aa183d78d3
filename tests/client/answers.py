"""Finalize answers (v2) for the unit tests: plain, and compacted the way the service does."""

from __future__ import annotations

import copy
import random
from typing import Any

from tests.support.captures import record_for

RETIRE: dict[str, Any] = {
    "rollout_id": "r-1",
    "source": "local",
    "snapshot_id": "snap-1",
    "version": 3,
    "ticket": "0f" * 32,
}
BUILD: dict[str, Any] = {
    "rollout_id": "r-1",
    "builder": "lineage",
    "metrics": {"n_calls": 3},
    "mask_sample": False,
    "_capture_snapshot": {"snapshot_id": "snap-1", "version": 3},
}


def rebuilt_output(calls: int = 3, *, new_tokens: int = 12, seed: int = 0) -> list[dict[str, Any]]:
    """A rebuilt chain: per call a token-bearing function_call, then a tool output without tokens.

    Each prompt is the whole context so far, so every prompt is a prefix of
    the last prompt plus its generation, as the service delivers it. Token
    ids cross 256 (no small-int caching) and log probs are non-trivial floats.
    """
    rng = random.Random(seed)
    context = [rng.randrange(1000, 150_000) for _ in range(new_tokens)]
    output: list[dict[str, Any]] = []
    for call in range(calls):
        generation = [rng.randrange(1000, 150_000) for _ in range(new_tokens // 2)]
        output.append(
            {
                "type": "function_call",
                "name": "bash",
                "arguments": f'{{"turn": {call}}}',
                "prompt_token_ids": list(context),
                "generation_token_ids": generation,
                "generation_log_probs": [-rng.random() * 5 for _ in generation],
            }
        )
        output.append({"type": "function_call_output", "output": f"ran {call}"})
        tool = [rng.randrange(1000, 150_000) for _ in range(new_tokens // 2)]
        context = context + generation + tool
    output.append({"type": "message", "role": "assistant", "content": "done"})
    return output


def plain_answer(calls: int = 3, **output_options: Any) -> dict[str, Any]:
    """A standard (plain) retirable v2 answer for rollout r-1."""
    record = record_for("r-1")
    record["response"]["output"] = rebuilt_output(calls, **output_options)
    return {
        "rollout_id": "r-1",
        "source": "local",
        "record": record,
        "build": copy.deepcopy(BUILD),
        "retirable": True,
        "retire": dict(RETIRE),
    }


def compact(answer: dict[str, Any], *, keep: frozenset[int] = frozenset()) -> dict[str, Any]:
    """`answer` in the compact token form (a deep copy); output items at `keep` stay plain.

    Like the service: the context is the last token-bearing item's prompt
    plus its generation, and each other prompt becomes its length.
    """
    answer = copy.deepcopy(answer)
    output = answer["record"]["response"]["output"]
    bearing = [item for item in output if isinstance(item.get("prompt_token_ids"), list)]
    last = bearing[-1]
    answer["context_token_ids"] = last["prompt_token_ids"] + last["generation_token_ids"]
    for index, item in enumerate(output):
        if index not in keep and isinstance(item.get("prompt_token_ids"), list):
            item["prompt_token_ids"] = len(item["prompt_token_ids"])
    return answer


def prompts(record: dict[str, Any]) -> list[Any]:
    """The `prompt_token_ids` of the record's token-bearing output items, in order."""
    return [
        item["prompt_token_ids"]
        for item in record["response"]["output"]
        if "prompt_token_ids" in item
    ]
