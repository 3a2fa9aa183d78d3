"""The hot-path bench's agent rollouts: what each model call sends and gets back.

Standard library only: the same module drives the real NeMo Gym 0.7.0 wheel
in a Python 3.13 subprocess (`bench/_hotpath_wheel.py`), so both sides replay
byte-identical conversations and token ids.

A rollout is a conversation that grows turn by turn. Call k answers the items
so far (the first user message, then one assistant message and one tool
result per earlier call); its prompt is the previous call's cumulative ids
plus `new_prompt_tokens` fresh ids (the tool output), and it generates
`new_generation_tokens` ids. So call k's context holds (k + 1) x (prompt +
generation) tokens and the rollout's full-prompt capture grows as calls
squared, which is what makes a per-call cost that re-reads it visible.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelCall", "RolloutScript", "Workload", "call_id_of"]

# Token ids are drawn below this bound (a typical vocabulary size).
_VOCABULARY = 150_000


def call_id_of(turn: int) -> str:
    return f"call-{turn:04d}"


@dataclass(frozen=True, slots=True)
class Workload:
    """How many rollouts write at once, how long they are, how each turn grows."""

    rollouts: int
    calls: int
    delta: bool
    new_prompt_tokens: int = 400
    new_generation_tokens: int = 100
    seed: int = 18
    # "f32": log probs as an engine computing in float32 reports them (vLLM's sampler does),
    # each exactly a float32; "f64": any double (the store then keeps 8 bytes per value).
    log_probs: str = "f32"

    @property
    def layout(self) -> str:
        return "delta" if self.delta else "full"

    def scripts(self) -> list[RolloutScript]:
        """One script per rollout (ids `hotpath-{layout}-{index}`), the same on every side."""
        return [
            RolloutScript(
                f"hotpath-{self.layout}-{index:03d}", self, random.Random(self.seed + index)
            )
            for index in range(self.rollouts)
        ]


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call as the model server sees it: the request, the response's tokens."""

    rollout_id: str
    model_call_id: str
    turn: int
    request_items: list[dict[str, Any]]
    output_items: list[dict[str, Any]]
    prompt_token_ids: list[int]  # the whole context, as the inference engine reports it
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    parent_call_id: str | None  # the call a correct resolver must find (None: a root)
    parent_cumulative: list[int]  # that call's prompt + generation ([] for a root)

    def entry_fields(self) -> dict[str, Any]:
        """The fields of the TokenEntry a 0.7 model server builds from this call's response
        (before stamping), the same for the wheel and for bench/_gym_baseline.py."""
        return {
            "rollout_id": self.rollout_id,
            "model_call_id": self.model_call_id,
            "model": "policy",
            "prompt_token_ids": self.prompt_token_ids,
            "generation_token_ids": self.generation_token_ids,
            "generation_log_probs": self.generation_log_probs,
            "output_items": self.output_items,
            "token_item_index": 0,
            "response_id": f"resp-{self.rollout_id}-{self.model_call_id}",
            "created_at": 1_790_000_000.0 + self.turn,
        }


@dataclass
class RolloutScript:
    """A rollout's calls in order; `request()` is what the next call will send."""

    rollout_id: str
    workload: Workload
    rng: random.Random
    items: list[dict[str, Any]] = field(default_factory=list)
    cumulative: list[int] = field(default_factory=list)
    turn: int = 0

    def __post_init__(self) -> None:
        self.items = [{"role": "user", "content": f"Task of {self.rollout_id}: plan a trip."}]

    @property
    def last_call_id(self) -> str | None:
        return call_id_of(self.turn - 1) if self.turn else None

    def request(self) -> list[dict[str, Any]]:
        """The items the next call sends (a copy: the script keeps growing its own)."""
        return list(self.items)

    def next_call(self) -> ModelCall:
        """The next call of the rollout; the conversation moves past it."""
        rng, workload = self.rng, self.workload
        new_prompt = [rng.randrange(_VOCABULARY) for _ in range(workload.new_prompt_tokens)]
        generation = [rng.randrange(_VOCABULARY) for _ in range(workload.new_generation_tokens)]
        log_probs = [-rng.random() * 4.0 for _ in generation]
        if workload.log_probs == "f32":
            as_float32 = f"<{len(log_probs)}f"
            log_probs = list(struct.unpack(as_float32, struct.pack(as_float32, *log_probs)))
        answer = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": f"Step {self.turn} of {self.rollout_id}."}],
        }
        call = ModelCall(
            rollout_id=self.rollout_id,
            model_call_id=call_id_of(self.turn),
            turn=self.turn,
            request_items=self.request(),
            output_items=[answer],
            prompt_token_ids=[*self.cumulative, *new_prompt],
            generation_token_ids=generation,
            generation_log_probs=log_probs,
            parent_call_id=self.last_call_id,
            parent_cumulative=self.cumulative,
        )
        self.cumulative = [*call.prompt_token_ids, *generation]
        tool_result = {"role": "user", "content": f"Tool output {self.turn}: 3 results."}
        self.items = [*self.items, answer, tool_result]
        self.turn += 1
        return call
