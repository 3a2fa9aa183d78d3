"""HttpTokenSink, the writer side of protocol v1, against a real capture-store server."""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import numpy as np
import pydantic
import pytest

from tests.support.captures import make_entry
from tests.support.servers import free_port, running_app
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer_client import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    FinalizerError,
    HttpTokenSink,
)

pytestmark = pytest.mark.anyio

TOKEN = "sink-s3cret"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> FileTokenStore:
    """The file store behind the module's store server."""
    return FileTokenStore(tmp_path_factory.mktemp("sink-store"))


@pytest.fixture(scope="module")
def store_url(store: FileTokenStore) -> Iterator[str]:
    """A store server (token required) over `store`."""
    with running_app(create_store_app(store, token=TOKEN)) as url:
        yield url


@pytest.fixture
async def sink(store_url: str) -> AsyncIterator[HttpTokenSink]:
    """A sink of the module's store, closed after the test."""
    opened = HttpTokenSink(url=store_url, token=TOKEN)
    yield opened
    await opened.close()


@pytest.fixture
def rid() -> str:
    """A rollout id no other test uses."""
    return f"r-{uuid.uuid4().hex[:12]}"


class EntryModel(pydantic.BaseModel):
    """A writer's own pydantic TokenEntry model."""

    rollout_id: str
    model_call_id: str
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]


async def test_put_stores_the_entry(sink: HttpTokenSink, store: FileTokenStore, rid: str) -> None:
    """A put lands in the store: the next snapshot holds it."""
    await sink.put(make_entry(rid, "c1", [1, 2], [3, 4]))
    snapshot = await store.freeze(rid)
    assert [e.generation_token_ids.tolist() for e in snapshot.entries] == [[3, 4]]


async def test_put_of_the_same_entry_twice_is_fine(
    sink: HttpTokenSink, store: FileTokenStore, rid: str
) -> None:
    """Repeating a put is idempotent: no error, one stored entry, one version bump."""
    payload = make_entry(rid, "c1", [1, 2], [3, 4])
    await sink.put(payload)
    await sink.put(payload)
    assert stored_state(store, rid).version == 1


async def test_conflicting_put_raises_conflict(sink: HttpTokenSink, rid: str) -> None:
    """A different payload under a stored call id raises ConflictError with the store's reason."""
    await sink.put(make_entry(rid, "c1", [1, 2], [3, 4]))
    with pytest.raises(ConflictError, match="different payload"):
        await sink.put(make_entry(rid, "c1", [1, 2], [9, 9]))


async def test_put_after_freeze_raises_conflict(
    sink: HttpTokenSink, store: FileTokenStore, rid: str
) -> None:
    """A put after the finalizer froze the rollout raises ConflictError saying it is frozen."""
    await store.freeze(rid)
    with pytest.raises(ConflictError, match="frozen"):
        await sink.put(make_entry(rid, "c1", [1], [2]))


async def test_invalid_entry_raises_bad_request(sink: HttpTokenSink, rid: str) -> None:
    """An entry the store refuses raises BadRequestError naming the field."""
    payload = {**make_entry(rid, "c1", [1], [2]), "generation_log_probs": []}
    with pytest.raises(BadRequestError, match="generation_log_probs"):
        await sink.put(payload)


async def test_pydantic_model_entry_is_accepted(
    sink: HttpTokenSink, store: FileTokenStore, rid: str
) -> None:
    """A pydantic model is sent as its model_dump."""
    model = EntryModel(
        rollout_id=rid,
        model_call_id="c1",
        prompt_token_ids=[1],
        generation_token_ids=[2],
        generation_log_probs=[-math.inf],
    )
    await sink.put(model)
    entry = (await store.freeze(rid)).entries[0]
    assert entry.generation_log_probs.tolist() == [-math.inf]


async def test_begin_call_without_put_makes_the_snapshot_incomplete(
    sink: HttpTokenSink, store: FileTokenStore, rid: str
) -> None:
    """An announced call that never arrives leaves the snapshot incomplete."""
    await sink.begin_call(rid, "c1")
    assert (await store.freeze(rid)).incomplete is True


async def test_begin_call_then_put_keeps_the_snapshot_complete(
    sink: HttpTokenSink, store: FileTokenStore, rid: str
) -> None:
    """An announced call that was put leaves the snapshot complete."""
    await sink.begin_call(rid, "c1")
    await sink.put(make_entry(rid, "c1", [1], [2]))
    assert (await store.freeze(rid)).incomplete is False


async def test_begin_call_after_freeze_raises_conflict(
    sink: HttpTokenSink, store: FileTokenStore, rid: str
) -> None:
    """Announcing a call of a frozen rollout raises ConflictError."""
    await store.freeze(rid)
    with pytest.raises(ConflictError):
        await sink.begin_call(rid, "c1")


@pytest.mark.parametrize("call_id", ["c7", ""], ids=["one-call", "whole-rollout"])
async def test_mark_incomplete_makes_the_snapshot_incomplete(
    sink: HttpTokenSink, store: FileTokenStore, rid: str, call_id: str
) -> None:
    """mark_incomplete (for one call or the rollout) makes the snapshot incomplete."""
    await sink.put(make_entry(rid, "c1", [1], [2]))
    await sink.mark_incomplete(rid, call_id)
    assert (await store.freeze(rid)).incomplete is True


async def test_close_twice_then_put_raises(store_url: str, rid: str) -> None:
    """Closing twice is fine; a put afterwards raises FinalizerError saying it is closed."""
    sink = HttpTokenSink(url=store_url, token=TOKEN)
    await sink.put(make_entry(rid, "c1", [1], [2]))
    await sink.close()
    await sink.close()
    with pytest.raises(FinalizerError, match="closed"):
        await sink.put(make_entry(rid, "c2", [1], [2]))


async def test_wrong_token_raises_authentication_error(store_url: str, rid: str) -> None:
    """A sink with the wrong token raises AuthenticationError."""
    async with HttpTokenSink(url=store_url, token="wrong") as sink:
        with pytest.raises(AuthenticationError):
            await sink.put(make_entry(rid, "c1", [1], [2]))


async def test_unreachable_store_raises_connection_error(rid: str) -> None:
    """Nothing listening raises APIConnectionError naming the URL."""
    url = f"http://127.0.0.1:{free_port()}"
    async with HttpTokenSink(url=url, max_retries=0) as sink:
        with pytest.raises(APIConnectionError, match=re.escape(url)):
            await sink.put(make_entry(rid, "c1", [1], [2]))


async def test_gateway_error_is_retried_then_succeeds(rid: str) -> None:
    """A 503 before the store's answer is retried, and the put succeeds."""
    answers = [httpx.Response(503), httpx.Response(200, json={"stored": True})]
    transport = httpx.MockTransport(lambda request: answers.pop(0))
    async with HttpTokenSink(url="http://store.test", transport=transport) as sink:
        await sink.put(make_entry(rid, "c1", [1], [2]))
    assert answers == []


async def test_timeout_raises_api_timeout_error(rid: str) -> None:
    """A store that does not answer in time raises APITimeoutError."""

    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    transport = httpx.MockTransport(hang)
    async with HttpTokenSink(url="http://store.test", max_retries=0, transport=transport) as sink:
        with pytest.raises(APITimeoutError):
            await sink.put(make_entry(rid, "c1", [1], [2]))


async def test_numpy_token_arrays_are_sent_as_lists(
    sink: HttpTokenSink, store: FileTokenStore, rid: str
) -> None:
    """An entry holding numpy arrays (as a model server may) is stored with the same ids."""
    payload = make_entry(rid, "c1", [1, 2], [3, 4])
    payload["prompt_token_ids"] = np.array([1, 2], dtype=np.int32)
    payload["generation_token_ids"] = np.array([3, 4], dtype=np.int64)
    await sink.put(payload)
    entry = (await store.freeze(rid)).entries[0]
    assert (entry.prompt_token_ids.tolist(), entry.generation_token_ids.tolist()) == (
        [1, 2],
        [3, 4],
    )


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("put", (make_entry("a/b", "c1", [1], [2]),)),
        ("put", (make_entry("r1", "c\n1", [1], [2]),)),
        ("put", ({"model_call_id": "c1"},)),
        ("begin_call", ("r 1", "c1")),
        ("begin_call", ("r1", "")),
        ("mark_incomplete", ("..", "")),
        ("mark_incomplete", ("r1", "c\x001")),
    ],
    ids=["slash", "newline-call", "no-rollout", "space", "empty-call", "dots", "nul-call"],
)
async def test_unsafe_ids_are_refused_before_any_request(call: str, args: tuple) -> None:
    """An unsafe or missing id raises ValueError naming it, and nothing is sent."""
    sent: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(200))
    async with HttpTokenSink(url="http://store.test", transport=transport) as sink:
        with pytest.raises(ValueError, match=r"must be a non-empty string|control characters"):
            await getattr(sink, call)(*args)
    assert sent == []


@pytest.mark.parametrize(
    ("call", "args"),
    [
        ("put", (make_entry("_x1", "c1", [1], [2]),)),
        ("begin_call", ("-x1", "c1")),
        ("mark_incomplete", (".x1", "")),
    ],
    ids=["put", "begin_call", "mark_incomplete"],
)
async def test_ids_finalize_would_refuse_are_refused_before_any_request(
    call: str, args: tuple
) -> None:
    """An id starting with `_`, `-` or `.` raises ValueError naming Gym's rule; nothing is sent."""
    sent: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(200))
    async with HttpTokenSink(url="http://store.test", transport=transport) as sink:
        with pytest.raises(ValueError, match=r"'[-_.]x1' must match \^\[A-Za-z0-9\]"):
            await getattr(sink, call)(*args)
    assert sent == []


async def test_a_call_id_with_a_slash_is_put_percent_encoded() -> None:
    """`agent:3/call-7` goes out as one encoded path segment, the body unchanged."""
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json={"stored": True})

    async with HttpTokenSink(
        url="http://store.test", transport=httpx.MockTransport(answer)
    ) as sink:
        await sink.put(make_entry("r1", "agent:3/call-7", [1], [2]))
    assert sent[0].url.raw_path == b"/ng-rollout/r1/training-token-capture/calls/agent%3A3%2Fcall-7"
    assert json.loads(sent[0].content)["model_call_id"] == "agent:3/call-7"


async def test_entry_that_is_not_a_mapping_is_refused() -> None:
    """A put of something that is neither a mapping nor a pydantic model raises TypeError."""
    async with HttpTokenSink(url="http://store.test") as sink:
        with pytest.raises(TypeError, match="mapping or a pydantic model"):
            await sink.put(["not", "an", "entry"])


def test_sink_is_built_from_keyword_arguments_alone() -> None:
    """A config's `sink_kwargs` mapping is enough to build the sink; the token stays hidden."""
    sink_kwargs = {"url": "http://capture-store:8100/", "token": "t0k", "timeout": 5.0}
    sink = HttpTokenSink(**sink_kwargs)
    assert (sink.url, "t0k" in repr(sink)) == ("http://capture-store:8100", False)


def test_positional_arguments_are_refused() -> None:
    """The constructor is keyword-only, so configs cannot pass arguments in the wrong slot."""
    with pytest.raises(TypeError):
        HttpTokenSink("http://capture-store:8100")  # type: ignore[misc]  # the misuse under test
