"""What `HttpTokenSource.freeze` hands out when NeMo Gym is not in the process.

With Gym importable the source returns Gym's own `TokenCaptureSnapshot` of
Gym's `TokenEntry` models (Gym's builder and conformance checks accept
nothing else; docs/gym-in-process.md). Without it these frozen dataclasses
carry the same fields under the same names, token ids as plain lists, so
code written against Gym's shapes reads them unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from token_finalizer_client._exceptions import InvalidAnswerError

__all__ = ["SourceEntry", "SourceSnapshot", "source_entry"]


@dataclass(frozen=True, slots=True)
class SourceEntry:
    """One frozen model call: its token lists, its links, and every stored field in `fields`."""

    rollout_id: str
    model_call_id: str
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    digest: str | None
    parent_call_id: str | None
    response_id: str | None
    fields: Mapping[str, Any]

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """The stored TokenEntry payload, as Gym's `TokenEntry.model_dump` names it."""
        return dict(self.fields)


@dataclass(frozen=True, slots=True)
class SourceSnapshot:
    """One rollout's frozen capture: Gym's `TokenCaptureSnapshot`, field for field."""

    rollout_id: str
    entries: tuple[SourceEntry, ...]
    incomplete: bool
    snapshot_id: str
    version: int


def _ints(payload: Mapping[str, Any], name: str) -> list[int]:
    value = payload.get(name)
    if not isinstance(value, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    ):
        raise InvalidAnswerError(f"a frozen entry's {name} is not a list of integers")
    return value


def source_entry(payload: Mapping[str, Any]) -> SourceEntry:
    """The plain form of one stored TokenEntry payload; InvalidAnswerError if it is not one."""
    rollout_id, call_id = payload.get("rollout_id"), payload.get("model_call_id")
    if not isinstance(rollout_id, str) or not isinstance(call_id, str):
        raise InvalidAnswerError("a frozen entry lacks its rollout_id or model_call_id")
    log_probs = payload.get("generation_log_probs")
    if not isinstance(log_probs, list) or not all(
        isinstance(item, int | float) and not isinstance(item, bool) for item in log_probs
    ):
        raise InvalidAnswerError(
            f"frozen entry {call_id!r:.80}: generation_log_probs is not a list"
        )

    def text(name: str) -> str | None:
        value = payload.get(name)
        return value if isinstance(value, str) else None

    return SourceEntry(
        rollout_id=rollout_id,
        model_call_id=call_id,
        prompt_token_ids=_ints(payload, "prompt_token_ids"),
        generation_token_ids=_ints(payload, "generation_token_ids"),
        generation_log_probs=[float(item) for item in log_probs],
        digest=text("digest"),
        parent_call_id=text("parent_call_id"),
        response_id=text("response_id"),
        fields=dict(payload),
    )
