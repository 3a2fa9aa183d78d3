"""The store server's external staging routes, called in-process (docs/staging.md#protocol).

Each test runs against a server over a file store and over a memory store,
with role tokens; rollout ids are unique per test, so the servers are shared
by the module. The same routes over real processes, on a directory and on
Redis: tests/integration/test_store_serve_staging.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
import pytest

from tests.support.asgi import in_process
from tests.support.staging_stores import Conversation, query_of
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer._constants import STAGED_FETCH_MAX_KEYS
from token_finalizer.core.staging import PACKED_COLUMNS, hash_tokens
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server.roles import StoreTokens

WRITER, FINALIZER = {"Authorization": "Bearer w-token"}, {"Authorization": "Bearer f-token"}
TOKENS = StoreTokens(writer=("w-token",), finalizer=("f-token",), control=("c-token",))


@pytest.fixture(scope="module", params=["file", "memory"])
def http(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """An in-process client of a store server (file store, then memory store) with role tokens."""
    backend = (
        FileTokenStore(tmp_path_factory.mktemp("staging"))
        if request.param == "file"
        else MemoryTokenStore()
    )
    with in_process(create_store_app(backend, tokens=TOKENS)) as client:
        yield client


@pytest.fixture
def chat() -> Conversation:
    """A three-call chain of a rollout no other test uses."""
    return Conversation.of(f"r-{uuid.uuid4().hex[:12]}", 3)


def _path(chat: Conversation, operation: str) -> str:
    return f"/ng-rollout/{chat.rollout_id}/training-token-capture/{operation}"


def _stage(http: httpx.Client, chat: Conversation, index: int, **extra: Any) -> httpx.Response:
    record = chat.records[index]
    body = {"record": record.to_json(), "attachments": None, **extra}
    return http.put(_path(chat, f"staged/{record.model_call_id}"), json=body, headers=WRITER)


def _commit(http: httpx.Client, chat: Conversation, index: int) -> httpx.Response:
    return http.post(_path(chat, "ledger/records"), json={"row": chat.rows[index]}, headers=WRITER)


def _write(http: httpx.Client, chat: Conversation) -> None:
    for index in range(len(chat.records)):
        assert _stage(http, chat, index).status_code == 200
        assert _commit(http, chat, index).status_code == 201


# -- ledger ---------------------------------------------------------------------------------


def test_a_new_row_is_201(http: httpx.Client, chat: Conversation) -> None:
    """POST ledger/records answers 201 {"recorded": true}."""
    response = _commit(http, chat, 0)
    assert (response.status_code, response.json()) == (201, {"recorded": True})


def test_an_identical_row_again_is_200(http: httpx.Client, chat: Conversation) -> None:
    """The same row again answers 200 {"recorded": false}."""
    _commit(http, chat, 0)
    response = _commit(http, chat, 0)
    assert (response.status_code, response.json()) == (200, {"recorded": False})


def test_a_conflicting_row_is_409(http: httpx.Client, chat: Conversation) -> None:
    """Another row for a recorded call answers 409 {"error"} naming the call."""
    _commit(http, chat, 0)
    changed = {**chat.rows[0], "response_id": "other"}
    response = http.post(_path(chat, "ledger/records"), json={"row": changed}, headers=WRITER)
    assert (response.status_code, "c1" in response.json()["error"]) == (409, True)


def test_an_invalid_row_is_422_naming_the_field(http: httpx.Client, chat: Conversation) -> None:
    """A row missing a column answers 422 naming it."""
    row = {key: value for key, value in chat.rows[0].items() if key != "chain_hash"}
    response = http.post(_path(chat, "ledger/records"), json={"row": row}, headers=WRITER)
    assert (response.status_code, "chain_hash" in response.json()["error"]) == (422, True)


def test_a_body_without_row_is_422(http: httpx.Client, chat: Conversation) -> None:
    """{"rows": ...} is not a ledger record request: 422."""
    response = http.post(_path(chat, "ledger/records"), json={"rows": []}, headers=WRITER)
    assert response.status_code == 422


def test_a_failure_is_201_then_200(http: httpx.Client, chat: Conversation) -> None:
    """POST ledger/failures: 201 when appended, 200 for the same (call, reason) again."""
    body = {"model_call_id": "c1", "reason": "worker_capture_failed"}
    first = http.post(_path(chat, "ledger/failures"), json=body, headers=WRITER)
    second = http.post(_path(chat, "ledger/failures"), json=body, headers=WRITER)
    assert (first.status_code, second.status_code, second.json()) == (
        201,
        200,
        {"recorded": False},
    )


def test_a_failure_without_a_reason_is_422(http: httpx.Client, chat: Conversation) -> None:
    """An empty reason answers 422."""
    body = {"model_call_id": "c1", "reason": ""}
    response = http.post(_path(chat, "ledger/failures"), json=body, headers=WRITER)
    assert response.status_code == 422


def test_has_rows_follows_the_ledger(http: httpx.Client, chat: Conversation) -> None:
    """GET ledger/has-rows: false, then true after a row."""
    before = http.get(_path(chat, "ledger/has-rows"), headers=WRITER).json()
    _commit(http, chat, 0)
    after = http.get(_path(chat, "ledger/has-rows"), headers=WRITER).json()
    assert (before, after) == ({"has_rows": False}, {"has_rows": True})


def test_the_manifest_lists_the_rows(http: httpx.Client, chat: Conversation) -> None:
    """GET ledger/manifest answers the RolloutManifest JSON."""
    _write(http, chat)
    manifest = http.get(_path(chat, "ledger/manifest"), headers=FINALIZER).json()
    assert [record["model_call_id"] for record in manifest["records"]] == ["c1", "c2", "c3"]


def test_the_manifest_of_an_unknown_rollout_has_empty_lists(
    http: httpx.Client, chat: Conversation
) -> None:
    """A rollout without rows: 200 with empty lists."""
    manifest = http.get(_path(chat, "ledger/manifest"), headers=FINALIZER).json()
    assert (manifest["records"], manifest["failures"]) == ([], [])


def test_a_writer_cannot_read_the_manifest(http: httpx.Client, chat: Conversation) -> None:
    """The manifest needs a finalizer token: a writer's is 403."""
    assert http.get(_path(chat, "ledger/manifest"), headers=WRITER).status_code == 403


# -- stage ----------------------------------------------------------------------------------


def test_a_staged_call_answers_its_key(http: httpx.Client, chat: Conversation) -> None:
    """PUT staged/{id} answers 200 {"ok": true, "staging_key": "R/id"}."""
    response = _stage(http, chat, 0)
    assert (response.status_code, response.json()) == (
        200,
        {"ok": True, "staging_key": f"{chat.rollout_id}/c1"},
    )


def test_the_same_call_again_is_200(http: httpx.Client, chat: Conversation) -> None:
    """An identical replay answers 200 as well."""
    _stage(http, chat, 0)
    assert _stage(http, chat, 0).status_code == 200


def test_another_payload_is_409(http: httpx.Client, chat: Conversation) -> None:
    """The same call with other attachments answers 409."""
    _stage(http, chat, 0)
    assert _stage(http, chat, 0, attachments={"a": {"json": 1}}).status_code == 409


def _packed_body(record: dict[str, Any]) -> dict[str, Any]:
    """A stage body with the record's token columns packed (docs/staging.md#packed-columns)."""
    columns = {
        name: base64.b64encode(np.asarray(record[name], dtype=dtype).tobytes()).decode()
        for name, dtype in PACKED_COLUMNS.items()
    }
    rest = {key: value for key, value in record.items() if key not in PACKED_COLUMNS}
    return {"record": rest, "attachments": None, "columns": columns}


def test_a_packed_call_stores_what_its_lists_store(http: httpx.Client, chat: Conversation) -> None:
    """A call staged with packed columns is fetched back exactly as the lists would give it."""
    record = chat.records[0].to_json()
    path = _path(chat, "staged/c1")
    assert http.put(path, json=_packed_body(record), headers=WRITER).status_code == 200
    fetched = http.post(_path(chat, "staged/fetch"), json={"keys": ["c1"]}, headers=FINALIZER)
    expected = {key: value for key, value in record.items() if key != "extras"}
    assert fetched.json() == {"snapshots": [expected]}


def test_the_same_call_as_lists_after_packed_is_a_replay(
    http: httpx.Client, chat: Conversation
) -> None:
    """Packed and as lists are one record: the second stage is an identical replay, not 409."""
    packed = _packed_body(chat.records[0].to_json())
    assert http.put(_path(chat, "staged/c1"), json=packed, headers=WRITER).status_code == 200
    assert _stage(http, chat, 0).status_code == 200


def test_malformed_packed_columns_are_422_invalid_record(
    http: httpx.Client, chat: Conversation
) -> None:
    """Packed columns that are not base64: 422 invalid_record."""
    body = _packed_body(chat.records[0].to_json())
    body["columns"]["token_ids_delta"] = "%%%"
    response = http.put(_path(chat, "staged/c1"), json=body, headers=WRITER)
    assert (response.status_code, response.json()["check"]) == (422, "invalid_record")


def test_a_custody_refusal_is_422_naming_the_check(http: httpx.Client, chat: Conversation) -> None:
    """A call whose parent is not staged: 422 with check parent_not_staged."""
    response = _stage(http, chat, 1)
    assert (response.status_code, response.json()["check"]) == (422, "parent_not_staged")


def test_an_invalid_record_is_422_invalid_record(http: httpx.Client, chat: Conversation) -> None:
    """A record whose digest does not recompute: 422 with check invalid_record."""
    record = {**chat.records[0].to_json(), "cumulative_hash": hash_tokens([1])}
    path = _path(chat, "staged/c1")
    response = http.put(path, json={"record": record, "attachments": None}, headers=WRITER)
    assert (response.status_code, response.json()["check"]) == (422, "invalid_record")


def test_a_record_of_another_call_than_the_path_is_422(
    http: httpx.Client, chat: Conversation
) -> None:
    """The path names the call: a record of another call is refused."""
    body = {"record": chat.records[0].to_json(), "attachments": None}
    response = http.put(_path(chat, "staged/c9"), json=body, headers=WRITER)
    assert (response.status_code, response.json()["check"]) == (422, "invalid_record")


def test_malformed_attachments_are_422(http: httpx.Client, chat: Conversation) -> None:
    """Attachments that are neither bytes nor JSON: 422 invalid_record, nothing stored."""
    response = _stage(http, chat, 0, attachments={"a": {"text": "x"}})
    fetched = http.post(_path(chat, "staged/fetch"), json={"keys": ["c1"]}, headers=FINALIZER)
    assert (response.status_code, fetched.json()) == (422, {"snapshots": [None]})


def test_a_call_id_with_a_slash_travels_encoded(http: httpx.Client) -> None:
    """`agent:3/call-7` is sent as %2F in the path and staged under that id."""
    chat = Conversation(f"r-{uuid.uuid4().hex[:12]}")
    record = chat.add("agent:3/call-7")
    path = _path(chat, f"staged/{quote(record.model_call_id, safe='')}")
    response = http.put(path, json={"record": record.to_json()}, headers=WRITER)
    assert response.json()["staging_key"] == f"{chat.rollout_id}/agent:3/call-7"


def test_a_finalizer_cannot_stage(http: httpx.Client, chat: Conversation) -> None:
    """Staging needs a writer token: a finalizer's is 403."""
    body = {"record": chat.records[0].to_json()}
    assert http.put(_path(chat, "staged/c1"), json=body, headers=FINALIZER).status_code == 403


# -- fetch ----------------------------------------------------------------------------------


def test_fetch_answers_snapshots_in_order_with_nulls(
    http: httpx.Client, chat: Conversation
) -> None:
    """POST staged/fetch: one base snapshot (or null) per key, in the order asked."""
    _write(http, chat)
    body = {"keys": ["c3", "nope", "c1"]}
    answer = http.post(_path(chat, "staged/fetch"), json=body, headers=FINALIZER).json()
    assert [None if s is None else s["model_call_id"] for s in answer["snapshots"]] == [
        "c3",
        None,
        "c1",
    ]
    assert "extras" not in answer["snapshots"][0]


def test_fetch_answers_zstd_when_accepted(http: httpx.Client, chat: Conversation) -> None:
    """With Accept-Encoding: zstd a large answer comes compressed and decodes to the same."""
    _write(http, chat)
    body = {"keys": ["c1", "c2", "c3"] * 20}
    path = _path(chat, "staged/fetch")
    plain = http.post(path, json=body, headers={**FINALIZER, "Accept-Encoding": "identity"})
    packed = http.post(path, json=body, headers={**FINALIZER, "Accept-Encoding": "zstd"})
    assert packed.headers["content-encoding"] == "zstd"
    assert packed.num_bytes_downloaded < len(plain.content) / 5
    assert packed.json() == plain.json()


def test_too_many_keys_are_422(http: httpx.Client, chat: Conversation) -> None:
    """More keys than the bound: 422, not a huge answer."""
    body = {"keys": ["c1"] * (STAGED_FETCH_MAX_KEYS + 1)}
    assert http.post(_path(chat, "staged/fetch"), json=body, headers=FINALIZER).status_code == 422


def test_keys_that_are_not_a_list_are_422(http: httpx.Client, chat: Conversation) -> None:
    """{"keys": "c1"}: 422."""
    body = {"keys": "c1"}
    assert http.post(_path(chat, "staged/fetch"), json=body, headers=FINALIZER).status_code == 422


def test_extras_answer_values_and_missing(http: httpx.Client) -> None:
    """POST staged/extras: one value per key (null when none), and the keys not staged."""
    chat = Conversation(f"r-{uuid.uuid4().hex[:12]}")
    chat.add("c1", extras={"routed_experts": [[[1, 2]]]})
    chat.add("c2")
    _write(http, chat)
    body = {"keys": ["c1", "c2", "nope"]}
    answer = http.post(_path(chat, "staged/extras"), json=body, headers=FINALIZER).json()
    assert answer == {"extras": [{"routed_experts": [[[1, 2]]]}, None, None], "missing": ["nope"]}


def test_attachments_come_back_as_staged(http: httpx.Client, chat: Conversation) -> None:
    """GET staged/{id}/attachments: bytes as base64, JSON as JSON."""
    attachments = {"png": {"bytes": base64.b64encode(b"\x89PNG").decode()}, "n": {"json": [1]}}
    _stage(http, chat, 0, attachments=attachments)
    answer = http.get(_path(chat, "staged/c1/attachments"), headers=FINALIZER).json()
    assert answer == {"attachments": attachments}


def test_attachments_of_an_unknown_call_are_404(http: httpx.Client, chat: Conversation) -> None:
    """A call that was never staged: 404 {"error"}."""
    response = http.get(_path(chat, "staged/nope/attachments"), headers=FINALIZER)
    assert (response.status_code, "nope" in response.json()["error"]) == (404, True)


# -- the protocol v1 routes on a staging rollout ----------------------------------------------


def test_resolve_answers_over_ledger_rows(http: httpx.Client, chat: Conversation) -> None:
    """lineage/resolve of a staging rollout: the match carries the chain and the chain hash."""
    _write(http, chat)
    query = query_of(chat.request_items(3))
    body = {
        "fingerprint_version": query.fingerprint_version,
        "fingerprint": query.fingerprint,
        "context_digests": list(query.context_digests),
    }
    answer = http.post(_path(chat, "lineage/resolve"), json=body, headers=WRITER).json()
    assert answer["match"] == chat.staged_match(2)


def test_freeze_answers_the_staged_kind(http: httpx.Client, chat: Conversation) -> None:
    """POST freeze of a staging rollout: kind staged, the manifest, one snapshot per record."""
    _write(http, chat)
    answer = http.post(_path(chat, "freeze"), headers=FINALIZER).json()
    assert (answer["kind"], answer["entries"], answer["incomplete"], answer["version"]) == (
        "staged",
        [],
        False,
        7,
    )
    records = [record["model_call_id"] for record in answer["manifest"]["records"]]
    snapshots = [snapshot["model_call_id"] for snapshot in answer["snapshots"]]
    assert records == snapshots == ["c1", "c2", "c3"]


def test_a_stage_after_the_freeze_is_409(http: httpx.Client, chat: Conversation) -> None:
    """The fence: once frozen, a stage answers 409."""
    _stage(http, chat, 0)
    http.post(_path(chat, "freeze"), headers=FINALIZER)
    response = _stage(http, chat, 1)
    assert (response.status_code, "frozen" in response.json()["error"]) == (409, True)


def test_drop_removes_the_staged_calls(http: httpx.Client, chat: Conversation) -> None:
    """POST drop of the frozen snapshot: dropped, and fetch finds nothing."""
    _write(http, chat)
    frozen = http.post(_path(chat, "freeze"), headers=FINALIZER).json()
    body = {"snapshot_id": frozen["snapshot_id"], "version": frozen["version"]}
    dropped = http.post(_path(chat, "drop"), json=body, headers=FINALIZER).json()
    fetched = http.post(_path(chat, "staged/fetch"), json={"keys": ["c1"]}, headers=FINALIZER)
    assert (dropped, fetched.json()) == ({"dropped": True}, {"snapshots": [None]})


def test_a_token_entry_for_a_staging_rollout_is_409(http: httpx.Client, chat: Conversation) -> None:
    """The family guard over the wire: PUT calls/{id} on a staging rollout is 409."""
    _commit(http, chat, 0)
    entry = {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.5]}
    response = http.put(_path(chat, "calls/e1"), json=entry, headers=WRITER)
    assert (response.status_code, "staging ledger" in response.json()["error"]) == (409, True)


# -- unencodable strings (issue 29, item 3) ---------------------------------------------------


def _send_escaped(http: httpx.Client, method: str, path: str, body: Any) -> httpx.Response:
    """`body` as JSON with every non-ASCII character escaped, lone surrogates included."""
    content = json.dumps(body, ensure_ascii=True).encode()
    headers = {**WRITER, "Content-Type": "application/json"}
    return http.request(method, path, content=content, headers=headers)


def test_a_failure_reason_with_a_lone_surrogate_is_422(
    http: httpx.Client, chat: Conversation
) -> None:
    """A ledger failure whose reason holds `\\ud800` is refused, and the manifest stays readable."""
    body = {"model_call_id": "c9", "reason": "x\ud800"}
    refused = _send_escaped(http, "POST", _path(chat, "ledger/failures"), body)
    manifest = http.get(_path(chat, "ledger/manifest"), headers=FINALIZER)
    assert (refused.status_code, manifest.status_code, manifest.json()["failures"]) == (
        422,
        200,
        [],
    )


def test_a_committed_row_with_a_lone_surrogate_is_422(
    http: httpx.Client, chat: Conversation
) -> None:
    """A ledger row whose response_id holds `\\ud800` is refused at write time."""
    row = {**chat.rows[0], "response_id": "resp-\ud800"}
    response = _send_escaped(http, "POST", _path(chat, "ledger/records"), {"row": row})
    assert response.status_code == 422


@pytest.mark.parametrize(
    "attachments",
    [{"n\ud800": {"json": 1}}, {"n": {"json": "v\udfff"}}],
    ids=["name", "value"],
)
def test_an_attachment_with_a_lone_surrogate_is_422(
    http: httpx.Client, chat: Conversation, attachments: dict[str, Any]
) -> None:
    """An attachment name or JSON value holding a lone surrogate: 422, nothing staged."""
    record = chat.records[0]
    body = {"record": record.to_json(), "attachments": attachments}
    response = _send_escaped(http, "PUT", _path(chat, f"staged/{record.model_call_id}"), body)
    assert response.status_code == 422


def test_a_surrogate_pair_is_text(http: httpx.Client, chat: Conversation) -> None:
    """An escaped pair (an emoji) is one character: it is stored and answered back."""
    body = {"model_call_id": "c9", "reason": "ok \ud83d\ude00"}
    stored = _send_escaped(http, "POST", _path(chat, "ledger/failures"), body)
    manifest = http.get(_path(chat, "ledger/manifest"), headers=FINALIZER).json()
    assert (stored.status_code, manifest["failures"][0]["reason"]) == (201, "ok \U0001f600")


@pytest.mark.parametrize(
    "raw", ["NaN", "Infinity", "-Infinity", "1e400", str(2**64), str(-(2**63) - 1)]
)
def test_a_json_attachment_that_cannot_come_back_exactly_is_422(
    http: httpx.Client, chat: Conversation, raw: str
) -> None:
    """NaN, Infinity, 1e400 and integers outside 64 bits are refused, not stored changed."""
    record = chat.records[0]
    body = json.dumps({"record": record.to_json(), "attachments": {"n": {"json": 0}}})
    content = body.replace('{"json": 0}', '{"json": [' + raw + "]}").encode()
    headers = {**WRITER, "Content-Type": "application/json"}
    path = _path(chat, f"staged/{record.model_call_id}")
    response = http.put(path, content=content, headers=headers)
    assert response.status_code == 422


# -- the writers' id rule -------------------------------------------------------------------


def test_staging_writes_under_an_id_finalize_refuses_are_422(http: httpx.Client) -> None:
    """Stage, ledger row and failure of rollout `_x1`: 422 naming the id and Gym's rule."""
    chat = Conversation.of("_x1", 1)
    answers = [
        _stage(http, chat, 0),
        _commit(http, chat, 0),
        http.post(
            _path(chat, "ledger/failures"),
            json={"model_call_id": "c0", "reason": "engine crashed"},
            headers=WRITER,
        ),
    ]
    rule = "'_x1' must match ^[A-Za-z0-9][A-Za-z0-9._-]*$"
    for response in answers:
        assert (response.status_code, rule in response.json()["error"]) == (422, True)


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_lone_surrogate_at_rest_is_answered_spelled_out(kind: str, tmp_path: Any) -> None:
    """A failure reason holding `\\ud800`, stored before such rows were refused: the manifest
    answers 200 with it spelled `\\\\ud800`, never a 500 on every read."""
    backend = FileTokenStore(tmp_path) if kind == "file" else MemoryTokenStore()
    asyncio.run(backend.record_ledger_failure("r-surrogate", "c9", "x\ud800"))
    with in_process(create_store_app(backend, tokens=TOKENS)) as client:
        path = "/ng-rollout/r-surrogate/training-token-capture/ledger/manifest"
        answer = client.get(path, headers=FINALIZER)
    assert answer.status_code == 200
    assert [row["reason"] for row in answer.json()["failures"]] == ["x\\ud800"]
