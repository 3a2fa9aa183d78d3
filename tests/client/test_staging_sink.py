"""HttpStagingSink: what it sends, how it reads every answer, and that it never raises.

The store is the in-process stand-in of the staging routes (`staging_stand_in`),
served on loopback for the test of many threads at once; the tests against
the real store server are `test_staging_e2e.py`.
"""

from __future__ import annotations

import copy
import math
import threading
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pydantic
import pytest

from tests.client.staged_calls import (
    gym_records_stand_in,
    staged_chain,
    vector_attachments,
    vector_records,
)
from tests.client.staging_stand_in import StagingStoreStandIn
from tests.support.servers import free_port, running_app
from token_finalizer.core.staging import StagedCallRecord, hash_staged_call
from token_finalizer_client import HttpStagingSink, StageResult
from token_finalizer_client._json import loads

URL = "http://store.test"
CLEAN = vector_records("clean_chain")
C1 = CLEAN["rollout-clean-chain/c1"]["record"]
C2 = CLEAN["rollout-clean-chain/c2"]["record"]


@pytest.fixture
def store() -> StagingStoreStandIn:
    """A fresh stand-in of the store's staging routes."""
    return StagingStoreStandIn()


@pytest.fixture
def sink(store: StagingStoreStandIn) -> Any:
    """A sink over the stand-in, closed after the test."""
    with HttpStagingSink(URL, token="writer-token", transport=store.transport()) as opened:
        yield opened


def _canned_sink(status: int, body: Any) -> HttpStagingSink:
    return HttpStagingSink(
        URL, transport=httpx.MockTransport(lambda request: httpx.Response(status, json=body))
    )


# -- what it sends --------------------------------------------------------------------------------


def test_stage_puts_the_record_and_attachments_in_one_body(
    sink: HttpStagingSink, store: StagingStoreStandIn
) -> None:
    """stage sends PUT .../staged/{call id} with {"record", "attachments"} of the call."""
    sink.stage(C1)
    (seen,) = store.requests
    assert (seen.method, seen.segments[1], seen.operation) == (
        "PUT",
        "rollout-clean-chain",
        "staged/c1",
    )
    assert seen.body == {"attachments": None, "record": C1}


def test_stage_packs_the_token_columns_beside_the_record(
    sink: HttpStagingSink, store: StagingStoreStandIn
) -> None:
    """On the wire the columns travel packed in "columns", not as lists in the record."""
    sink.stage(C1)
    sent = loads(store.requests[0].content)
    assert set(sent) == {"attachments", "record", "columns"}
    assert not set(sent["columns"]) & set(sent["record"])


def test_columns_that_do_not_pack_travel_as_lists(
    sink: HttpStagingSink, store: StagingStoreStandIn
) -> None:
    """A mask with an int 1 is sent as lists, so the store reads it as before."""
    record = {
        **C1,
        "token_mask_delta": [1 if value == 1.0 else value for value in C1["token_mask_delta"]],
    }
    sink.stage(record)
    sent = loads(store.requests[0].content)
    assert set(sent) == {"attachments", "record"} and sent["record"] == record


def test_stage_sends_the_bearer_token(sink: HttpStagingSink, store: StagingStoreStandIn) -> None:
    """Every stage carries Authorization: Bearer <token>."""
    sink.stage(C1)
    assert store.requests[0].headers["authorization"] == "Bearer writer-token"


def test_gyms_vector_records_all_stage(sink: HttpStagingSink, store: StagingStoreStandIn) -> None:
    """Every record Gym's worker staged in the clean chain stages ok, with its attachments."""
    results = [
        sink.stage(staged["record"], attachments=vector_attachments(staged["attachments"]))
        for staged in CLEAN.values()
    ]
    assert [result.staging_key for result in results] == list(CLEAN)
    assert all(result.ok for result in results)


def test_a_call_id_is_percent_encoded(sink: HttpStagingSink, store: StagingStoreStandIn) -> None:
    """A call id with '/', '%' and ':' travels as one encoded path segment."""
    (record,) = staged_chain("r1", 1)
    record = _renamed(record, "agent:3/call%7")
    sink.stage(record)
    raw = store.requests[0]
    assert raw.segments[-1] == "agent:3/call%7" and len(raw.segments) == 5


def _renamed(record: dict[str, Any], call_id: str) -> dict[str, Any]:
    """`record` under another call id, its digest recomputed (so the store accepts it)."""
    renamed = dict(record, model_call_id=call_id)
    fields = {k: v for k, v in renamed.items() if k not in ("digest", "extras")}
    renamed["digest"] = hash_staged_call(**fields)
    return StagedCallRecord.from_json(renamed).to_json()


class _StagedModel(pydantic.BaseModel):
    """A pydantic record, as Gym's StagedCallRecord is one: written with model_dump_json."""

    model_config = pydantic.ConfigDict(extra="allow")

    rollout_id: str
    model_call_id: str


def test_a_pydantic_record_sends_its_own_json(
    sink: HttpStagingSink, store: StagingStoreStandIn
) -> None:
    """A pydantic record's own JSON reaches the store: the mapping's record, value for value."""
    sink.stage(_StagedModel(**C1))
    assert store.requests[0].body["record"] == C1


def test_a_pydantic_record_packs_its_columns(
    sink: HttpStagingSink, store: StagingStoreStandIn
) -> None:
    """A pydantic record's columns travel packed too, its own JSON written without them."""
    sink.stage(_StagedModel(**C1))
    sent = loads(store.requests[0].content)
    assert "columns" in sent and "token_ids_delta" not in sent["record"]


# -- attachments ----------------------------------------------------------------------------------


def test_bytes_travel_as_base64_and_json_as_itself(
    sink: HttpStagingSink, store: StagingStoreStandIn
) -> None:
    """bytes, bytearray and memoryview become {"bytes": b64}; a JSON value {"json": value}."""
    attachments = {
        "raw": b"\x00\xff",
        "array": bytearray(b"ab"),
        "view": memoryview(b"c"),
        "spans": [[0, 4], {"k": None, "f": 0.5, "b": True}],
    }
    sink.stage(C1, attachments=attachments)
    assert store.requests[0].body["attachments"] == {
        "raw": {"bytes": "AP8="},
        "array": {"bytes": "YWI="},
        "view": {"bytes": "Yw=="},
        "spans": {"json": [[0, 4], {"k": None, "f": 0.5, "b": True}]},
    }


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("attachments", "problem"),
    [
        ({"pixels": np.zeros(3)}, "ndarray"),
        ({"pair": (1, 2)}, "tuple"),
        ({"x": math.nan}, "non-finite"),
        ({"x": {1: "a"}}, "keys"),
        ({"": b"x"}, "names"),
        ({"deep": _nested(200)}, "deep"),
        ([("a", b"x")], "mapping"),
    ],
    ids=["numpy", "tuple", "nan", "int-key", "empty-name", "too-deep", "not-a-mapping"],
)
def test_an_attachment_it_cannot_keep_exactly_is_refused_unsent(
    sink: HttpStagingSink, store: StagingStoreStandIn, attachments: Any, problem: str
) -> None:
    """An attachment that is neither bytes nor plain JSON: ok=False naming why, nothing sent."""
    result = sink.stage(C1, attachments=attachments)
    assert (result.ok, store.requests) == (False, [])
    assert problem in result.error


# -- answers ---------------------------------------------------------------------------------------


def test_an_ok_answer_is_an_ok_result(sink: HttpStagingSink) -> None:
    """A stored record answers StageResult(ok=True, staging_key="R/mcid", error=None)."""
    assert sink.stage(C1) == StageResult(ok=True, staging_key="rollout-clean-chain/c1")


def test_the_identical_record_again_is_ok(
    sink: HttpStagingSink, store: StagingStoreStandIn
) -> None:
    """Staging the same record twice answers ok both times; one record is stored."""
    assert sink.stage(C1).ok and sink.stage(copy.deepcopy(C1)).ok
    assert list(store.rollouts["rollout-clean-chain"].staged) == ["c1"]


def test_another_record_under_the_key_is_refused(sink: HttpStagingSink) -> None:
    """A different record under a staged key: ok=False, the store's 409 in the error."""
    sink.stage(C1, attachments={"a": b"1"})
    result = sink.stage(C1, attachments={"a": b"2"})
    assert not result.ok and result.error.startswith("HTTP 409: ")


def test_a_custody_refusal_names_its_check(sink: HttpStagingSink) -> None:
    """A child whose chain hash does not extend its parent's: error "chain_hash_mismatch: ..."."""
    forged = vector_records("forged_parent_chain_hash")
    assert sink.stage(forged["rollout-forged-parent-chain-hash/c1"]["record"]).ok
    result = sink.stage(forged["rollout-forged-parent-chain-hash/c2"]["record"])
    assert not result.ok and result.error.startswith("chain_hash_mismatch: ")


def test_the_check_is_named_once() -> None:
    """A store message that already starts with its check is not prefixed a second time."""
    answer = {"error": "chain_hash_mismatch: call c2: broken", "check": "chain_hash_mismatch"}
    transport = httpx.MockTransport(lambda request: httpx.Response(422, json=answer))
    with HttpStagingSink(URL, transport=transport) as sink:
        assert sink.stage(C1).error == "chain_hash_mismatch: call c2: broken"


def test_a_check_is_put_before_a_bare_message() -> None:
    """A 422 naming a check and a message without it: error "<check>: <message>"."""
    answer = {"error": "the digest does not recompute", "check": "invalid_record"}
    transport = httpx.MockTransport(lambda request: httpx.Response(422, json=answer))
    with HttpStagingSink(URL, transport=transport) as sink:
        assert sink.stage(C1).error == "invalid_record: the digest does not recompute"


def test_a_wrong_prefix_mid_chain_is_refused(sink: HttpStagingSink) -> None:
    """The call Gym 0.7.0 accepts on a wrong prefix is refused: cumulative_hash_mismatch."""
    wrong = vector_records("wrong_prefix_mid_chain")
    assert sink.stage(wrong["rollout-wrong-prefix-mid-chain/c1"]["record"]).ok
    result = sink.stage(wrong["rollout-wrong-prefix-mid-chain/c2"]["record"])
    assert not result.ok and result.error.startswith("cumulative_hash_mismatch: ")


def test_a_stage_into_a_frozen_rollout_names_it(
    sink: HttpStagingSink, store: StagingStoreStandIn
) -> None:
    """After freeze a stage is ok=False, and the error says frozen."""
    store.freeze("rollout-clean-chain")
    result = sink.stage(C1)
    assert not result.ok and "frozen" in result.error


def test_a_503_is_retried(sink: HttpStagingSink, store: StagingStoreStandIn) -> None:
    """A 503 is repeated by the retry policy; the second try stages."""
    store.answer_next(503)
    assert sink.stage(C1).ok and len(store.requests) == 2


def test_a_store_out_of_reach_is_an_error_result() -> None:
    """Connection refused on every try: ok=False naming the connection error, no exception."""
    with HttpStagingSink(f"http://127.0.0.1:{free_port()}", max_retries=1) as sink:
        result = sink.stage(C1)
    assert not result.ok and result.error.startswith("APIConnectionError")


@pytest.mark.parametrize(
    "answer",
    [
        {"ok": False, "staging_key": "rollout-clean-chain/c1"},
        {"ok": True},
        {"ok": True, "staging_key": "rollout-clean-chain/c9"},
        ["ok"],
    ],
    ids=["not-ok", "no-key", "another-calls-key", "not-an-object"],
)
def test_a_200_that_is_not_this_calls_ok_is_an_error_result(answer: Any) -> None:
    """A 200 without ok, without this call's key, or not an object: ok=False."""
    with _canned_sink(200, answer) as sink:
        result = sink.stage(C1)
    assert not result.ok and result.error


def test_a_refusal_without_a_body_still_says_its_status() -> None:
    """A 413 with no JSON body: ok=False, error "HTTP 413: status 413"."""
    transport = httpx.MockTransport(lambda request: httpx.Response(413))
    with HttpStagingSink(URL, transport=transport) as sink:
        assert sink.stage(C1).error == "HTTP 413: status 413"


@pytest.mark.parametrize(
    "record",
    [{**C1, "rollout_id": "bad id"}, {**C1, "model_call_id": ""}, "not a record"],
    ids=["bad-rollout-id", "empty-call-id", "a-string"],
)
def test_a_record_without_valid_ids_is_refused_unsent(
    sink: HttpStagingSink, store: StagingStoreStandIn, record: Any
) -> None:
    """A record whose ids cannot address a call, or no record at all: ok=False, nothing sent."""
    result = sink.stage(record)
    assert (result.ok, store.requests) == (False, [])


def test_a_record_under_an_id_finalize_refuses_is_not_staged(
    sink: HttpStagingSink, store: StagingStoreStandIn
) -> None:
    """Rollout `.x1`: ok=False (Gym's sinks answer, never raise), the error names the rule."""
    result = sink.stage({**C1, "rollout_id": ".x1"})
    assert (result.ok, store.requests) == (False, [])
    assert "'.x1' must match ^[A-Za-z0-9][A-Za-z0-9._-]*$" in result.error


def test_a_closed_sink_answers_an_error_result(store: StagingStoreStandIn) -> None:
    """After close, stage answers ok=False (a closed sink) rather than raising."""
    sink = HttpStagingSink(URL, transport=store.transport())
    sink.close()
    result = sink.stage(C1)
    assert not result.ok and "closed" in result.error


# -- Gym's own result class ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _GymStageResult:
    """Stands for Gym's pydantic StageResult: built with keywords."""

    ok: bool
    staging_key: str | None = None
    error: str | None = None


def test_gyms_stage_result_is_answered_when_gym_is_loaded(
    sink: HttpStagingSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Gym's staging records module in sys.modules, stage answers Gym's own class."""
    gym_records_stand_in(monkeypatch, StageResult=_GymStageResult)
    assert sink.stage(C1) == _GymStageResult(ok=True, staging_key="rollout-clean-chain/c1")


def test_gyms_class_also_carries_refusals(
    sink: HttpStagingSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused stage is Gym's class too, with ok=False and the error."""
    gym_records_stand_in(monkeypatch, StageResult=_GymStageResult)
    result = sink.stage("not a record")
    assert type(result) is _GymStageResult and result.ok is False


# -- many threads ---------------------------------------------------------------------------------


def test_stages_from_many_threads_all_land_once() -> None:
    """32 threads staging 4 chains each through one sink on loopback: every call stored, once."""
    store = StagingStoreStandIn()
    chains = {f"t{thread}": staged_chain(f"t{thread}", 4, seed=thread) for thread in range(32)}
    results: dict[str, list[Any]] = {}
    with running_app(store.asgi_app()) as url, HttpStagingSink(url) as sink:

        def stage_chain(rollout_id: str) -> None:
            results[rollout_id] = [sink.stage(record) for record in chains[rollout_id]]

        threads = [threading.Thread(target=stage_chain, args=(rid,)) for rid in chains]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert all(result.ok for staged in results.values() for result in staged)
    assert {rid: list(store.rollouts[rid].staged) for rid in chains} == {
        rid: ["c0", "c1", "c2", "c3"] for rid in chains
    }
    assert len(store.requests) == 32 * 4
