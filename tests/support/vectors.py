"""The NeMo Gym 0.7.0 test vectors (tests/vectors/nemo_gym_0_7), as the core tests read them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from token_finalizer.core.lineage_resolution import Resolution

__all__ = [
    "RESOLUTION_DEFAULTS",
    "case_ids",
    "load_vectors",
    "resolution_answer",
    "wire_entry",
]

# The optional TokenEntry fields that resolution reads, as the wire format defaults them.
RESOLUTION_DEFAULTS: dict[str, Any] = {
    "parent_call_id": None,
    "prompt_is_delta": False,
    "digest": None,
    "cum_len": None,
    "continuation_fingerprint": "",
    "continuation_context_len": 0,
    "continuation_context_digest": "",
    "fingerprint_version": None,
}

_DIRECTORY = Path(__file__).parents[1] / "vectors" / "nemo_gym_0_7"


def load_vectors(name: str) -> Any:
    """The parsed JSON of one vector file, e.g. `load_vectors("terminal.json")`."""
    return json.loads((_DIRECTORY / name).read_text())


def case_ids(cases: list[dict[str, Any]]) -> list[str]:
    """The pytest ids of vector cases: their names."""
    return [case["name"] for case in cases]


def wire_entry(wire: dict[str, Any], defaults: dict[str, Any]) -> SimpleNamespace:
    """A duck-typed entry with int32 token arrays, like the finalizer's TokenEntry.

    `defaults` stand in for the optional fields `wire` leaves out.
    """
    fields = {**defaults, **wire}
    fields["prompt_token_ids"] = np.array(wire["prompt_token_ids"], dtype=np.int32)
    fields["generation_token_ids"] = np.array(wire["generation_token_ids"], dtype=np.int32)
    return SimpleNamespace(**fields)


def resolution_answer(resolution: Resolution) -> dict[str, Any]:
    """A resolution in the form of resolution.json's `expected`."""
    match = resolution.match
    return {
        "status": resolution.status,
        "reason": resolution.reason,
        "match": None
        if match is None
        else {
            "model_call_id": match.model_call_id,
            "cumulative_token_ids": match.cumulative_token_ids.tolist(),
            "digest": match.digest,
            "prev_len": match.prev_len,
        },
    }
