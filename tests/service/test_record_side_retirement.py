"""What the record itself says can only take retirement away, never grant it.

A record that arrives marked `mask_sample`, or that carries token ids of its
own (one of them bogus, or beside an incomplete capture), must never make a
capture retirable: an incomplete capture is evidence and stays in the store.
Checked in-process (the delivery functions) and through the HTTP answer
(`retirable`, `retire`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.asgi import in_process
from tests.support.captures import make_entry, record_for
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.api import create_app
from token_finalizer.core.build import MaskReason
from token_finalizer.core.delivery import (
    capture_build_can_retire,
    finalize_record,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
)
from token_finalizer.settings import settings_from_mapping

pytestmark = pytest.mark.anyio


async def _complete(store: MemoryTokenStore | FileTokenStore, rollout_id: str) -> None:
    await store.put(make_entry(rollout_id, "c1", [1, 2], [3]))
    await store.put(make_entry(rollout_id, "c2", [1, 2, 3, 9], [4, 5]))


async def _incomplete(store: MemoryTokenStore | FileTokenStore, rollout_id: str) -> None:
    await _complete(store, rollout_id)
    await store.mark_incomplete(rollout_id, "c3")


async def _masked_build(store: MemoryTokenStore | FileTokenStore, rollout_id: str) -> None:
    """A complete capture whose own build is masked: two unrelated roots (multiple_roots)."""
    await store.put(make_entry(rollout_id, "c1", [1, 2], [3]))
    await store.put(make_entry(rollout_id, "c2", [8, 9], [4]))


def _carrying(
    rollout_id: str, generation: Any, *, prompt: Any = (1, 2), **fields: Any
) -> dict[str, Any]:
    """A record whose first output item carries `generation` as its own token ids."""
    record = record_for(rollout_id, **fields)
    record["response"]["output"][0].update(
        prompt_token_ids=list(prompt), generation_token_ids=generation, generation_log_probs=[-0.5]
    )
    return record


BOGUS_IDS = [
    pytest.param([-1], "negative token id (-1)", id="negative"),
    pytest.param(["x"], "integers only, holds str", id="string"),
    pytest.param([7, True], "integers only, holds bool", id="boolean"),
    pytest.param([7, 1.5], "integers only, holds float", id="float"),
    pytest.param([[7]], "integers only, holds list", id="nested"),
    pytest.param([2**64], "2**64 or more", id="beyond-64-bits"),
]


# -- records carrying their own token ids -----------------------------------------------------


@pytest.mark.parametrize(("generation", "problem"), BOGUS_IDS)
@pytest.mark.parametrize("capture", ["complete", "incomplete"])
async def test_bogus_own_token_id_is_masked_and_never_retirable(
    memory_store: MemoryTokenStore, generation: Any, problem: str, capture: str
) -> None:
    """One bogus id of the record's own: the record is masked, nothing is retirable or frozen."""
    await (_complete if capture == "complete" else _incomplete)(memory_store, "r1")
    record = _carrying("r1", generation)
    build = await finalize_record(record, memory_store)
    assert build is not None and not build.retirable and build.snapshot is None
    assert (build.mask_sample, build.mask_reason) == (True, "invalid_token_ids")
    assert problem in (build.error or "")
    assert "response.output[0].generation_token_ids" in (build.error or "")
    assert record["mask_sample"] is True
    assert record["_ng_token_capture"]["mask_reason"] == "invalid_token_ids"
    assert record["response"]["output"][0]["generation_token_ids"] == generation  # not rebuilt
    assert stored_state(memory_store, "r1").frozen is False  # the capture was not consumed


async def test_bogus_prompt_id_beside_good_generation_ids_is_masked(
    memory_store: MemoryTokenStore,
) -> None:
    """The prompt ids a record carries are checked as well as its generation ids."""
    await _complete(memory_store, "r1")
    record = _carrying("r1", [7])
    record["response"]["output"].append({"prompt_token_ids": [1, -5], "generation_token_ids": [8]})
    build = await finalize_record(record, memory_store)
    assert build is not None and build.mask_reason == "invalid_token_ids"
    assert "response.output[1].prompt_token_ids" in (build.error or "")


async def test_bogus_ids_with_no_rollout_id_are_masked_too(memory_store: MemoryTokenStore) -> None:
    """Without a rollout id there is no capture, but bogus ids still mask the record."""
    record = {"response": {"output": [{"generation_token_ids": ["x"]}]}}
    build = await finalize_rollout_token_capture(record, memory_store)
    assert build is not None and build["mask_sample"] is True
    assert not capture_build_can_retire(build)


async def test_numpy_ids_of_an_in_process_caller_are_well_formed(
    memory_store: MemoryTokenStore,
) -> None:
    """In-process callers may hand numpy token arrays: integer arrays are well-formed ids."""
    await _complete(memory_store, "r1")
    record = _carrying("r1", np.array([7, 8], dtype=np.int32))
    build = await finalize_record(record, memory_store)
    assert build is not None and build.retirable


async def test_numpy_negative_ids_are_malformed(memory_store: MemoryTokenStore) -> None:
    """A negative id in a numpy array is as bogus as one in a list."""
    await _complete(memory_store, "r1")
    build = await finalize_record(_carrying("r1", np.array([7, -1])), memory_store)
    assert build is not None and build.mask_reason == "invalid_token_ids"


async def test_own_ids_beside_an_incomplete_capture_are_not_retirable(
    memory_store: MemoryTokenStore,
) -> None:
    """Well-formed own ids and an incomplete capture: the record stays as it is, no build,
    and the frozen (incomplete) capture stays as evidence."""
    await _incomplete(memory_store, "r1")
    record = _carrying("r1", [7])
    before = copy.deepcopy(record)
    assert await finalize_rollout_token_capture(record, memory_store) is None
    assert record == before
    status = stored_state(memory_store, "r1")
    assert status.frozen is True and status.retired is False


async def test_own_ids_on_a_masked_record_are_not_retirable(
    memory_store: MemoryTokenStore,
) -> None:
    """Well-formed own ids, complete capture, but the record arrived masked: no build."""
    await _complete(memory_store, "r1")
    record = _carrying("r1", [7], mask_sample=True)
    before = copy.deepcopy(record)
    build = await finalize_rollout_token_capture(record, memory_store)
    assert build is None and record == before
    assert await retire_rollout_token_capture("r1", memory_store, build) is False
    assert stored_state(memory_store, "r1").retired is False


async def test_well_formed_own_ids_and_complete_capture_stay_retirable(
    memory_store: MemoryTokenStore,
) -> None:
    """The one case a redundant capture may be retired: unchanged from before."""
    await _complete(memory_store, "r1")
    record = _carrying("r1", [7])
    build = await finalize_rollout_token_capture(record, memory_store)
    assert build is not None and build["_redundant_capture"] is True
    assert await retire_rollout_token_capture("r1", memory_store, build) is True


async def test_made_up_own_ids_over_a_masked_capture_build_are_not_retirable(
    memory_store: MemoryTokenStore,
) -> None:
    """One made-up id and a capture whose own build is masked: no build, no retire, and the
    frozen capture stays as evidence (a record's ids cannot buy its deletion)."""
    await _masked_build(memory_store, "r1")
    record = _carrying("r1", [7])
    before = copy.deepcopy(record)
    build = await finalize_rollout_token_capture(record, memory_store)
    assert (build, record) == (None, before)
    assert await retire_rollout_token_capture("r1", memory_store, build) is False
    status = stored_state(memory_store, "r1")
    assert status.frozen is True and status.retired is False


async def test_own_ids_equal_to_a_masked_capture_build_stay_retirable(
    memory_store: MemoryTokenStore,
) -> None:
    """The record carries exactly the ids its capture's (masked) build delivers: the capture
    holds nothing the record does not, so it may be retired after handoff."""
    await _masked_build(memory_store, "r1")
    build = await finalize_rollout_token_capture(_carrying("r1", [3]), memory_store)
    assert build is not None and build["_redundant_capture"] is True
    assert await retire_rollout_token_capture("r1", memory_store, build) is True


async def test_own_ids_differing_in_the_prompt_over_a_masked_build_are_not_retirable(
    memory_store: MemoryTokenStore,
) -> None:
    """The generation matches but the prompt does not: not the capture's ids, no retire."""
    await _masked_build(memory_store, "r1")
    build = await finalize_record(_carrying("r1", [3], prompt=[1, 5]), memory_store)
    assert build is None


# -- records arriving masked ------------------------------------------------------------------


@pytest.mark.parametrize("mark", [True, 1, "yes"])
async def test_masked_record_over_a_clean_capture_is_rebuilt_but_not_retirable(
    memory_store: MemoryTokenStore, mark: Any
) -> None:
    """A record marked `mask_sample` (as trainers read it) gets its output, never a retire."""
    await _complete(memory_store, "r1")
    record = record_for("r1", mask_sample=mark)
    build = await finalize_record(record, memory_store)
    assert build is not None and build.rebuilt_response is not None
    assert (build.mask_sample, build.mask_reason, build.retirable) == (
        True,
        MaskReason.RECORD_MASKED,
        False,
    )
    assert record["_ng_token_capture"]["mask_reason"] == MaskReason.RECORD_MASKED
    assert record["response"]["output"][-1]["generation_token_ids"].tolist() == [4, 5]


async def test_masked_record_over_an_incomplete_capture_keeps_the_capture_reason(
    memory_store: MemoryTokenStore,
) -> None:
    """A capture problem is still reported by its own reason; the capture is never retirable."""
    await _incomplete(memory_store, "r1")
    build = await finalize_record(record_for("r1", mask_sample=True), memory_store)
    assert build is not None and (build.mask_reason, build.retirable) == (
        "capture_incomplete",
        False,
    )


@pytest.mark.parametrize("mark", [False, None, 0])
async def test_record_marked_unmasked_is_built_as_usual(
    memory_store: MemoryTokenStore, mark: Any
) -> None:
    """`mask_sample: false` (or null) is no mask: the build stays retirable."""
    await _complete(memory_store, "r1")
    build = await finalize_record(record_for("r1", mask_sample=mark), memory_store)
    assert build is not None and build.retirable


# -- through the HTTP answer ------------------------------------------------------------------


@pytest.fixture
def http(capture_dir: Path) -> Iterator[httpx.Client]:
    settings = settings_from_mapping(
        {"sources": {"local": {"kind": "file", "dir": str(capture_dir)}}}, env={}
    )
    with in_process(create_app(settings)) as client:
        yield client


@pytest.mark.parametrize(
    ("rollout_id", "record", "capture"),
    [
        ("masked-clean", record_for("masked-clean", mask_sample=True), _complete),
        ("masked-incomplete", record_for("masked-incomplete", mask_sample=True), _incomplete),
        ("bogus-clean", _carrying("bogus-clean", [-1]), _complete),
        ("bogus-incomplete", _carrying("bogus-incomplete", ["x"]), _incomplete),
        ("own-incomplete", _carrying("own-incomplete", [7]), _incomplete),
        ("own-masked", _carrying("own-masked", [7], mask_sample=True), _complete),
        ("own-over-masked-build", _carrying("own-over-masked-build", [7]), _masked_build),
    ],
)
def test_finalize_answer_offers_no_retire(
    http: httpx.Client,
    file_store: FileTokenStore,
    rollout_id: str,
    record: dict[str, Any],
    capture: Any,
) -> None:
    """None of these answers carries a retire ticket, and retiring the answer retires nothing."""
    asyncio.run(capture(file_store, rollout_id))
    answer = http.post("/finalize", json=record)
    assert answer.status_code == 200
    body = answer.json()
    assert (body["retirable"], body["retire"]) == (False, None)
    assert http.post("/retire", json=body).json().get("retired") is not True
    assert asyncio.run(file_store.freeze(rollout_id)).entries  # the capture is still there
