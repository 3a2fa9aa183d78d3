"""The capture-store server (docs/store-protocol.md), called in-process: every row of the protocol.

Each test runs against the server over a file store and over a memory store;
rollout ids are unique per test, so the servers are shared by the module.
Paths with a literal `..` segment, which every HTTP client normalizes away,
are sent byte for byte on a raw socket to a server under uvicorn on loopback.
"""

from __future__ import annotations

import http.client
import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import orjson
import pytest
import zstandard

from tests.support.asgi import in_process, send_exactly
from tests.support.captures import agent_rollout, make_entry
from tests.support.servers import running_app
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.store_server import create_store_app

TOKEN = "store-s3cret"


@dataclass
class Store:
    """The store behind a store server, and an in-process client of that server."""

    backend: Any
    directory: Path | None
    http: httpx.Client

    def path(self, rollout_id: str, operation: str) -> str:
        return f"/ng-rollout/{rollout_id}/training-token-capture/{operation}"

    def put(self, entry: dict, *, call_id: str | None = None) -> httpx.Response:
        call = entry["model_call_id"] if call_id is None else call_id
        return self.http.put(self.path(entry["rollout_id"], f"calls/{call}"), json=entry)

    def freeze(self, rollout_id: str, **headers: str) -> httpx.Response:
        return self.http.post(self.path(rollout_id, "freeze"), headers=headers)

    def drop(self, rollout_id: str, body: Any) -> httpx.Response:
        return self.http.post(self.path(rollout_id, "drop"), json=body)


@pytest.fixture(scope="module", params=["file", "memory"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    """A store server over a file store, then over a memory store, called in-process."""
    directory = tmp_path_factory.mktemp("served") if request.param == "file" else None
    backend = FileTokenStore(directory) if directory else MemoryTokenStore()
    with in_process(create_store_app(backend)) as client:
        yield Store(backend, directory, client)


@pytest.fixture(scope="module", params=["file", "memory"])
def served_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A store server under uvicorn on loopback (file store, then memory store), for raw bytes."""
    backend = (
        FileTokenStore(tmp_path_factory.mktemp("served-raw"))
        if request.param == "file"
        else MemoryTokenStore()
    )
    with running_app(create_store_app(backend)) as url:
        yield url


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """An in-process client of a store server that requires a bearer token."""
    backend = FileTokenStore(tmp_path_factory.mktemp("guarded"))
    with in_process(create_store_app(backend, token=TOKEN)) as client:
        yield client


@pytest.fixture
def rid() -> str:
    """A rollout id no other test uses."""
    return f"r-{uuid.uuid4().hex[:12]}"


def entry(rollout_id: str, call_id: str = "c1", generation: list[int] | None = None) -> dict:
    return make_entry(rollout_id, call_id, [1, 2, 3], generation or [4, 5])


def raw_request(url: str, method: str, path: str) -> tuple[int, dict]:
    """Send `path` byte for byte to a real server (no client-side normalization of `..`)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


# -- health and framework errors ------------------------------------------------------


def test_health_answers_ok(store: Store) -> None:
    """GET /health is 200 {"status": "ok"}."""
    response = store.http.get("/health")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_unknown_path_is_a_404_error_body(store: Store) -> None:
    """An unknown path answers 404 with the one error shape."""
    response = store.http.get("/nowhere")
    assert (response.status_code, "error" in response.json()) == (404, True)


def test_wrong_method_is_a_405_error_body(store: Store, rid: str) -> None:
    """GET on the freeze path answers 405 `{"error"}` naming the method."""
    response = store.http.get(store.path(rid, "freeze"))
    assert response.status_code == 405
    assert "GET" in response.json()["error"]


# -- put --------------------------------------------------------------------------------


def test_put_stores_the_entry(store: Store, rid: str) -> None:
    """PUT calls/{id} answers 200 and the entry is in the next snapshot."""
    payload = entry(rid)
    assert store.put(payload).status_code == 200
    assert store.freeze(rid).json()["entries"] == [payload]


def test_put_of_the_same_payload_again_is_200(store: Store, rid: str) -> None:
    """Repeating a put with the same payload answers 200 and stores it once."""
    payload = entry(rid)
    assert [store.put(payload).status_code, store.put(payload).status_code] == [200, 200]
    assert len(store.freeze(rid).json()["entries"]) == 1


def test_put_of_a_different_payload_is_409(store: Store, rid: str) -> None:
    """Another payload under a stored call id answers 409 naming the call."""
    store.put(entry(rid, generation=[4, 5]))
    response = store.put(entry(rid, generation=[9, 9]))
    assert response.status_code == 409
    assert "c1" in response.json()["error"]


def test_put_after_freeze_is_409(store: Store, rid: str) -> None:
    """A put after the freeze answers 409 saying the rollout is frozen."""
    store.freeze(rid)
    response = store.put(entry(rid))
    assert (response.status_code, "frozen" in response.json()["error"]) == (409, True)


def test_put_after_retire_is_409(store: Store, rid: str) -> None:
    """A put after the snapshot was dropped answers 409 saying it was retired."""
    store.put(entry(rid))
    frozen = store.freeze(rid).json()
    store.drop(rid, {"snapshot_id": frozen["snapshot_id"], "version": frozen["version"]})
    response = store.put(entry(rid, "c2"))
    assert (response.status_code, "retired" in response.json()["error"]) == (409, True)


@pytest.mark.parametrize("bad", ["_x1", "-x1", ".x1"])
def test_writes_under_an_id_finalize_refuses_are_422_naming_it(store: Store, bad: str) -> None:
    """put, intents and incomplete of `_x1` answer 422 naming the id and Gym's rule; none stored."""
    answers = [
        store.put(entry(bad)),
        store.http.post(store.path(bad, "intents"), json={"model_call_id": "c1"}),
        store.http.post(store.path(bad, "incomplete"), json={"model_call_id": "c1"}),
    ]
    for response in answers:
        assert response.status_code == 422
        assert f"{bad!r} must match ^[A-Za-z0-9][A-Za-z0-9._-]*$" in response.json()["error"]
    assert stored_state(store.backend, bad) is None


def test_invalid_entry_is_422_naming_the_field(store: Store, rid: str) -> None:
    """An entry whose log probs do not match its generation answers 422 naming the field."""
    payload = {**entry(rid), "generation_log_probs": [-0.1]}
    response = store.put(payload)
    assert response.status_code == 422
    assert "generation_log_probs" in response.json()["error"]


@pytest.mark.parametrize(
    ("body", "problem"),
    [(b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object"), (b"", "empty")],
    ids=["garbage", "array", "empty"],
)
def test_unreadable_put_body_is_422(store: Store, rid: str, body: bytes, problem: str) -> None:
    """A put body that is not a JSON object answers 422 saying why."""
    response = store.http.put(
        store.path(rid, "calls/c1"), content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert problem in response.json()["error"]


@pytest.mark.parametrize("key", ["model_call_id", "rollout_id"])
def test_body_id_differing_from_the_path_is_422(store: Store, rid: str, key: str) -> None:
    """A body naming another call or rollout than its path answers 422 naming both."""
    payload = {**entry(rid), key: "elsewhere"}
    response = store.http.put(store.path(rid, "calls/c1"), json=payload)
    assert response.status_code == 422
    assert "elsewhere" in response.json()["error"]


def test_body_without_ids_takes_them_from_the_path(store: Store, rid: str) -> None:
    """A put body without rollout_id/model_call_id is stored under the path's ids."""
    payload = entry(rid)
    bare = {k: v for k, v in payload.items() if k not in {"rollout_id", "model_call_id"}}
    assert store.http.put(store.path(rid, "calls/c1"), json=bare).status_code == 200
    assert store.freeze(rid).json()["entries"] == [payload]


def test_infinite_log_probs_survive_the_round_trip(store: Store, rid: str) -> None:
    """A -inf log probability put as `-Infinity` comes back as -inf, not null."""
    payload = make_entry(rid, "c1", [1], [2, 3], log_probs=[-math.inf, -0.5])
    body = json.dumps(payload).encode()  # the stdlib writes -Infinity
    assert store.http.put(store.path(rid, "calls/c1"), content=body).status_code == 200
    frozen = json.loads(store.freeze(rid).content)
    assert frozen["entries"][0]["generation_log_probs"] == [-math.inf, -0.5]


def test_body_over_the_limit_is_413(tmp_path: Path, rid: str) -> None:
    """A put body larger than the server's limit answers 413 `{"error"}` naming the limit."""
    app = create_store_app(FileTokenStore(tmp_path), max_body_bytes=1000)
    with in_process(app) as client:
        payload = make_entry(rid, "c1", list(range(500)), [1])
        response = client.put(f"/ng-rollout/{rid}/training-token-capture/calls/c1", json=payload)
    assert (response.status_code, "1000 bytes" in response.json()["error"]) == (413, True)


# -- freeze -------------------------------------------------------------------------------


def test_freeze_of_a_never_written_rollout_is_an_empty_snapshot(store: Store, rid: str) -> None:
    """Freezing an unknown rollout answers 200 with no entries and a snapshot identity."""
    body = store.freeze(rid).json()
    assert (body["rollout_id"], body["entries"], body["incomplete"]) == (rid, [], False)
    assert isinstance(body["snapshot_id"], str) and isinstance(body["version"], int)


def test_freeze_is_idempotent(store: Store, rid: str) -> None:
    """Two freezes answer the same snapshot_id and version."""
    store.put(entry(rid))
    first, second = store.freeze(rid).json(), store.freeze(rid).json()
    assert (first["snapshot_id"], first["version"]) == (second["snapshot_id"], second["version"])


def test_freeze_after_retire_is_409(store: Store, rid: str) -> None:
    """Freezing a retired rollout answers 409 `{"error"}`."""
    store.put(entry(rid))
    frozen = store.freeze(rid).json()
    store.drop(rid, {"snapshot_id": frozen["snapshot_id"], "version": frozen["version"]})
    response = store.freeze(rid)
    assert (response.status_code, "retired" in response.json()["error"]) == (409, True)


def test_freeze_answers_zstd_when_accepted(store: Store, rid: str) -> None:
    """With Accept-Encoding: zstd a large snapshot comes compressed and decodes to the same."""
    for payload in agent_rollout(rid, calls=12, new_tokens_per_turn=200):
        store.put(payload)
    plain = store.freeze(rid, **{"Accept-Encoding": "identity"})
    packed = store.freeze(rid, **{"Accept-Encoding": "zstd"})
    assert plain.headers.get("content-encoding") is None
    assert packed.headers["content-encoding"] == "zstd"
    assert packed.num_bytes_downloaded < len(plain.content) / 5
    assert orjson.loads(packed.content) == orjson.loads(plain.content)


def test_zstd_answer_is_a_standard_frame(store: Store, rid: str) -> None:
    """The zstd body decodes with the zstandard library alone to the uncompressed answer."""
    for payload in agent_rollout(rid, calls=2, new_tokens_per_turn=200):
        store.put(payload)
    path = store.path(rid, "freeze")
    with store.http.stream("POST", path, headers={"Accept-Encoding": "zstd"}) as response:
        raw = b"".join(response.iter_raw())
    plain = store.freeze(rid, **{"Accept-Encoding": "identity"}).content
    assert zstandard.ZstdDecompressor().decompressobj().decompress(raw) == plain


def test_file_line_stored_twice_is_answered_twice(tmp_path: Path, rid: str) -> None:
    """A line a relay appended twice, byte for byte, is in the answer twice (0.7 counts both)."""
    backend = FileTokenStore(tmp_path)
    payload = entry(rid)
    anyio.run(backend.put, payload)
    jsonl = tmp_path / f"{rid}.tokens.jsonl"
    jsonl.write_bytes(jsonl.read_bytes() * 2)  # the second copy is not yet indexed
    with in_process(create_store_app(backend)) as client:
        answer = client.post(f"/ng-rollout/{rid}/training-token-capture/freeze").json()
    assert answer["entries"] == [payload, payload]


# -- drop -------------------------------------------------------------------------------------


def test_drop_of_the_frozen_snapshot_answers_true_and_repeats(store: Store, rid: str) -> None:
    """Dropping the frozen snapshot answers dropped: true, again on repeat; the store retired it."""
    store.put(entry(rid))
    frozen = store.freeze(rid).json()
    target = {"snapshot_id": frozen["snapshot_id"], "version": frozen["version"]}
    answers = [store.drop(rid, target).json(), store.drop(rid, target).json()]
    assert answers == [{"dropped": True}, {"dropped": True}]
    assert stored_state(store.backend, rid).retired is True


def test_drop_of_another_snapshot_answers_false(store: Store, rid: str) -> None:
    """A drop naming a stale version answers dropped: false and keeps the capture."""
    store.put(entry(rid))
    frozen = store.freeze(rid).json()
    answer = store.drop(rid, {"snapshot_id": frozen["snapshot_id"], "version": 0}).json()
    assert answer == {"dropped": False}
    assert stored_state(store.backend, rid).retired is False


@pytest.mark.parametrize(
    "body",
    [{"version": 1}, {"snapshot_id": "s"}, {"snapshot_id": "s", "version": "1"}],
    ids=["no-snapshot-id", "no-version", "string-version"],
)
def test_malformed_drop_body_is_422(store: Store, rid: str, body: dict) -> None:
    """A drop body without a string snapshot_id and an integer version answers 422."""
    response = store.drop(rid, body)
    assert (response.status_code, "error" in response.json()) == (422, True)


# -- incomplete and intents ----------------------------------------------------------------


def test_mark_incomplete_makes_the_snapshot_incomplete(store: Store, rid: str) -> None:
    """POST incomplete with a call id answers 200 and the snapshot is incomplete."""
    store.put(entry(rid))
    response = store.http.post(store.path(rid, "incomplete"), json={"model_call_id": "c9"})
    assert response.status_code == 200
    assert store.freeze(rid).json()["incomplete"] is True


def test_mark_incomplete_without_a_body_marks_the_rollout(store: Store, rid: str) -> None:
    """POST incomplete with an empty body marks the rollout as a whole."""
    assert store.http.post(store.path(rid, "incomplete")).status_code == 200
    assert store.freeze(rid).json()["incomplete"] is True


def test_announced_call_without_an_entry_makes_the_snapshot_incomplete(
    store: Store, rid: str
) -> None:
    """POST intents answers 200; a call announced and never put leaves the snapshot incomplete."""
    store.put(entry(rid))
    response = store.http.post(store.path(rid, "intents"), json={"model_call_id": "c2"})
    assert response.status_code == 200
    assert store.freeze(rid).json()["incomplete"] is True


def test_announced_call_that_arrived_keeps_the_snapshot_complete(store: Store, rid: str) -> None:
    """A call announced and then put leaves the snapshot complete."""
    store.http.post(store.path(rid, "intents"), json={"model_call_id": "c1"})
    store.put(entry(rid))
    assert store.freeze(rid).json()["incomplete"] is False


def test_intent_after_freeze_is_409(store: Store, rid: str) -> None:
    """Announcing a call after the freeze answers 409."""
    store.freeze(rid)
    response = store.http.post(store.path(rid, "intents"), json={"model_call_id": "c2"})
    assert (response.status_code, "frozen" in response.json()["error"]) == (409, True)


def test_intent_without_a_call_id_is_422(store: Store, rid: str) -> None:
    """An intent body without model_call_id answers 422 naming the key."""
    response = store.http.post(store.path(rid, "intents"), json={})
    assert (response.status_code, "model_call_id" in response.json()["error"]) == (422, True)


# -- ids --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("segment", "decoded"),
    [("a%2Fb", "a/b"), ("a%20b", "a b"), ("%C3%A9", "é"), ("%2E%2E", "..")],
    ids=["slash", "space", "non-ascii", "escaped-dots"],
)
@pytest.mark.parametrize("operation", ["freeze", "drop", "incomplete", "intents", "calls/c1"])
def test_unsafe_rollout_ids_are_422_naming_the_id(
    store: Store, segment: str, decoded: str, operation: str
) -> None:
    """Escaped slashes, spaces, non-ASCII and `..` are refused with 422 naming the id."""
    method = "PUT" if operation.startswith("calls") else "POST"
    response = send_exactly(
        store.http, method, f"/ng-rollout/{segment}/training-token-capture/{operation}"
    )
    assert (response.status_code, repr(decoded) in response.json()["error"]) == (422, True)


def test_dot_dot_segment_is_refused(served_url: str) -> None:
    """A literal `..` rollout segment (sent unnormalized) is refused with 422."""
    status, body = raw_request(served_url, "POST", "/ng-rollout/../training-token-capture/freeze")
    assert (status, "'..'" in body["error"]) == (422, True)


@pytest.mark.parametrize(
    "body",
    [{}, {"prompt_token_ids": [1], "generation_token_ids": [2]}],
    ids=["empty", "no-log-probs"],
)
def test_a_put_without_its_token_arrays_is_422_naming_them(
    store: Store, rid: str, body: dict[str, Any]
) -> None:
    """NeMo Gym's TokenEntry requires its three token arrays: a PUT lacking one stores nothing."""
    path = f"/ng-rollout/{rid}/training-token-capture/calls/c5"
    response = store.http.put(path, json=body)
    missing = {"prompt_token_ids", "generation_token_ids", "generation_log_probs"} - set(body)
    frozen = store.http.post(f"/ng-rollout/{rid}/training-token-capture/freeze").json()
    assert (response.status_code, all(key in response.json()["error"] for key in missing)) == (
        422,
        True,
    )
    assert frozen["entries"] == []


def test_call_id_with_a_newline_is_400_before_routing(store: Store, rid: str) -> None:
    """A model call id with a newline is refused with 400 naming the control character."""
    response = send_exactly(
        store.http, "PUT", f"/ng-rollout/{rid}/training-token-capture/calls/c%0A1"
    )
    assert (response.status_code, "'\\n'" in response.json()["error"]) == (400, True)


def test_call_id_that_is_not_utf8_is_422(store: Store, rid: str) -> None:
    """A percent-encoded call id that does not decode as UTF-8 is refused with 422."""
    response = send_exactly(
        store.http, "PUT", f"/ng-rollout/{rid}/training-token-capture/calls/c%FF"
    )
    assert (response.status_code, "UTF-8" in response.json()["error"]) == (422, True)


def _put_raw(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """PUT `body` to `path` sent byte for byte to a real server."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        payload = json.dumps(body).encode()
        connection.request("PUT", path, body=payload, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("segment", "call_id"),
    [
        ("agent%3A3%2Fcall-7", "agent:3/call-7"),
        ("agent:3/call-7", "agent:3/call-7"),
        ("50%252F", "50%2F"),
        ("%C3%A9%20%E8%AA%BF", "é 調"),
        ("%2E%2E", ".."),
    ],
    ids=["encoded-slash", "plain-slash", "encoded-percent", "non-ascii", "dot-dot"],
)
def test_call_ids_in_the_path_are_decoded_exactly_once(
    served_url: str, segment: str, call_id: str
) -> None:
    """A real server reads the call id from the path as sent, percent-decoded once: the body's
    id then matches it, and the call is stored under it."""
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    path = f"/ng-rollout/{rollout_id}/training-token-capture/calls/{segment}"
    assert _put_raw(served_url, path, entry(rollout_id, call_id)) == (200, {"stored": True})
    status, body = raw_request(served_url, "POST", path.split("/calls/")[0] + "/freeze")
    assert (status, [e["model_call_id"] for e in body["entries"]]) == (200, [call_id])


def test_a_call_id_decoded_twice_would_differ_and_is_refused(served_url: str) -> None:
    """`50%252F` is the id `50%2F`, not `50/`: a body claiming `50/` is refused with 422."""
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    path = f"/ng-rollout/{rollout_id}/training-token-capture/calls/50%252F"
    status, body = _put_raw(served_url, path, entry(rollout_id, "50/"))
    assert (status, "differs from the path's '50%2F'" in body["error"]) == (422, True)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"cum_len": 2**64}, "cum_len"),
        ({"offset": -(2**63) - 1}, "offset"),
        ({"engine_meta": {"sizes": [1, 99_999_999_999_999_999_999_999]}}, "engine_meta.sizes[1]"),
        ({"seed": 2**70}, "seed"),
    ],
    ids=["lineage-2**64", "unknown-below-int64", "nested-unknown", "unknown"],
)
def test_an_integer_beyond_64_bits_is_a_422_naming_the_field(
    served_url: str, extra: dict[str, Any], field: str
) -> None:
    """A lineage or unknown field holding an integer outside [-2**63, 2**64): 422, not a 500."""
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    path = f"/ng-rollout/{rollout_id}/training-token-capture/calls/c1"
    status, body = _put_raw(served_url, path, {**entry(rollout_id), **extra})
    assert status == 422
    assert body["error"].startswith(f"{field} holds an integer outside [-2**63, 2**64)")


def test_the_largest_64_bit_integer_is_stored_exactly(served_url: str) -> None:
    """2**64 - 1 in an unknown field is stored, and frozen back exactly."""
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    path = f"/ng-rollout/{rollout_id}/training-token-capture/calls/c1"
    assert _put_raw(served_url, path, {**entry(rollout_id), "seed": 2**64 - 1})[0] == 200
    status, body = raw_request(served_url, "POST", path.split("/calls/")[0] + "/freeze")
    assert (status, body["entries"][0]["seed"]) == (200, 2**64 - 1)


def test_refused_ids_never_reach_the_file_system(tmp_path: Path) -> None:
    """After every kind of unsafe id, nothing was created inside or beside the served directory."""
    # A real server: the ids include a literal `..`, which only a raw socket sends as is.
    served = tmp_path / "served"
    backend = FileTokenStore(served)
    with running_app(create_store_app(backend)) as url:
        for segment in ("..", "%2E%2E", "a%2Fb", "..%2F..%2Fescape", "a%20b", "%C3%A9", "%00"):
            for operation in ("freeze", "incomplete", "intents", "calls/c1"):
                method = "PUT" if operation.startswith("calls") else "POST"
                path = f"/ng-rollout/{segment}/training-token-capture/{operation}"
                # `%00` is a control character: refused 400 before routing.
                assert raw_request(url, method, path)[0] == (400 if segment == "%00" else 422)
    assert sorted(tmp_path.rglob("*")) == [served]


# -- auth -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}],
    ids=["missing", "wrong", "not-bearer"],
)
def test_protocol_paths_need_the_token(guarded: httpx.Client, headers: dict) -> None:
    """Without the right bearer token every protocol path answers 401 `{"error"}`."""
    response = guarded.post("/ng-rollout/r1/training-token-capture/freeze", headers=headers)
    assert (response.status_code, "error" in response.json()) == (401, True)
    assert response.headers["www-authenticate"] == "Bearer"


def test_right_token_is_let_through(guarded: httpx.Client) -> None:
    """The configured bearer token is accepted."""
    response = guarded.post(
        "/ng-rollout/r1/training-token-capture/freeze",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert response.status_code == 200


def test_health_is_open_without_the_token(guarded: httpx.Client) -> None:
    """/health answers without a token, for probes."""
    assert guarded.get("/health").status_code == 200
