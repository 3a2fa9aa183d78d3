"""The core_*.json vectors of tests/vectors/nemo_gym_0_7_staging, as the core tests read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from token_finalizer.core.staging import CallRecord, RolloutReceipt, StagedCallBaseSnapshot

__all__ = [
    "DIRECTORY",
    "case_ids",
    "load_core_vectors",
    "tampered",
    "verification_inputs",
]

DIRECTORY = Path(__file__).parents[1] / "vectors" / "nemo_gym_0_7_staging"

_TOKEN_COLUMNS = {"token_ids_delta"}
_FLOAT_COLUMNS = {"token_mask_delta", "generation_log_probs_delta"}


def load_core_vectors(name: str) -> Any:
    """The parsed JSON of one vector file, e.g. ``load_core_vectors("core_verify.json")``."""
    return json.loads((DIRECTORY / name).read_text(encoding="utf-8"))


def case_ids(cases: list[dict[str, Any]]) -> list[str]:
    """The pytest ids of vector cases: their names."""
    return [case["name"] for case in cases]


def tampered(instance: Any, field: str, value: Any) -> None:
    """Overwrite a field after validation, as a corrupted store or a bug would.

    Columns get the array form the typed snapshots hold, so only the value changes.
    """
    if field in _TOKEN_COLUMNS:
        value = np.array(value, dtype=">u8")
    elif field in _FLOAT_COLUMNS:
        value = np.array(value, dtype=np.float64)
    elif field == "manifest":
        value = tuple(CallRecord.from_json(row) for row in value)
    object.__setattr__(instance, field, value)


def verification_inputs(
    vectors: dict[str, Any], case: dict[str, Any]
) -> tuple[RolloutReceipt, list[StagedCallBaseSnapshot]]:
    """The receipt and snapshots of a core_verify.json case, tampered as the case says."""
    receipt = RolloutReceipt.from_json(case["receipt"])
    snapshots = [
        StagedCallBaseSnapshot.from_json(vectors["snapshots"][digest])
        for digest in case["snapshots"]
    ]
    for field, value in case.get("receipt_tamper", {}).items():
        tampered(receipt, field, value)
    for change in case.get("snapshot_tamper", []):
        tampered(snapshots[change["index"]], change["field"], change["value"])
    return receipt, snapshots
