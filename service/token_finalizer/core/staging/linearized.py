"""The verified training row of one terminal chain (docs/staging.md#verification-and-linearization).

``LinearizedRow`` is what ``verify_and_linearize`` answers: the staged deltas
of the chain root -> terminal, concatenated, with per-call spans and the
extras digests the row is bound to. Token ids are a read-only ``>u8`` array,
masks and log probabilities read-only float64 arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from token_finalizer.core.staging._arrays import FloatColumn, TokenColumn

__all__ = ["ExtrasCommitment", "LinearizedRow", "WeightVersionSpan"]


@dataclass(frozen=True, slots=True)
class WeightVersionSpan:
    """The policy weight version of one call's whole delta ``[start, end)`` (carry included)."""

    model_call_id: str
    start: int
    end: int
    weight_version: int

    def to_json(self) -> dict[str, Any]:
        return {
            "model_call_id": self.model_call_id,
            "start": self.start,
            "end": self.end,
            "weight_version": self.weight_version,
        }


@dataclass(frozen=True, slots=True)
class ExtrasCommitment:
    """The extras digest a chain call is bound to; fetched extras must hash to it."""

    model_call_id: str
    extras_digest_version: int
    extras_digest: str

    def to_json(self) -> dict[str, Any]:
        return {
            "model_call_id": self.model_call_id,
            "extras_digest_version": self.extras_digest_version,
            "extras_digest": self.extras_digest,
        }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LinearizedRow:
    """One verified terminal chain, root -> terminal.

    ``token_mask`` is 0.0 on carried prompt tokens and 1.0 on generated ones;
    ``logprobs`` is 0.0 on carried tokens and the sampled token's log
    probability on generated ones. ``prompt_len`` is the root's carry length;
    ``link_spans`` holds ``(model_call_id, carried, generated)`` per call.
    """

    rollout_id: str
    token_ids: TokenColumn
    token_mask: FloatColumn
    logprobs: FloatColumn
    model_call_ids: tuple[str, ...]
    prompt_len: int
    weight_versions: tuple[int, ...]
    weight_version_spans: tuple[WeightVersionSpan, ...]
    link_spans: tuple[tuple[str, int, int], ...]
    extras_commitments: tuple[ExtrasCommitment, ...]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: the reference's dataclass fields in order, tuples as lists."""
        return {
            "rollout_id": self.rollout_id,
            "token_ids": self.token_ids.tolist(),
            "token_mask": self.token_mask.tolist(),
            "logprobs": self.logprobs.tolist(),
            "model_call_ids": list(self.model_call_ids),
            "prompt_len": self.prompt_len,
            "weight_versions": list(self.weight_versions),
            "weight_version_spans": [span.to_json() for span in self.weight_version_spans],
            "link_spans": [list(span) for span in self.link_spans],
            "extras_commitments": [commitment.to_json() for commitment in self.extras_commitments],
        }
