"""HttpStagingSource: fetches in the caller's order, one request per rollout, and every answer read.

The store is the in-process stand-in of the staging routes (`staging_stand_in`),
filled through HttpStagingSink; the tests against the real store server are
`test_staging_e2e.py`.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.client.staged_calls import (
    gym_records_stand_in,
    staged_chain,
    vector_attachments,
    vector_records,
)
from tests.client.staging_stand_in import StagingStoreStandIn
from token_finalizer.core.staging import StagedCallRecord
from token_finalizer_client import (
    AnswerTooLargeError,
    HttpStagingSink,
    HttpStagingSource,
    InvalidAnswerError,
    StagedCallBaseSnapshot,
    _gym_types,
)
from token_finalizer_client._gym_types import GYM_STAGING_RECORDS

URL = "http://store.test"
CLEAN = vector_records("clean_chain")
KEYS = list(CLEAN)  # rollout-clean-chain/c1, c2, c3


@pytest.fixture
def store() -> StagingStoreStandIn:
    """A stand-in holding the clean chain Gym staged, and a chain of rollout r2."""
    filled = StagingStoreStandIn()
    with HttpStagingSink(URL, transport=filled.transport()) as sink:
        for staged in CLEAN.values():
            attachments = vector_attachments(staged["attachments"])
            assert sink.stage(staged["record"], attachments=attachments).ok
        for record in staged_chain("r2", 2):
            assert sink.stage(record).ok
    filled.requests.clear()
    return filled


@pytest.fixture
def source(store: StagingStoreStandIn) -> Iterator[HttpStagingSource]:
    """A source over the stand-in, closed after the test."""
    with HttpStagingSource(URL, token="finalizer-token", transport=store.transport()) as opened:
        yield opened


def _base(key: str) -> dict[str, Any]:
    """The base snapshot (no extras) of a clean-chain record, in its wire form."""
    return StagedCallRecord.from_json(CLEAN[key]["record"]).base_snapshot().to_json()


def _canned_source(body: Any, **options: Any) -> HttpStagingSource:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=body))
    return HttpStagingSource(URL, transport=transport, **options)


# -- fetch -----------------------------------------------------------------------------------------


def test_fetch_returns_one_snapshot_per_key_in_order(source: HttpStagingSource) -> None:
    """Keys in any order come back in that order, each the base snapshot of its call."""
    keys = [KEYS[2], KEYS[0], KEYS[1]]
    assert [snapshot.to_json() for snapshot in source.fetch(keys)] == [_base(key) for key in keys]


def test_fetch_asks_once_per_rollout(source: HttpStagingSource, store: StagingStoreStandIn) -> None:
    """Keys of two rollouts, interleaved: one POST .../staged/fetch per rollout, ids in order."""
    source.fetch([KEYS[1], "r2/c1", KEYS[0], "r2/c0"])
    assert [
        (seen.method, seen.segments[1], seen.operation, seen.body) for seen in store.requests
    ] == [
        ("POST", "rollout-clean-chain", "staged/fetch", {"keys": ["c2", "c1"]}),
        ("POST", "r2", "staged/fetch", {"keys": ["c1", "c0"]}),
    ]


def test_fetch_sends_the_bearer_token(
    source: HttpStagingSource, store: StagingStoreStandIn
) -> None:
    """A fetch carries Authorization: Bearer <token>."""
    source.fetch(KEYS[:1])
    assert store.requests[0].headers["authorization"] == "Bearer finalizer-token"


def test_a_key_named_twice_is_fetched_once(
    source: HttpStagingSource, store: StagingStoreStandIn
) -> None:
    """The same key twice: one id in the request, the snapshot twice in the result."""
    first, second = source.fetch([KEYS[0], KEYS[0]])
    assert first == second and store.requests[0].body == {"keys": ["c1"]}


def test_no_keys_asks_nothing(source: HttpStagingSource, store: StagingStoreStandIn) -> None:
    """fetch([]) is [] without a request."""
    assert (source.fetch([]), store.requests) == ([], [])


def test_without_gym_the_snapshots_are_the_clients_type(source: HttpStagingSource) -> None:
    """Gym not importable: each snapshot is the client's frozen type, token columns as tuples."""
    (snapshot,) = source.fetch(KEYS[:1])
    assert type(snapshot) is StagedCallBaseSnapshot
    assert snapshot.token_ids_delta == (1, 2, 3, 101, 102)
    assert snapshot.staging_key == KEYS[0]


def test_a_missing_key_raises_key_error_naming_it(source: HttpStagingSource) -> None:
    """A key the store does not hold raises KeyError(key)."""
    with pytest.raises(KeyError) as caught:
        source.fetch([KEYS[0], "rollout-clean-chain/c9"])
    assert caught.value.args == ("rollout-clean-chain/c9",)


def test_a_malformed_key_is_a_value_error(source: HttpStagingSource) -> None:
    """A key without '/' (or with a bad rollout id) raises ValueError before any request."""
    with pytest.raises(ValueError, match="staging key"):
        source.fetch(["no-slash"])


@pytest.mark.parametrize(
    "answer",
    [
        {"snapshots": []},
        {"snapshots": {}},
        {"snapshots": [{**_base(KEYS[1])}]},
        {"snapshots": [{**_base(KEYS[0]), "extras": None}]},
        {"snapshots": [{**_base(KEYS[0]), "token_mask_delta": [0.5] * 5}]},
    ],
    ids=["too-few", "not-a-list", "another-call", "extras-included", "invalid-mask"],
)
def test_an_answer_that_is_not_the_keys_snapshots_is_refused(answer: Any) -> None:
    """Wrong count, another call's snapshot, an unknown field, a broken rule: InvalidAnswerError."""
    with _canned_source(answer) as source, pytest.raises(InvalidAnswerError):
        source.fetch(KEYS[:1])


def test_an_answer_over_the_limit_is_refused() -> None:
    """A fetch answer larger than max_answer_bytes raises AnswerTooLargeError."""
    source = _canned_source({"snapshots": [_base(KEYS[0])]}, max_answer_bytes=100)
    with source, pytest.raises(AnswerTooLargeError):
        source.fetch(KEYS[:1])


# -- Gym's own snapshot class ---------------------------------------------------------------------


class _GymSnapshot:
    """Stands for Gym's pydantic StagedCallBaseSnapshot: built by model_validate."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.rollout_id = data["rollout_id"]
        self.model_call_id = data["model_call_id"]

    @classmethod
    def model_validate(cls, data: dict[str, Any]) -> _GymSnapshot:
        if "digest" not in data:
            raise ValueError("1 validation error: digest field required")
        return cls(data)


def test_gyms_snapshot_class_is_used_when_it_is_loaded(
    source: HttpStagingSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With Gym's staging records in sys.modules, each snapshot is Gym's model_validate of it."""
    gym_records_stand_in(monkeypatch, StagedCallBaseSnapshot=_GymSnapshot)
    (snapshot,) = source.fetch(KEYS[:1])
    assert type(snapshot) is _GymSnapshot and snapshot.data == _base(KEYS[0])


def test_gyms_refusal_of_a_snapshot_is_an_invalid_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot Gym's model refuses raises InvalidAnswerError with Gym's message."""
    gym_records_stand_in(monkeypatch, StagedCallBaseSnapshot=_GymSnapshot)
    broken = {key: value for key, value in _base(KEYS[0]).items() if key != "digest"}
    source = _canned_source({"snapshots": [broken]})
    with source, pytest.raises(InvalidAnswerError, match="digest field required"):
        source.fetch(KEYS[:1])


@pytest.fixture
def importable_gym(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A stand-in `nemo_gym` package on sys.path, not yet imported; removed afterwards."""
    staging = tmp_path / "nemo_gym" / "token_id_capture" / "staging"
    staging.mkdir(parents=True)
    for package in (staging, staging.parent, staging.parent.parent):
        (package / "__init__.py").write_text("")
    (staging / "records.py").write_text(
        textwrap.dedent(
            """
            class StagedCallBaseSnapshot:
                def __init__(self, data):
                    self.rollout_id = data["rollout_id"]
                    self.model_call_id = data["model_call_id"]

                @classmethod
                def model_validate(cls, data):
                    return cls(data)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_gym_types, "_unimportable", set())
    yield
    for name in [name for name in sys.modules if name.split(".")[0] == "nemo_gym"]:
        del sys.modules[name]


@pytest.mark.usefixtures("importable_gym")
def test_gym_is_imported_by_the_first_fetch_when_it_is_importable(
    source: HttpStagingSource,
) -> None:
    """Gym installed but not loaded: the fetch imports its records module and uses its class."""
    assert GYM_STAGING_RECORDS not in sys.modules
    (snapshot,) = source.fetch(KEYS[:1])
    assert type(snapshot).__module__ == GYM_STAGING_RECORDS


def test_an_unimportable_gym_is_tried_once(
    source: HttpStagingSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Gym, the first fetch records the failed import and later fetches do not retry it."""
    monkeypatch.setattr(_gym_types, "_unimportable", set())
    source.fetch(KEYS[:1])
    assert _gym_types._unimportable == {GYM_STAGING_RECORDS}


# -- extras and attachments -----------------------------------------------------------------------


def test_fetch_extras_gives_the_staged_extras(
    source: HttpStagingSource, store: StagingStoreStandIn
) -> None:
    """fetch_extras posts .../staged/extras for the call and returns its extras object."""
    assert source.fetch_extras(KEYS[0]) == CLEAN[KEYS[0]]["record"]["extras"]
    assert (store.requests[0].operation, store.requests[0].body) == (
        "staged/extras",
        {"keys": ["c1"]},
    )


def test_fetch_extras_of_a_call_without_extras_is_none(source: HttpStagingSource) -> None:
    """A call staged without extras answers None."""
    assert source.fetch_extras("r2/c0") is None


def test_fetch_extras_of_a_missing_key_raises_key_error(source: HttpStagingSource) -> None:
    """A call the store does not hold raises KeyError(key)."""
    with pytest.raises(KeyError, match="r2/c9"):
        source.fetch_extras("r2/c9")


def test_extras_that_are_not_an_object_are_refused() -> None:
    """An extras value that is a list raises InvalidAnswerError."""
    source = _canned_source({"extras": [[1]], "missing": []})
    with source, pytest.raises(InvalidAnswerError):
        source.fetch_extras(KEYS[0])


def test_attachments_come_back_exactly_as_staged(store: StagingStoreStandIn) -> None:
    """Staged bytes come back bytes and JSON comes back equal, through the store's wire form."""
    attachments = {"pixels": b"\x00\x01\xfe", "spans": [[0, 4], {"a": 1.5}], "empty": b""}
    with HttpStagingSink(URL, transport=store.transport()) as sink:
        (record,) = staged_chain("r3", 1)
        assert sink.stage(record, attachments=attachments).ok
    with HttpStagingSource(URL, transport=store.transport()) as source:
        assert source.fetch_attachments("r3/c0") == attachments


def test_attachments_are_read_from_their_route(
    source: HttpStagingSource, store: StagingStoreStandIn
) -> None:
    """fetch_attachments sends GET .../staged/{call id}/attachments; none staged is {}."""
    assert source.fetch_attachments("r2/c1") == {}
    assert (store.requests[0].method, store.requests[0].operation) == (
        "GET",
        "staged/c1/attachments",
    )


def test_attachments_of_a_missing_key_raise_key_error(source: HttpStagingSource) -> None:
    """A 404 for the call's attachments raises KeyError(key)."""
    with pytest.raises(KeyError, match="r2/c9"):
        source.fetch_attachments("r2/c9")


@pytest.mark.parametrize(
    "wire",
    [{"a": {"bytes": "not base64!"}}, {"a": {"other": 1}}, {"a": {"bytes": "AA==", "json": 1}}, []],
    ids=["bad-base64", "unknown-form", "two-forms", "not-an-object"],
)
def test_attachments_in_another_form_are_refused(wire: Any) -> None:
    """An attachment neither {"bytes": b64} nor {"json": value}: InvalidAnswerError."""
    with _canned_source({"attachments": wire}) as source, pytest.raises(InvalidAnswerError):
        source.fetch_attachments(KEYS[0])


def test_gyms_vector_attachments_come_back(source: HttpStagingSource) -> None:
    """The clean chain's c3 attachments (bytes and JSON, as Gym's worker staged them) read back."""
    wire = CLEAN[KEYS[2]]["attachments"]
    assert source.fetch_attachments(KEYS[2]) == vector_attachments(wire)
