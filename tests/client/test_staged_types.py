"""The client's own StageResult and StagedCallBaseSnapshot: NeMo Gym's field names and rules."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from tests.support.staging_vectors import staging_cases
from token_finalizer.core.staging import StagedCallRecord
from token_finalizer_client import StagedCallBaseSnapshot, StageResult
from token_finalizer_client._staged_types import snapshot_from_json


def _vector_snapshots() -> list[dict[str, Any]]:
    """The base snapshot (no extras) of every record Gym's worker staged in the scenarios."""
    return [
        StagedCallRecord.from_json(staged["record"]).base_snapshot().to_json()
        for case in staging_cases("scenarios.json")
        for staged in case["expected"]["staged_records"].values()
    ]


SNAPSHOTS = _vector_snapshots()
ROOT, CHILD = SNAPSHOTS[0], SNAPSHOTS[1]


def test_every_staged_vector_reads_and_writes_back_unchanged() -> None:
    """Each base snapshot Gym staged reads, and to_json gives back its exact wire form."""
    assert [snapshot_from_json(data).to_json() for data in SNAPSHOTS] == SNAPSHOTS


def test_columns_are_tuples_and_masks_floats() -> None:
    """Token columns are tuples; an integral mask (JSON 0, 1) reads as floats."""
    data = dict(ROOT, token_mask_delta=[0, 0, 0, 1, 1])
    snapshot = snapshot_from_json(data)
    assert snapshot.token_mask_delta == (0.0, 0.0, 0.0, 1.0, 1.0)
    assert all(type(value) is float for value in snapshot.token_mask_delta)
    assert type(snapshot.token_ids_delta) is tuple


def test_the_staging_key_is_rollout_slash_call() -> None:
    """staging_key is rollout_id/model_call_id."""
    assert snapshot_from_json(ROOT).staging_key == f"{ROOT['rollout_id']}/{ROOT['model_call_id']}"


def test_a_snapshot_is_frozen() -> None:
    """A snapshot cannot be changed after it is read."""
    snapshot = snapshot_from_json(ROOT)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.cum_len = 1  # type: ignore[misc]


def test_defaults_are_gyms() -> None:
    """Without extras_digest and the versions, the snapshot holds Gym's defaults."""
    data = {k: v for k, v in ROOT.items() if k not in ("schema_version", "digest_version")}
    snapshot = snapshot_from_json(data)
    assert (snapshot.schema_version, snapshot.digest_version) == (2, 2)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"extras": None}, "extras"),
        ({"prev_len": True}, "prev_len"),
        ({"weight_version": 7.0}, "weight_version"),
        ({"rollout_id": ""}, "rollout_id"),
        ({"digest": "ABC"}, "digest"),
        ({"mode": "voice"}, "mode"),
        ({"schema_version": 3}, "schema_version"),
        ({"token_ids_delta": [1, 2, 3, 101, -1]}, "token_ids_delta"),
        ({"token_ids_delta": [1, 2, 3, 101, True]}, "token_ids_delta"),
        ({"token_mask_delta": [0.0, 0.0, 0.0, 1.0, 0.5]}, "token_mask_delta"),
        ({"generation_log_probs_delta": [0.0, 0.0, 0.0, -0.25, math.nan]}, "log_probs"),
        ({"generation_log_probs_delta": [-1.0, 0.0, 0.0, -0.25, -0.5]}, "log_probs"),
        ({"token_ids_delta": [1, 2, 3]}, "delta_len"),
        ({"cum_len": 6}, "delta_len"),
        ({"prev_len": 2}, "prev_len"),
        ({"parent_call_id": "c0"}, "prev_len"),
    ],
    ids=[
        "unknown-field",
        "bool-count",
        "float-count",
        "empty-id",
        "bad-digest",
        "unknown-mode",
        "wrong-version",
        "negative-id",
        "bool-id",
        "half-mask",
        "nan-log-prob",
        "carried-log-prob",
        "short-column",
        "cum-len",
        "root-with-prev-len",
        "parent-without-prev-len",
    ],
)
def test_a_broken_rule_is_refused_naming_its_field(change: dict[str, Any], field: str) -> None:
    """Each of Gym's shape rules refuses with a ValueError naming the field."""
    with pytest.raises(ValueError, match=field):
        snapshot_from_json({**ROOT, **change})


def test_a_missing_field_is_named() -> None:
    """A snapshot without its chain_hash is refused naming it."""
    with pytest.raises(ValueError, match="chain_hash"):
        snapshot_from_json({k: v for k, v in CHILD.items() if k != "chain_hash"})


def test_something_else_than_an_object_is_refused() -> None:
    """A list is no snapshot."""
    with pytest.raises(ValueError, match="object"):
        snapshot_from_json([ROOT])


def test_built_directly_it_checks_the_same_rules() -> None:
    """Constructing the type with a broken rule raises as reading does."""
    fields = {**snapshot_from_json(ROOT).to_json(), "delta_len": 0}
    with pytest.raises(ValueError, match="delta_len"):
        StagedCallBaseSnapshot(**fields)


def test_an_ok_stage_result_needs_its_key() -> None:
    """StageResult(ok=True) without a staging key is refused."""
    with pytest.raises(ValueError, match="staging_key"):
        StageResult(ok=True)


def test_a_failed_stage_result_needs_its_error() -> None:
    """StageResult(ok=False) without an error is refused."""
    with pytest.raises(ValueError, match="error"):
        StageResult(ok=False, error="")


def test_ok_must_be_a_bool() -> None:
    """A truthy non-bool ok is refused, not read as success."""
    with pytest.raises(ValueError, match="bool"):
        StageResult(ok=1, staging_key="r/c")  # type: ignore[arg-type]
