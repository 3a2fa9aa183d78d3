"""Model calls as a NeMo Gym 0.7 model server commits them, and the conversation they come from.

`committed_call` stamps an entry the way a 0.7 writer does before `put`: the
continuation fingerprint and context digest of the request, the cumulative
length and digest, the parent decision, and optionally a delta prompt.
`Conversation` grows a request turn by turn, so tests can ask "which call does
this request continue" exactly as a harness would send it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from token_finalizer.core.token_digest import token_digest
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    conversation_digest,
)

__all__ = ["Conversation", "assistant_says", "committed_call", "two_turns", "user_says"]


def user_says(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant_says(text: str) -> dict[str, Any]:
    """A Responses output message, as a 0.7 server records a call's output."""
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def committed_call(
    rollout_id: str,
    model_call_id: str,
    *,
    request_items: Sequence[dict[str, Any]],
    output_items: Sequence[dict[str, Any]],
    prompt: Sequence[int],
    generation: Sequence[int],
    parent_call_id: str | None = None,
    parent_cumulative: Sequence[int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A TokenEntry payload stamped like a 0.7 writer's, every lineage field present.

    With `parent_cumulative` (the parent's full ids, a prefix of `prompt`) the
    prompt is stored as a delta after it, as `delta_records: true` does.
    """
    cumulative = [*prompt, *generation]
    stored_prompt = list(prompt)
    is_delta = parent_cumulative is not None
    if is_delta:
        assert list(prompt[: len(parent_cumulative or ())]) == list(parent_cumulative or ())
        stored_prompt = list(prompt[len(parent_cumulative or ()) :])
    entry: dict[str, Any] = {
        "schema_version": 1,
        "rollout_id": rollout_id,
        "model_call_id": model_call_id,
        "model": "policy",
        "prompt_token_ids": stored_prompt,
        "generation_token_ids": list(generation),
        "generation_log_probs": [-0.125 * (i + 1) for i in range(len(generation))],
        "output_items": [dict(item) for item in output_items],
        "token_item_index": 0,
        "created_at": 1_700_000_000.0,
        "response_id": f"resp-{model_call_id}",
        "prefix_requested": False,
        "prefix_supplied": False,
        "cum_len": len(cumulative),
        "digest": token_digest(cumulative),
        "parent_call_id": parent_call_id,
        "parent_resolution": "root" if parent_call_id is None else "resolved",
        "parent_resolution_reason": "",
        "prompt_is_delta": is_delta,
        "continuation_fingerprint": assistant_fingerprint([*request_items, *output_items]),
        "continuation_context_len": len(request_items),
        "continuation_context_digest": conversation_digest(list(request_items)),
        "fingerprint_version": FINGERPRINT_VERSION,
    }
    entry.update(extra)
    return entry


@dataclass
class Conversation:
    """A harness's conversation: the items of the next request, and the calls made so far."""

    rollout_id: str
    items: list[dict[str, Any]] = field(default_factory=lambda: [user_says("Weather in Paris?")])
    cumulative: dict[str, list[int]] = field(default_factory=dict)

    def call(
        self,
        model_call_id: str,
        answer: str,
        *,
        new_prompt: Sequence[int],
        generation: Sequence[int],
        parent_call_id: str | None = None,
        delta: bool = False,
        then: str | None = "go on",
    ) -> dict[str, Any]:
        """The entry of a call answering the current items; the answer (and `then`) join them.

        Its prompt is the parent's cumulative ids followed by `new_prompt`.
        """
        parent = self.cumulative[parent_call_id] if parent_call_id else []
        output = [assistant_says(answer)]
        entry = committed_call(
            self.rollout_id,
            model_call_id,
            request_items=self.items,
            output_items=output,
            prompt=[*parent, *new_prompt],
            generation=generation,
            parent_call_id=parent_call_id,
            parent_cumulative=parent if delta else None,
        )
        self.cumulative[model_call_id] = [*parent, *new_prompt, *generation]
        self.items = [*self.items, *output, *([user_says(then)] if then else [])]
        return entry


def two_turns() -> tuple[Conversation, dict[str, Any], dict[str, Any]]:
    """Rollout r1's two calls, the second a delta after the first (cumulative ids
    101, 102, 103, 201, 202, then 301, 302, 401); the talk's items ask for a third."""
    talk = Conversation("r1")
    first = talk.call("call-1", "It is sunny.", new_prompt=[101, 102, 103], generation=[201, 202])
    second = talk.call(
        "call-2",
        "Rain tomorrow.",
        new_prompt=[301, 302],
        generation=[401],
        parent_call_id="call-1",
        delta=True,
    )
    return talk, first, second
