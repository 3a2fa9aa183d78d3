"""HttpCaptureLedger: what it sends, how it reads every answer, and NeMo Gym 0.7.0's ledger rules.

The store is the in-process stand-in of the staging routes (`staging_store_stand_in`)
or a canned answer; the tests against the real store server are `test_staging_e2e.py`.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.client.staging_stand_in import StagingStoreStandIn
from tests.support.servers import free_port
from tests.support.staging_vectors import case_by_name, staging_case_ids, staging_cases
from token_finalizer_client import (
    APIConnectionError,
    AuthenticationError,
    ConflictError,
    HttpCaptureLedger,
    HttpLineageResolver,
    InvalidAnswerError,
    InvalidLedgerRequestError,
    LedgerConflictError,
    LineageMatch,
)
from token_finalizer_client._ledger_row import committed_row

pytestmark = pytest.mark.anyio

URL = "http://store.test"
RECORD_CHAIN = case_by_name("ledger.json", "record_chain")["inputs"]["ops"]
C1, C2 = RECORD_CHAIN[0]["commit"], RECORD_CHAIN[1]["commit"]
RID = C1["rollout_id"]
# Where our design differs from Gym's file ledger (docs/staging.md#ledger-rows-and-manifest):
# identical retries collapse to the smallest call id, as Gym's in-memory ledger does.
LEDGER_AS_MEMORY = {"resolve_identical_candidates"}


@pytest.fixture
def store() -> StagingStoreStandIn:
    """A fresh stand-in of the store's staging routes."""
    return StagingStoreStandIn()


@pytest.fixture
async def ledger(store: StagingStoreStandIn) -> AsyncIterator[HttpCaptureLedger]:
    """A ledger over the stand-in, closed after the test."""
    opened = HttpCaptureLedger(URL, token="writer-token", transport=store.transport())
    yield opened
    await opened.close()


def _canned(status: int, body: Any) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(status, json=body))


def _match_json(match: LineageMatch | None) -> dict[str, Any] | None:
    if match is None:
        return None
    return {
        "chain_hash": match.chain_hash,
        "cumulative_token_ids": list(match.cumulative_token_ids),
        "digest": match.digest,
        "model_call_id": match.model_call_id,
        "prev_len": match.prev_len,
        "staging_chain": list(match.staging_chain),
    }


async def _run(ledger: HttpCaptureLedger, store: StagingStoreStandIn, op: dict[str, Any]) -> Any:
    """One vector op on the ledger; the result in the vectors' form."""
    kind = op["op"]
    if kind == "record":
        return await ledger.record(op["commit"])
    if kind == "record_failure":
        return await ledger.record_failure(op["rollout_id"], op["model_call_id"], op["reason"])
    if kind == "manifest":
        return await ledger.manifest(op["rollout_id"])
    if kind == "has_rows":
        return await ledger.has_rows(op["rollout_id"])
    if kind == "resolve":
        resolution = await ledger.resolve(op["rollout_id"], op["request_items"])
        return {
            "match": _match_json(resolution.match),
            "reason": resolution.reason,
            "status": str(resolution.status),
        }
    assert kind == "append_raw_row"
    return store.append_raw_row(op["rollout_id"], op["row"])


@pytest.mark.parametrize(
    "case", staging_cases("ledger.json"), ids=staging_case_ids(staging_cases("ledger.json"))
)
async def test_ledger_vectors_give_gyms_results(
    case: dict[str, Any], ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """Each op of ledger.json answers what Gym's file ledger answered (errors: as ValueErrors)."""
    which = "memory" if case["name"] in LEDGER_AS_MEMORY else "file"
    for op, expected in zip(case["inputs"]["ops"], case["expected"][which]["results"], strict=True):
        if "error" in expected:
            with pytest.raises(ValueError):  # noqa: PT011 - Gym's protocol asks for a ValueError
                await _run(ledger, store, op)
        else:
            assert await _run(ledger, store, op) == expected["result"], op["op"]


# -- record ---------------------------------------------------------------------------------------


async def test_record_posts_the_row_of_the_commit(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """record sends POST .../ledger/records with {"row": Gym's row of the commit}."""
    await ledger.record(C1)
    (seen,) = store.requests
    assert (seen.method, seen.segments[:3], seen.operation) == (
        "POST",
        ("ng-rollout", RID, "training-token-capture"),
        "ledger/records",
    )
    assert seen.body == {"row": committed_row(C1).row}


async def test_record_sends_the_bearer_token(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """Every ledger call carries Authorization: Bearer <token>."""
    await ledger.record(C1)
    assert store.requests[0].headers["authorization"] == "Bearer writer-token"


async def test_identical_replay_is_a_no_op(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """The same commit twice: both return, one row is stored."""
    await ledger.record(C1)
    await ledger.record(copy.deepcopy(C1))
    assert len(store.rollouts[RID].rows) == 1


async def test_a_different_row_for_the_call_id_is_a_value_error(ledger: HttpCaptureLedger) -> None:
    """A replay with another admitted_at raises LedgerConflictError, a ValueError and a 409."""
    await ledger.record(C1)
    changed = copy.deepcopy(C1)
    changed["record"]["admitted_at"] += 1.0
    with pytest.raises(LedgerConflictError) as caught:
        await ledger.record(changed)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ConflictError)


async def test_record_after_freeze_names_it(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """A record into a frozen rollout raises a ValueError whose message says frozen."""
    store.freeze(RID)
    with pytest.raises(ValueError, match="frozen"):
        await ledger.record(C1)


async def test_a_row_the_store_refuses_is_a_value_error() -> None:
    """A 422 to a record is InvalidLedgerRequestError, a ValueError."""
    ledger = HttpCaptureLedger(URL, transport=_canned(422, {"error": "invalid ledger row"}))
    with pytest.raises(InvalidLedgerRequestError, match="invalid ledger row"):
        await ledger.record(C1)
    await ledger.close()


async def test_an_invalid_commit_sends_nothing(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """A commit without its record raises ValueError before any request."""
    with pytest.raises(ValueError, match="record"):
        await ledger.record({"rollout_id": RID, "request_items": [], "response_items": []})
    assert store.requests == []


async def test_a_commit_under_an_id_finalize_refuses_sends_nothing(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """A commit of rollout `_x1` raises ValueError naming the id and Gym's rule, unsent."""
    with pytest.raises(ValueError, match=r"'_x1' must match \^\[A-Za-z0-9\]"):
        await ledger.record({**C1, "rollout_id": "_x1"})
    assert store.requests == []


async def test_a_failure_under_an_id_finalize_refuses_sends_nothing(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """record_failure of rollout `-x1` raises ValueError naming the rule, unsent."""
    with pytest.raises(ValueError, match=r"'-x1' must match \^\[A-Za-z0-9\]"):
        await ledger.record_failure("-x1", "c1", "engine crashed")
    assert store.requests == []


async def test_record_is_retried_through_a_503(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """A 503 is repeated: the second try stores the row."""
    store.answer_next(503)
    await ledger.record(C1)
    assert len(store.requests) == 2 and len(store.rollouts[RID].rows) == 1


async def test_other_errors_keep_their_class() -> None:
    """A 401 stays an AuthenticationError (not turned into a ValueError)."""
    ledger = HttpCaptureLedger(URL, transport=_canned(401, {"error": "token"}))
    with pytest.raises(AuthenticationError):
        await ledger.record(C1)
    await ledger.close()


# -- failures, manifest, has_rows -----------------------------------------------------------------


async def test_record_failure_posts_call_and_reason(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """record_failure sends POST .../ledger/failures with the call id and the reason."""
    await ledger.record_failure(RID, "c9", "worker_capture_failed")
    (seen,) = store.requests
    assert (seen.method, seen.operation, seen.body) == (
        "POST",
        "ledger/failures",
        {"model_call_id": "c9", "reason": "worker_capture_failed"},
    )


async def test_record_failure_after_freeze_is_a_value_error(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """A failure row into a frozen rollout is refused: LedgerConflictError."""
    store.freeze(RID)
    with pytest.raises(LedgerConflictError, match="frozen"):
        await ledger.record_failure(RID, "c9", "worker_capture_failed")


async def test_record_failure_needs_a_reason(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """An empty reason raises ValueError and sends nothing."""
    with pytest.raises(ValueError, match="reason"):
        await ledger.record_failure(RID, "c9", "")
    assert store.requests == []


async def test_manifest_reads_the_route(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """manifest sends GET .../ledger/manifest and returns the store's object."""
    await ledger.record(C1)
    manifest = await ledger.manifest(RID)
    assert (store.requests[-1].method, store.requests[-1].operation) == ("GET", "ledger/manifest")
    assert [record["model_call_id"] for record in manifest["records"]] == ["c1"]


async def test_manifest_of_a_bad_id_sends_nothing(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """An id outside the store's alphabet raises ValueError without asking (Gym's protocol)."""
    with pytest.raises(ValueError, match="rollout_id"):
        await ledger.manifest("bad id")
    assert store.requests == []


async def test_manifest_refused_by_the_store_is_a_value_error() -> None:
    """A 422 to a manifest is InvalidLedgerRequestError, a ValueError."""
    ledger = HttpCaptureLedger(URL, transport=_canned(422, {"error": "invalid rollout id"}))
    with pytest.raises(ValueError, match="invalid rollout id"):
        await ledger.manifest("r1")
    await ledger.close()


@pytest.mark.parametrize(
    "answer",
    [
        {"rollout_id": "other", "records": [], "failures": []},
        {"rollout_id": "r1", "records": {}, "failures": []},
        {"rollout_id": "r1", "records": []},
    ],
    ids=["another-rollout", "records-not-a-list", "no-failures"],
)
async def test_a_manifest_answer_that_is_not_one_is_refused(answer: dict[str, Any]) -> None:
    """A manifest answer of another rollout or without both lists raises InvalidAnswerError."""
    ledger = HttpCaptureLedger(URL, transport=_canned(200, answer))
    with pytest.raises(InvalidAnswerError):
        await ledger.manifest("r1")
    await ledger.close()


async def test_has_rows_reads_the_route(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """has_rows sends GET .../ledger/has-rows and returns its flag."""
    await ledger.record_failure(RID, "c9", "unresolved_parent")
    assert await ledger.has_rows(RID) is True
    assert (store.requests[-1].method, store.requests[-1].operation) == ("GET", "ledger/has-rows")


async def test_a_has_rows_answer_without_a_bool_is_refused() -> None:
    """{"has_rows": "yes"} raises InvalidAnswerError rather than reading as true."""
    ledger = HttpCaptureLedger(URL, transport=_canned(200, {"has_rows": "yes"}))
    with pytest.raises(InvalidAnswerError):
        await ledger.has_rows("r1")
    await ledger.close()


# -- resolve --------------------------------------------------------------------------------------


async def test_resolve_gives_the_staged_parent(ledger: HttpCaptureLedger) -> None:
    """After c1 is recorded, c2's request resolves to c1 with its chain, chain hash and cum_len."""
    await ledger.record(C1)
    resolution = await ledger.resolve(RID, C2["request_items"])
    assert resolution.match == LineageMatch(
        model_call_id="c1",
        cumulative_token_ids=(),
        digest=C1["record"]["cumulative_hash"],
        prev_len=C1["record"]["cum_len"],
        staging_chain=(f"{RID}/c1",),
        chain_hash=C1["record"]["chain_hash"],
    )


async def test_resolve_raises_when_the_store_is_unreachable() -> None:
    """Unlike HttpLineageResolver, the ledger's resolve fails closed: APIConnectionError."""
    ledger = HttpCaptureLedger(f"http://127.0.0.1:{free_port()}", max_retries=0)
    with pytest.raises(APIConnectionError):
        await ledger.resolve(RID, C2["request_items"])
    await ledger.close()


async def test_resolve_raises_for_an_answer_that_is_not_a_resolution() -> None:
    """A staged match without its chain hash raises InvalidAnswerError instead of resolving."""
    match = {"model_call_id": "c1", "cumulative_token_ids": [], "digest": "d", "prev_len": 5}
    answer = {"status": "resolved", "reason": "", "match": dict(match, staging_chain=["r/c1"])}
    ledger = HttpCaptureLedger(URL, transport=_canned(200, answer))
    with pytest.raises(InvalidAnswerError):
        await ledger.resolve(RID, C2["request_items"])
    await ledger.close()


async def test_resolve_raises_for_a_staged_match_naming_another_rollout() -> None:
    """A match whose staging_chain names another rollout's call is an InvalidAnswerError."""
    match = {
        "model_call_id": "c1",
        "cumulative_token_ids": [],
        "digest": C1["record"]["cumulative_hash"],
        "prev_len": C1["record"]["cum_len"],
        "staging_chain": ["cl-other/c1"],
        "chain_hash": C1["record"]["chain_hash"],
    }
    ledger = HttpCaptureLedger(URL, transport=_canned(200, {"status": "resolved", "match": match}))
    with pytest.raises(InvalidAnswerError, match="staging_chain"):
        await ledger.resolve(RID, C2["request_items"])
    await ledger.close()


async def test_root_needs_no_store(ledger: HttpCaptureLedger, store: StagingStoreStandIn) -> None:
    """Items without a model-authored turn are a root, answered without a request."""
    resolution = await ledger.resolve(RID, [{"role": "user", "content": "hi"}])
    assert (str(resolution.status), store.requests) == ("root", [])


# -- what Gym loads -------------------------------------------------------------------------------


def test_it_is_a_lineage_resolver_shared_by_every_worker() -> None:
    """The ledger is an HttpLineageResolver (the built-in path too), shared by every worker."""
    ledger = HttpCaptureLedger(URL)
    assert isinstance(ledger, HttpLineageResolver) and ledger.is_process_shared() is True


def test_gyms_protocol_methods_are_coroutines_where_gym_awaits_them() -> None:
    """resolve, record, record_failure, manifest, has_rows and close are async; the rest sync."""
    names = ("resolve", "record", "record_failure", "manifest", "has_rows", "close")
    assert all(inspect.iscoroutinefunction(getattr(HttpCaptureLedger, name)) for name in names)
    assert not inspect.iscoroutinefunction(HttpCaptureLedger.is_process_shared)


async def test_gym_can_build_it_from_its_configuration(store: StagingStoreStandIn) -> None:
    """'token_finalizer_client:HttpCaptureLedger' with url, token and timeout keywords builds it."""
    module, _, name = "token_finalizer_client:HttpCaptureLedger".partition(":")
    factory = getattr(importlib.import_module(module), name)
    ledger = factory(**{"url": URL, "token": "t", "timeout": 5.0})
    assert (
        isinstance(ledger, HttpCaptureLedger) and repr(ledger) == f"HttpCaptureLedger(url='{URL}')"
    )
    await ledger.close()


async def test_repr_never_shows_the_token() -> None:
    """The token appears nowhere in the ledger's repr."""
    ledger = HttpCaptureLedger(URL, token="s3cret-token")
    assert "s3cret" not in repr(ledger)
    await ledger.close()


async def test_admitted_at_goes_out_as_a_json_float(
    ledger: HttpCaptureLedger, store: StagingStoreStandIn
) -> None:
    """The row's admitted_at is written 1767225600.0, as Gym's ledger line has it."""
    commit = copy.deepcopy(C1)
    commit["record"]["admitted_at"] = 1767225600
    await ledger.record(commit)
    assert b'"admitted_at":1767225600.0' in store.requests[0].content
