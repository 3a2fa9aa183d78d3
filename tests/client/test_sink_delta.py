"""HttpTokenSink's delta puts against a real store server: stored exactly as the full put.

See docs/store-protocol.md#delta-put.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.captures import make_entry
from tests.support.lineage import stamp_lineage
from tests.support.redis import redis_url, unique_prefix
from tests.support.servers import running_app
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.core.codec import dumps_entry_line
from token_finalizer.core.token_digest import token_digest
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer_client import HttpTokenSink

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "file", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A memory, a file, then a redis store behind the server."""
    if request.param == "memory":
        yield MemoryTokenStore()
    elif request.param == "file":
        yield FileTokenStore(tmp_path / "c")
    else:
        url = redis_url()
        with unique_prefix(url, "sink-delta") as prefix:
            yield RedisTokenStore(url, key_prefix=prefix)


def _twin(store: Any) -> Any:
    """The same stored data through a store object of its own for the server's thread.

    A redis store's connections belong to the event loop (and thread) that opened them:
    the test reads through `store` on its own loop while the server writes through this.
    """
    if isinstance(store, RedisTokenStore):
        return RedisTokenStore(redis_url(), key_prefix=store.key_prefix)
    return store


@pytest.fixture
def served(store: Any) -> Any:
    """The store object the server writes through (`store` itself, or its redis twin)."""
    return _twin(store)


@pytest.fixture
def store_url(served: Any) -> Iterator[str]:
    """An open store server over the data of `store`."""
    with running_app(create_store_app(served)) as url:
        yield url


@pytest.fixture
async def sink(store_url: str) -> AsyncIterator[HttpTokenSink]:
    """A sink recording the bodies it sends."""
    opened = HttpTokenSink(url=store_url)
    sent: list[dict[str, Any]] = []
    send = opened._send

    async def recording(method: str, path: str, payload: Any) -> Any:
        sent.append(payload)
        return await send(method, path, payload)

    opened._send = recording  # type: ignore[method-assign]
    opened.sent = sent  # type: ignore[attr-defined]
    yield opened
    await opened.close()


def _chain(rollout_id: str, calls: int) -> list[dict[str, Any]]:
    entries, context = [], []
    for index in range(calls):
        context = context + list(range(100 * index, 100 * index + 40))
        generation = list(range(100 * index + 50, 100 * index + 55))
        entries.append(make_entry(rollout_id, f"c{index}", context, generation))
        context = context + generation
    parents = {f"c{i}": f"c{i - 1}" if i else None for i in range(calls)}
    return stamp_lineage(entries, parents)


def _rid() -> str:
    return f"r-{uuid.uuid4().hex[:10]}"


async def test_a_full_prompt_chain_goes_as_deltas_and_freezes_whole(
    sink: HttpTokenSink, store: Any
) -> None:
    """Every call after the first is sent as prefix + suffix; the store freezes full entries."""
    rid = _rid()
    entries = _chain(rid, 5)
    for entry in entries:
        await sink.put(entry)
    sent = sink.sent  # type: ignore[attr-defined]
    assert ["prompt_ref" in body for body in sent] == [False, True, True, True, True]
    frozen = await store.freeze_lines(rid)
    assert frozen.lines == tuple(dumps_entry_line(entry) for entry in entries)


async def test_a_chain_put_as_deltas_is_kept_as_its_suffixes(tmp_path: Path) -> None:
    """Entries rebuilt from delta puts are deduplicated at rest exactly as the same entries
    put whole: the file takes the same bytes (not one whole prompt per call)."""
    rid = _rid()
    entries = _chain(rid, 30)
    whole = FileTokenStore(tmp_path / "whole")
    for entry in entries:
        await whole.put(entry)
    store = FileTokenStore(tmp_path / "capture")
    with running_app(create_store_app(store)) as url:
        async with HttpTokenSink(url=url) as sink:
            for entry in entries:
                await sink.put(entry)
    name = f"{rid}.tokens.jsonl"
    stored, expected = ((tmp_path / d / name).stat().st_size for d in ("capture", "whole"))
    assert stored == expected
    # Each prompt whole would be over 30 x 15 x 45 ids: over 40 kB at 2 B an id.
    assert stored < 30_000


async def test_the_full_put_after_a_delta_put_is_a_replay(
    sink: HttpTokenSink, store_url: str, store: Any
) -> None:
    """A full put of an entry that came as a delta is a no-op (the same line is stored)."""
    rid = _rid()
    entries = _chain(rid, 2)
    for entry in entries:
        await sink.put(entry)
    other = HttpTokenSink(url=store_url)  # knows no parent: sends the entry whole
    try:
        await other.put(entries[1])
    finally:
        await other.close()
    assert len((await store.freeze_lines(rid)).lines) == 2


def _delta_body(
    entry: dict[str, Any], stored: dict[str, Any], ref: dict[str, Any]
) -> dict[str, Any]:
    parent = stored
    ids = parent["prompt_token_ids"] + parent["generation_token_ids"]
    body = {key: value for key, value in entry.items() if key != "prompt_token_ids"}
    body["prompt_ref"] = {"parent": parent["model_call_id"], "length": len(ids)}
    body["prompt_ref"]["digest"] = token_digest(ids)
    body["prompt_ref"].update(ref)
    body["prompt_suffix"] = entry["prompt_token_ids"][len(ids) :]
    return body


@pytest.mark.parametrize(
    ("ref", "named"),
    [
        ({"digest": "0" * 64}, "digest"),
        ({"parent": "nobody"}, "nobody"),
        ({"length": 10**6}, "past"),
    ],
)
async def test_a_forged_prefix_reference_is_refused(
    store_url: str, store: Any, ref: dict[str, Any], named: str
) -> None:
    """A wrong digest, an unknown parent or a length past its ids: 422 naming it, nothing
    stored."""
    rid = _rid()
    parent, child = _chain(rid, 2)
    if "parent" in ref:
        child = dict(child, parent_call_id=ref["parent"])
    async with httpx.AsyncClient(base_url=store_url) as client:
        assert (
            await client.put(f"/ng-rollout/{rid}/training-token-capture/calls/c0", json=parent)
        ).status_code == 200
        answer = await client.put(
            f"/ng-rollout/{rid}/training-token-capture/calls/c1",
            json=_delta_body(child, parent, ref),
        )
    assert answer.status_code == 422
    assert named in answer.json()["error"]
    assert len((await store.freeze_lines(rid)).lines) == 1


@pytest.mark.parametrize(
    ("suffix", "named"),
    [(["7"], "prompt_suffix must be a flat list"), ([2**64], "in prompt_suffix"), ([True], "flat")],
)
async def test_a_suffix_of_no_token_ids_is_refused(
    store_url: str, store: Any, suffix: list[Any], named: str
) -> None:
    """A delta put whose suffix holds a non-id (a string, 2**64, a boolean): 422 naming the
    suffix, nothing stored."""
    rid = _rid()
    parent, child = _chain(rid, 2)
    body = dict(_delta_body(child, parent, {}), prompt_suffix=suffix)
    async with httpx.AsyncClient(base_url=store_url) as client:
        await client.put(f"/ng-rollout/{rid}/training-token-capture/calls/c0", json=parent)
        answer = await client.put(f"/ng-rollout/{rid}/training-token-capture/calls/c1", json=body)
    assert answer.status_code == 422
    assert named in answer.json()["error"]
    assert len((await store.freeze_lines(rid)).lines) == 1


async def test_the_sink_falls_back_to_the_full_entry(
    sink: HttpTokenSink, store: Any, served: Any
) -> None:
    """A delta the store refuses (its parent gone) is sent again whole, and stored."""
    rid = _rid()
    entries = _chain(rid, 2)
    await sink.put(entries[0])
    await store.admin.delete(rid)
    if served is not store:  # the server's own object forgets what it wrote, as a delete does
        served._known.forget(rid)
    await sink.put(dict(entries[1], parent_call_id="c0"))
    sent = sink.sent  # type: ignore[attr-defined]
    assert ["prompt_ref" in body for body in sent] == [False, True, False]
    assert (await store.freeze_lines(rid)).lines == (dumps_entry_line(entries[1]),)


async def test_gym_delta_records_pass_unchanged(sink: HttpTokenSink, store: Any) -> None:
    """An entry that is already a delta record is sent as it is."""
    rid = _rid()
    full = _chain(rid, 3)
    parents = {f"c{i}": f"c{i - 1}" if i else None for i in range(3)}
    records = stamp_lineage(full, parents, delta=True)
    for record in records:
        await sink.put(record)
    assert not any("prompt_ref" in body for body in sink.sent)  # type: ignore[attr-defined]
    assert (await store.freeze_lines(rid)).lines == tuple(map(dumps_entry_line, records))


async def test_capabilities_name_the_delta_put(store_url: str) -> None:
    """The store server advertises delta_put, without a token."""
    async with httpx.AsyncClient(base_url=store_url) as client:
        answer = await client.get("/capabilities")
    assert answer.status_code == 200
    assert answer.json()["protocol"] == 1 and "delta_put" in answer.json()["features"]


def _plain_v1_store(bodies: list[dict[str, Any]]) -> Any:
    """A store knowing no extension: it accepts puts and has no /capabilities."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def put(request: Request) -> JSONResponse:
        bodies.append(await request.json())
        return JSONResponse({"stored": True})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/ng-rollout/{rid}/training-token-capture/calls/{cid}", put, methods=["PUT"]),
        ]
    )


async def test_a_store_without_the_feature_gets_full_entries() -> None:
    """Against a store that does not advertise delta_put, every entry goes whole."""
    bodies: list[dict[str, Any]] = []
    rid = _rid()
    entries = _chain(rid, 3)
    with running_app(_plain_v1_store(bodies)) as url:
        sink = HttpTokenSink(url=url)
        try:
            for entry in entries:
                await sink.put(entry)
        finally:
            await sink.close()
    assert bodies == entries
