"""`POST .../lineage/resolve` over the wire: HttpLineageResolver against a store server.

Every test runs against the server (in-process, over httpx's ASGI transport)
over a memory, a file and a redis store. Entries are committed as a NeMo Gym
0.7 writer commits them (tests.support.gym_calls), and requests are the items
a harness would send next.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.gym_calls import (
    Conversation,
    assistant_says,
    committed_call,
    two_turns,
    user_says,
)
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.vectors import case_ids, load_vectors
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer_client import HttpLineageResolver, ResolutionStatus
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    context_digests,
)

pytestmark = pytest.mark.anyio

BASE = "http://store.test"
RESOLVE = "/ng-rollout/{}/training-token-capture/lineage/resolve"
CASES = load_vectors("resolution.json")["cases"]
WIRE_CASES = [case for case in CASES if case["request"] is not None]


@pytest.fixture(scope="module")
def redis_server() -> str:
    """The URL of the test Redis (fails clearly when none answers)."""
    return find_redis_url()


@pytest.fixture(params=["memory", "file", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """An empty memory, file, then redis store (redis: under this test's own key prefix)."""
    if request.param == "memory":
        yield MemoryTokenStore()
    elif request.param == "file":
        yield FileTokenStore(tmp_path / "capture")
    else:
        url = request.getfixturevalue("redis_server")
        with unique_prefix(url, "resolve") as prefix:
            opened = RedisTokenStore(url, key_prefix=prefix)
            yield opened
            await opened.close()


@pytest.fixture
def transport(store: Any) -> httpx.ASGITransport:
    """The store server over `store`, called in-process."""
    return httpx.ASGITransport(app=create_store_app(store))


@pytest.fixture
async def new_resolver(
    transport: httpx.ASGITransport,
) -> AsyncIterator[Callable[[], HttpLineageResolver]]:
    """Builds resolvers of the store server (each a fresh client, as another worker's would be)."""
    built: list[HttpLineageResolver] = []

    def build() -> HttpLineageResolver:
        built.append(HttpLineageResolver(url=BASE, transport=transport))
        return built[-1]

    yield build
    for resolver in built:
        await resolver.close()


@pytest.fixture
def resolver(new_resolver: Callable[[], HttpLineageResolver]) -> HttpLineageResolver:
    """One resolver of the store server, closed after the test."""
    return new_resolver()


@pytest.fixture
async def wire(transport: httpx.ASGITransport) -> AsyncIterator[httpx.AsyncClient]:
    """A raw HTTP client of the store server, for requests the resolver would never send."""
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
        yield client


def _wire_body(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The resolve request body of a client whose next request carries `items`."""
    return {
        "fingerprint_version": FINGERPRINT_VERSION,
        "fingerprint": assistant_fingerprint(items),
        "context_digests": context_digests(items),
    }


async def _commit(store: Any, *entries: dict[str, Any]) -> None:
    for entry in entries:
        await store.put(entry)


# -- the statuses ----------------------------------------------------------------------------


async def test_request_without_model_output_is_root(resolver: HttpLineageResolver) -> None:
    """Items with no assistant turn resolve as root (the client answers without asking)."""
    resolution = await resolver.resolve("r1", [user_says("Weather in Paris?")])
    assert (resolution.status, resolution.match, resolution.reason) == ("root", None, "")


async def test_continuation_resolves_with_full_cumulative_ids(
    store: Any, resolver: HttpLineageResolver
) -> None:
    """A request continuing the first call resolves to it with its whole token sequence."""
    talk = Conversation("r1")
    first = talk.call("call-1", "It is sunny.", new_prompt=[101, 102, 103], generation=[201, 202])
    await _commit(store, first)
    resolution = await resolver.resolve("r1", talk.items)
    assert resolution.status == ResolutionStatus.RESOLVED and resolution.reason == ""
    assert resolution.match is not None
    assert resolution.match.model_call_id == "call-1"
    assert resolution.match.cumulative_token_ids == (101, 102, 103, 201, 202)
    assert (resolution.match.digest, resolution.match.prev_len) == (first["digest"], 5)


async def test_match_over_entries_skips_the_ledger_lookup(
    store: Any, resolver: HttpLineageResolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollout holding token entries holds no ledger rows: its match needs no ledger lookup."""

    async def no_ledger(*_: object) -> None:
        raise AssertionError("the ledger was asked although the entries matched")

    talk, first, second = two_turns()
    await _commit(store, first, second)
    monkeypatch.setattr(store, "resolve_ledger", no_ledger)
    resolution = await resolver.resolve("r1", [*talk.items, user_says("More?")])
    assert resolution.status == ResolutionStatus.RESOLVED
    assert resolution.match is not None and resolution.match.model_call_id == "call-2"


async def test_delta_chain_is_materialized(store: Any, resolver: HttpLineageResolver) -> None:
    """A call stored as a delta resolves with its parent's ids in front of its own."""
    talk, first, second = two_turns()
    await _commit(store, first, second)
    resolution = await resolver.resolve("r1", talk.items)
    assert resolution.match is not None and resolution.match.model_call_id == "call-2"
    assert resolution.match.cumulative_token_ids == (101, 102, 103, 201, 202, 301, 302, 401)
    assert resolution.match.digest == second["digest"]


async def test_unknown_history_is_no_match(store: Any, resolver: HttpLineageResolver) -> None:
    """An assistant turn no committed call wrote leaves the request unresolved: no_match."""
    _, first, second = two_turns()
    await _commit(store, first, second)
    items = [user_says("Weather in Paris?"), assistant_says("Snow."), user_says("go on")]
    resolution = await resolver.resolve("r1", items)
    assert (resolution.status, resolution.reason, resolution.match) == (
        "unresolved",
        "no_match",
        None,
    )


async def test_different_retries_are_ambiguous(store: Any, resolver: HttpLineageResolver) -> None:
    """Two calls with the same answer text but different tokens: unresolved, ambiguous."""
    request = [user_says("Weather in Paris?")]
    output = [assistant_says("It is sunny.")]
    retries = [
        committed_call(
            "r1", call_id, request_items=request, output_items=output, prompt=[1], generation=tokens
        )
        for call_id, tokens in (("call-a", [2]), ("call-b", [3]))
    ]
    await _commit(store, *retries)
    resolution = await resolver.resolve("r1", [*request, *output, user_says("more")])
    assert (resolution.status, resolution.reason) == ("unresolved", "ambiguous")


async def test_identical_retries_collapse_to_the_smallest_call_id(
    store: Any, resolver: HttpLineageResolver
) -> None:
    """Two calls with the same answer and the same tokens resolve to the smaller call id."""
    request = [user_says("Weather in Paris?")]
    output = [assistant_says("It is sunny.")]
    retries = [
        committed_call(
            "r1", call_id, request_items=request, output_items=output, prompt=[1], generation=[2]
        )
        for call_id in ("call-b", "call-a")
    ]
    await _commit(store, *retries)
    resolution = await resolver.resolve("r1", [*request, *output, user_says("more")])
    assert resolution.match is not None and resolution.match.model_call_id == "call-a"


async def test_rewritten_context_is_refused(store: Any, resolver: HttpLineageResolver) -> None:
    """The same assistant turn after an edited user turn does not resolve: no_match."""
    talk = Conversation("r1")
    await _commit(store, talk.call("call-1", "It is sunny.", new_prompt=[1], generation=[2]))
    rewritten = [user_says("REWRITTEN"), *talk.items[1:]]
    resolution = await resolver.resolve("r1", rewritten)
    assert (resolution.status, resolution.reason) == ("unresolved", "no_match")


async def test_other_fingerprint_version_is_ignored(
    store: Any, resolver: HttpLineageResolver
) -> None:
    """An entry stamped with another fingerprint version is never a candidate."""
    talk = Conversation("r1")
    entry = talk.call("call-1", "It is sunny.", new_prompt=[1], generation=[2])
    await _commit(store, {**entry, "fingerprint_version": 1})
    resolution = await resolver.resolve("r1", talk.items)
    assert (resolution.status, resolution.reason) == ("unresolved", "no_match")


# -- what the store reads ----------------------------------------------------------------------


async def test_just_put_entry_is_visible(store: Any, resolver: HttpLineageResolver) -> None:
    """A resolver that existed before the put sees the entry as soon as the put returned."""
    talk = Conversation("r1")
    assert (await resolver.resolve("r1", [*talk.items, assistant_says("x")])).reason == "no_match"
    entry = talk.call("call-1", "It is sunny.", new_prompt=[1], generation=[2])
    await _commit(store, entry)
    assert (await resolver.resolve("r1", talk.items)).status == "resolved"


async def test_fresh_resolver_sees_an_earlier_write(
    store: Any, new_resolver: Callable[[], HttpLineageResolver]
) -> None:
    """A resolver built after the put (another worker's) resolves to the committed call."""
    talk = Conversation("r1")
    await _commit(store, talk.call("call-1", "It is sunny.", new_prompt=[1], generation=[2]))
    resolution = await new_resolver().resolve("r1", talk.items)
    assert resolution.match is not None and resolution.match.model_call_id == "call-1"


async def test_resolving_does_not_freeze_the_rollout(
    store: Any, resolver: HttpLineageResolver
) -> None:
    """After a resolve the rollout still takes puts (resolution is read-only)."""
    talk, first, second = two_turns()
    await _commit(store, first)
    await resolver.resolve("r1", talk.items)
    await _commit(store, second)
    snapshot = await store.freeze("r1")
    assert [entry.model_call_id for entry in snapshot.entries] == ["call-1", "call-2"]


async def test_frozen_rollout_still_resolves(store: Any, resolver: HttpLineageResolver) -> None:
    """A frozen (not retired) rollout resolves over its entries."""
    talk, first, second = two_turns()
    await _commit(store, first, second)
    await store.freeze("r1")
    assert (await resolver.resolve("r1", talk.items)).status == "resolved"


async def test_retired_rollout_resolves_over_no_entries(
    store: Any, resolver: HttpLineageResolver
) -> None:
    """Once the snapshot was dropped, the same request is unresolved: no_match."""
    talk, first, second = two_turns()
    await _commit(store, first, second)
    snapshot = await store.freeze("r1")
    assert await store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert (await resolver.resolve("r1", talk.items)).reason == "no_match"


async def test_unknown_rollout_is_no_match(resolver: HttpLineageResolver) -> None:
    """A rollout nobody wrote to resolves a continuation as unresolved: no_match."""
    talk = Conversation("never-written")
    talk.call("call-1", "It is sunny.", new_prompt=[1], generation=[2])
    assert (await resolver.resolve("never-written", talk.items)).reason == "no_match"


async def test_empty_fingerprint_on_the_wire_is_root(wire: httpx.AsyncClient) -> None:
    """A raw request with fingerprint "" is answered root for any rollout."""
    body = {"fingerprint_version": 2, "fingerprint": "", "context_digests": context_digests([])}
    answer = await wire.post(RESOLVE.format("never-written"), json=body)
    assert answer.json() == {"status": "root", "reason": "", "match": None}


async def test_large_match_is_zstd_when_asked(store: Any, wire: httpx.AsyncClient) -> None:
    """A client accepting zstd receives the resolve answer compressed."""
    talk = Conversation("r1")
    await _commit(store, talk.call("call-1", "sunny", new_prompt=list(range(5000)), generation=[7]))
    body = _wire_body(talk.items)
    answer = await wire.post(RESOLVE.format("r1"), json=body, headers={"Accept-Encoding": "zstd"})
    assert answer.headers["content-encoding"] == "zstd"
    # httpx undoes the zstd encoding the header names.
    assert answer.json()["match"]["cumulative_token_ids"] == [*range(5000), 7]


async def test_compact_match_is_sent_uncompressed(store: Any, wire: httpx.AsyncClient) -> None:
    """The compact answer (already dense) is never zstd, even to a client that accepts it."""
    talk = Conversation("r1")
    await _commit(store, talk.call("call-1", "sunny", new_prompt=list(range(5000)), generation=[7]))
    body = _wire_body(talk.items)
    answer = await wire.post(
        RESOLVE.format("r1") + "?tokens=compact", json=body, headers={"Accept-Encoding": "zstd"}
    )
    assert "content-encoding" not in answer.headers
    assert _decoded(answer.json()["match"]["cumulative_tokens"]) == [*range(5000), 7]


async def test_large_rollout_resolves_the_same(store: Any, resolver: HttpLineageResolver) -> None:
    """A rollout past the in-thread threshold (325k tokens) resolves its last call."""
    talk = Conversation("r1")
    parent = None
    for turn in range(25):
        call_id = f"call-{turn:02d}"
        entry = talk.call(
            call_id,
            f"turn {turn}",
            new_prompt=[turn] * 1000,
            generation=[turn],
            parent_call_id=parent,
        )
        await _commit(store, entry)
        parent = call_id
    resolution = await resolver.resolve("r1", talk.items)
    assert resolution.match is not None and resolution.match.model_call_id == "call-24"
    assert resolution.match.prev_len == 25 * 1001


# -- the compact form of the cumulative ids (tokens=compact) -------------------------------------


def _decoded(tokens: dict[str, Any]) -> list[int]:
    dtype = {"u32le": "<u4", "u64le": "<u8"}[tokens["encoding"]]
    return np.frombuffer(base64.b64decode(tokens["data"]), dtype=dtype).tolist()


async def test_compact_match_carries_the_ids_as_little_endian_u32(
    store: Any, wire: httpx.AsyncClient
) -> None:
    """With tokens=compact the match holds `cumulative_tokens` (u32le, base64), not the list."""
    talk, first, second = two_turns()
    await _commit(store, first, second)
    answer = (
        await wire.post(RESOLVE.format("r1") + "?tokens=compact", json=_wire_body(talk.items))
    ).json()
    match = answer["match"]
    assert "cumulative_token_ids" not in match
    assert match["cumulative_tokens"]["encoding"] == "u32le"
    assert match["cumulative_tokens"]["length"] == match["prev_len"] == 8
    assert _decoded(match["cumulative_tokens"]) == [101, 102, 103, 201, 202, 301, 302, 401]


async def test_compact_match_widens_to_u64_for_ids_past_u32(
    store: Any, wire: httpx.AsyncClient
) -> None:
    """An id of 2**32 or more sends every id as u64le."""
    talk = Conversation("r1")
    await _commit(store, talk.call("call-1", "big", new_prompt=[1, 2**32], generation=[3]))
    answer = (
        await wire.post(RESOLVE.format("r1") + "?tokens=compact", json=_wire_body(talk.items))
    ).json()
    tokens = answer["match"]["cumulative_tokens"]
    assert tokens["encoding"] == "u64le" and _decoded(tokens) == [1, 2**32, 3]


async def test_plain_form_is_the_default(store: Any, wire: httpx.AsyncClient) -> None:
    """Without the parameter (or with tokens=plain) the match lists `cumulative_token_ids`."""
    talk, first, _ = two_turns()
    await _commit(store, first)
    for suffix in ("", "?tokens=plain"):
        answer = (
            await wire.post(RESOLVE.format("r1") + suffix, json=_wire_body(talk.items[:3]))
        ).json()
        assert answer["match"]["cumulative_token_ids"] == [101, 102, 103, 201, 202]


async def test_unknown_token_form_is_422(wire: httpx.AsyncClient) -> None:
    """A `tokens` value other than plain or compact is refused."""
    answer = await wire.post(RESOLVE.format("r1") + "?tokens=packed", json=_GOOD)
    assert answer.status_code == 422 and "tokens" in answer.json()["error"]


# -- malformed requests ----------------------------------------------------------------------------

_GOOD = {
    "fingerprint_version": 2,
    "fingerprint": "a" * 64,
    "context_digests": ["b" * 64, "c" * 64],
}


@pytest.mark.parametrize(
    "body",
    [
        {**_GOOD, "fingerprint_version": 1},
        {**_GOOD, "fingerprint_version": "2"},
        {**_GOOD, "fingerprint_version": True},
        {**_GOOD, "fingerprint": "A" * 64},
        {**_GOOD, "fingerprint": "abc"},
        {**_GOOD, "fingerprint": None},
        {**_GOOD, "context_digests": []},
        {**_GOOD, "context_digests": ["B" * 64]},
        {**_GOOD, "context_digests": ["b" * 63]},
        {**_GOOD, "context_digests": [1]},
        {**_GOOD, "context_digests": "b" * 64},
        {**_GOOD, "context_digests": {"b" * 64: 1}},
        {key: value for key, value in _GOOD.items() if key != "context_digests"},
        {key: value for key, value in _GOOD.items() if key != "fingerprint_version"},
        [],
        "text",
    ],
    ids=[
        "version-1",
        "version-string",
        "version-bool",
        "fingerprint-uppercase",
        "fingerprint-short",
        "fingerprint-null",
        "digests-empty",
        "digest-uppercase",
        "digest-short",
        "digest-number",
        "digests-string",
        "digests-object",
        "digests-missing",
        "version-missing",
        "body-list",
        "body-string",
    ],
)
async def test_malformed_request_is_422(wire: httpx.AsyncClient, body: Any) -> None:
    """A resolve body breaking the request rules is refused with 422 and an error message."""
    answer = await wire.post(RESOLVE.format("r1"), json=body)
    assert answer.status_code == 422
    assert isinstance(answer.json()["error"], str)


async def test_bad_rollout_id_is_422(wire: httpx.AsyncClient) -> None:
    """A rollout id breaking the store id rule is refused with 422."""
    answer = await wire.post(RESOLVE.format("a%20b"), json=_GOOD)
    assert answer.status_code == 422


async def test_non_json_body_is_422(wire: httpx.AsyncClient) -> None:
    """A body that is not JSON is refused with 422."""
    answer = await wire.post(
        RESOLVE.format("r1"), content=b"{", headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422


# -- the reference vectors over the wire ----------------------------------------------------------


@pytest.mark.parametrize("case", WIRE_CASES, ids=case_ids(WIRE_CASES))
async def test_wire_request_answers_the_vector(
    store: Any, wire: httpx.AsyncClient, case: dict[str, Any]
) -> None:
    """Each NeMo Gym 0.7 resolution vector, committed and asked over the wire, gives its answer."""
    await _commit(store, *case["entries"])
    answer = await wire.post(RESOLVE.format("r"), json=case["request"])
    assert answer.status_code == 200
    assert answer.json() == case["expected"]


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
async def test_resolver_answers_the_vector(
    store: Any, resolver: HttpLineageResolver, case: dict[str, Any]
) -> None:
    """Each vector's request items, resolved through HttpLineageResolver, give its answer."""
    await _commit(store, *case["entries"])
    resolution = await resolver.resolve("r", case["request_items"])
    match = resolution.match
    answer = {
        "status": str(resolution.status),
        "reason": resolution.reason,
        "match": None
        if match is None
        else {
            "model_call_id": match.model_call_id,
            "cumulative_token_ids": list(match.cumulative_token_ids),
            "digest": match.digest,
            "prev_len": match.prev_len,
        },
    }
    assert answer == case["expected"]
