"""HttpTokenSource, NeMo Gym 0.7's TokenSource over a real store server, without Gym loaded."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.support.captures import make_entry
from tests.support.servers import running_app
from token_finalizer import FileTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server.roles import StoreTokens
from token_finalizer_client import (
    ConflictError,
    HttpTokenSink,
    HttpTokenSource,
    InvalidAnswerError,
    PermissionDeniedError,
    SourceEntry,
    SourceSnapshot,
)

pytestmark = pytest.mark.anyio

WRITER, FINALIZER = "source-writer", "source-finalizer"


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A store server with a writer and a finalizer token."""
    store = FileTokenStore(tmp_path_factory.mktemp("token-source-store"))
    tokens = StoreTokens(writer=(WRITER,), finalizer=(FINALIZER,))
    with running_app(create_store_app(store, tokens=tokens)) as url:
        yield url


@pytest.fixture
async def sink(store_url: str) -> AsyncIterator[HttpTokenSink]:
    """A writer of the module's store."""
    opened = HttpTokenSink(url=store_url, token=WRITER)
    yield opened
    await opened.close()


@pytest.fixture
async def source(store_url: str) -> AsyncIterator[HttpTokenSource]:
    """The source under test, in the finalizer role."""
    opened = HttpTokenSource(store_url, token=FINALIZER)
    yield opened
    await opened.close()


@pytest.fixture
def rid() -> str:
    """A rollout id no other test uses."""
    return f"r-{uuid.uuid4().hex[:12]}"


def test_gym_is_not_loaded_here() -> None:
    """These tests exercise the plain form: NeMo Gym is not in the project's environment."""
    assert "nemo_gym" not in sys.modules


async def test_freeze_returns_the_plain_snapshot_with_lists(
    sink: HttpTokenSink, source: HttpTokenSource, rid: str
) -> None:
    """Without Gym, freeze answers a SourceSnapshot of SourceEntry holding plain lists."""
    entry = make_entry(rid, "call-1", [1, 2, 3], [4, 5])
    await sink.put(entry)
    snapshot = await source.freeze(rid)
    assert isinstance(snapshot, SourceSnapshot) and isinstance(snapshot.entries[0], SourceEntry)
    frozen = snapshot.entries[0]
    assert (frozen.prompt_token_ids, frozen.generation_token_ids) == ([1, 2, 3], [4, 5])
    assert frozen.model_dump() == json.loads(json.dumps(entry))
    assert not snapshot.incomplete and snapshot.snapshot_id


async def test_freeze_twice_returns_the_same_snapshot(
    sink: HttpTokenSink, source: HttpTokenSource, rid: str
) -> None:
    """Freezing is idempotent: the same snapshot id and version."""
    await sink.put(make_entry(rid, "call-1", [1], [2]))
    first, second = await source.freeze(rid), await source.freeze(rid)
    assert (first.snapshot_id, first.version) == (second.snapshot_id, second.version)


async def test_incomplete_mark_shows_in_the_snapshot(
    sink: HttpTokenSink, source: HttpTokenSource, rid: str
) -> None:
    """A call marked incomplete makes the snapshot incomplete."""
    await sink.put(make_entry(rid, "call-1", [1], [2]))
    await sink.mark_incomplete(rid, "call-2")
    assert (await source.freeze(rid)).incomplete is True


async def test_drop_of_the_exact_snapshot_is_true_then_freeze_conflicts(
    sink: HttpTokenSink, source: HttpTokenSource, rid: str
) -> None:
    """Dropping the consumed snapshot answers True; a later freeze of it raises ConflictError."""
    await sink.put(make_entry(rid, "call-1", [1], [2]))
    snapshot = await source.freeze(rid)
    assert await source.drop(rid, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    with pytest.raises(ConflictError):
        await source.freeze(rid)


async def test_drop_of_a_stale_version_is_false(
    sink: HttpTokenSink, source: HttpTokenSource, rid: str
) -> None:
    """A drop naming another version answers False and keeps the evidence."""
    await sink.put(make_entry(rid, "call-1", [1], [2]))
    snapshot = await source.freeze(rid)
    stale = await source.drop(rid, snapshot_id=snapshot.snapshot_id, version=snapshot.version + 1)
    assert stale is False and len((await source.freeze(rid)).entries) == 1


async def test_a_writer_token_cannot_freeze(store_url: str, rid: str) -> None:
    """Freezing takes the finalizer role: a writer token is refused (403)."""
    async with HttpTokenSource(store_url, token=WRITER) as source:
        with pytest.raises(PermissionDeniedError):
            await source.freeze(rid)


async def test_freeze_speaks_plain_v1(rid: str) -> None:
    """The freeze is `POST .../freeze` without a query or a body: any v1 store answers it."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = {"rollout_id": rid, "entries": [], "incomplete": False}
        return httpx.Response(200, json={**body, "snapshot_id": "s1", "version": 1})

    transport = httpx.MockTransport(answer)
    async with HttpTokenSource("http://store.test", transport=transport) as source:
        await source.freeze(rid)
    assert seen[0].url.query == b"" and seen[0].content == b""
    assert seen[0].url.path.endswith(f"/{rid}/training-token-capture/freeze")


async def test_a_staged_rollout_is_refused_with_a_pointer(rid: str) -> None:
    """A staging rollout's freeze answer (no token entries) raises InvalidAnswerError."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"rollout_id": rid, "kind": "staged", "manifest": {}})

    async with HttpTokenSource("http://store.test", transport=httpx.MockTransport(answer)) as src:
        with pytest.raises(InvalidAnswerError, match="HttpStagingSource"):
            await src.freeze(rid)


async def test_an_answer_for_another_rollout_is_refused(rid: str) -> None:
    """A freeze answer naming another rollout raises InvalidAnswerError."""

    def answer(request: httpx.Request) -> httpx.Response:
        body = {"rollout_id": "other", "entries": [], "incomplete": False}
        return httpx.Response(200, json={**body, "snapshot_id": "s1", "version": 1})

    async with HttpTokenSource("http://store.test", transport=httpx.MockTransport(answer)) as src:
        with pytest.raises(InvalidAnswerError, match="not this rollout"):
            await src.freeze(rid)


async def test_drop_refuses_a_bad_version_before_sending(source: HttpTokenSource) -> None:
    """A version that is not an integer is a ValueError, nothing sent."""
    with pytest.raises(ValueError, match="version"):
        await source.drop("r-1", snapshot_id="s1", version="2")  # type: ignore[arg-type]
