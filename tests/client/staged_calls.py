"""Staged records for the staging client tests: NeMo Gym's own, and chains made to measure.

`vector_records(scenario)` are the records Gym's worker staged in one
scenario of tests/vectors/nemo_gym_0_7_staging/scenarios.json (wire form,
with their attachments). `staged_chain(...)` builds a valid chain of any
length with the service's pure core, as a worker on a correct prefix would.
"""

from __future__ import annotations

import random
import sys
import types
from typing import Any

import pytest

from tests.support.staging_vectors import case_by_name
from token_finalizer.core.staging import StagedCallRecord, build_staged_call
from token_finalizer_client._gym_types import GYM_STAGING_RECORDS

__all__ = ["gym_records_stand_in", "staged_chain", "vector_attachments", "vector_records"]


def vector_records(scenario: str) -> dict[str, dict[str, Any]]:
    """`{staging_key: {"record", "attachments"}}` Gym's worker staged in `scenario`."""
    records: dict[str, dict[str, Any]] = case_by_name("scenarios.json", scenario)["expected"][
        "staged_records"
    ]
    return records


def vector_attachments(wire: dict[str, Any] | None) -> dict[str, Any] | None:
    """The vectors' attachments (`json` or `bytes_hex`) as a worker passes them to stage()."""
    if wire is None:
        return None
    return {
        name: value["json"] if "json" in value else bytes.fromhex(value["bytes_hex"])
        for name, value in wire.items()
    }


def staged_chain(
    rollout_id: str,
    calls: int,
    *,
    new_prompt: int = 20,
    generated: int = 10,
    seed: int = 0,
    extras: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The wire form of `calls` chained records `c0`, `c1`, ... of one rollout."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    parent: StagedCallRecord | None = None
    prompt: list[int] = []
    for index in range(calls):
        prompt = prompt + [rng.randrange(1000, 150_000) for _ in range(new_prompt)]
        generation = [rng.randrange(1000, 150_000) for _ in range(generated)]
        record = build_staged_call(
            rollout_id=rollout_id,
            model_call_id=f"c{index}",
            parent=parent,
            prompt_token_ids=prompt,
            generated_token_ids=generation,
            generated_log_probs=[-rng.random() for _ in generation],
            weight_version=7,
            extras=extras,
        )
        records.append(record.to_json())
        prompt = prompt + generation
        parent = record
    return records


def gym_records_stand_in(monkeypatch: pytest.MonkeyPatch, **classes: type) -> None:
    """Load a stand-in for NeMo Gym's staging records module, holding `classes` by name,
    for the rest of the test (as if Gym were imported)."""
    module = types.ModuleType(GYM_STAGING_RECORDS)
    for name, cls in classes.items():
        setattr(module, name, cls)
    monkeypatch.setitem(sys.modules, GYM_STAGING_RECORDS, module)
