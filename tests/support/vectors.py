"""The NeMo Gym 0.7.0 test vectors (tests/vectors/nemo_gym_0_7), as the core tests read them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["case_ids", "load_vectors", "wire_entry"]

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
