"""The `http` source on a staging rollout: the staged freeze answer and the extras of staged calls.

A store server over a memory store, reached in-process through httpx's ASGI
transport: the finalizer gets from it exactly what a local store gives
(docs/staging.md#protocol). Malformed answers come from a mocked store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx

from tests.support.staging_stores import Conversation
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.core.errors import SourceUnavailable
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer.store_server import create_store_app

pytestmark = pytest.mark.anyio

URL = "http://capture-store.test"
RID = "rollout-remote"


@pytest.fixture
def backend() -> MemoryTokenStore:
    """The store behind the server."""
    return MemoryTokenStore()


@pytest.fixture
async def source(backend: MemoryTokenStore) -> AsyncIterator[HttpTokenSource]:
    """An http source whose requests reach a store server over `backend` in-process."""
    transport = httpx.ASGITransport(app=create_store_app(backend))
    opened = HttpTokenSource(URL, transport=transport)
    yield opened
    await opened.close()


async def _written(backend: MemoryTokenStore | FileTokenStore) -> Conversation:
    chat = Conversation(RID)
    chat.add("c1", extras={"routed_experts": [[[3, 4]]]})
    chat.add("c2")
    for record, row in zip(chat.records, chat.rows, strict=True):
        await backend.stage(record)
        await backend.record_ledger_row(RID, row)
    return chat


async def test_a_remote_staged_freeze_is_a_local_one(
    source: HttpTokenSource, backend: MemoryTokenStore
) -> None:
    """The snapshot over HTTP equals the store's own: manifest, snapshots, id and version."""
    await _written(backend)
    remote = await source.freeze(RID)
    local = await backend.freeze(RID)
    assert (remote.snapshot_id, remote.version, remote.entries, remote.staged) == (
        local.snapshot_id,
        local.version,
        (),
        local.staged,
    )


async def test_a_missing_staged_call_comes_back_as_none(
    source: HttpTokenSource, backend: MemoryTokenStore
) -> None:
    """A committed call that was never staged is None in the remote snapshot too."""
    chat = Conversation.of(RID, 1)
    await backend.record_ledger_row(RID, chat.rows[0])
    assert (await source.freeze(RID)).staged.snapshots == (None,)


async def test_extras_come_back_per_staged_call(
    source: HttpTokenSource, backend: MemoryTokenStore
) -> None:
    """fetch_extras maps each staged call to its extras; a call not staged is absent."""
    await _written(backend)
    assert await source.fetch_extras(RID, ["c1", "c2", "nope"]) == {
        "c1": {"routed_experts": [[[3, 4]]]},
        "c2": None,
    }


async def test_no_calls_need_no_request(source: HttpTokenSource) -> None:
    """fetch_extras of no calls answers {} (the store is not asked)."""
    assert await source.fetch_extras(RID, []) == {}


def _staged_body(**changes: Any) -> dict[str, Any]:
    """A well-formed staged freeze answer of a rollout without rows, then `changes`."""
    body = {
        "rollout_id": RID,
        "kind": "staged",
        "snapshot_id": "s" * 32,
        "version": 3,
        "incomplete": False,
        "entries": [],
        "manifest": {"rollout_id": RID, "records": [], "failures": []},
        "snapshots": [],
    }
    return {**body, **changes}


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"kind": "other"}, "unknown kind"),
        ({"manifest": {"rollout_id": "another", "records": []}}, "another"),
        ({"manifest": []}, "no manifest"),
        ({"snapshots": [None]}, "one snapshot"),
        ({"entries": [{}]}, "lists entries"),
    ],
    ids=["kind", "other-rollout", "manifest-not-object", "snapshot-count", "entries"],
)
async def test_a_malformed_staged_answer_is_the_stores_fault(
    changes: dict[str, Any], problem: str
) -> None:
    """An answer that does not fit raises SourceUnavailable saying what is wrong."""
    async with HttpTokenSource(URL) as source:
        with respx.mock(base_url=URL) as mock:
            path = f"/ng-rollout/{RID}/training-token-capture/freeze"
            mock.post(path).respond(json=_staged_body(**changes))
            with pytest.raises(SourceUnavailable, match=problem):
                await source.freeze(RID)


async def test_an_extras_answer_of_another_length_is_refused() -> None:
    """One value per call asked, or SourceUnavailable."""
    async with HttpTokenSource(URL) as source:
        with respx.mock(base_url=URL) as mock:
            path = f"/ng-rollout/{RID}/training-token-capture/staged/extras"
            mock.post(path).respond(json={"extras": [], "missing": []})
            with pytest.raises(SourceUnavailable, match="one extras value"):
                await source.fetch_extras(RID, ["c1"])


@pytest.fixture
async def file_source(tmp_path: Any) -> AsyncIterator[tuple[HttpTokenSource, FileTokenStore]]:
    """An http source reaching a store server over a file store, and that store."""
    backend = FileTokenStore(tmp_path / "capture")
    transport = httpx.ASGITransport(app=create_store_app(backend))
    opened = HttpTokenSource(URL, transport=transport)
    yield opened, backend
    await opened.close()
    await backend.close()


async def test_a_file_stores_freeze_carries_the_extras(
    file_source: tuple[HttpTokenSource, FileTokenStore],
) -> None:
    """Over a file store the packed freeze brings every staged call's extras along."""
    source, backend = file_source
    await _written(backend)
    remote, local = await source.freeze(RID), await backend.freeze(RID)
    assert remote.staged == local.staged
    assert remote.staged is not None and remote.staged.extras == {
        "c1": {"routed_experts": [[[3, 4]]]},
        "c2": None,
    }


async def test_a_memory_stores_freeze_leaves_the_extras_to_be_read_apart(
    source: HttpTokenSource, backend: MemoryTokenStore
) -> None:
    """A store whose snapshots are stored without extras sends none: they are fetched apart."""
    await _written(backend)
    staged = (await source.freeze(RID)).staged
    assert staged is not None and staged.extras is None


async def test_the_freeze_asks_for_packed_columns_and_gets_them(
    file_source: tuple[HttpTokenSource, FileTokenStore],
) -> None:
    """`columns=packed`: each snapshot is {record, columns, extras}; plain by default."""
    _, backend = file_source
    await _written(backend)
    transport = httpx.ASGITransport(app=create_store_app(backend))
    path = f"/ng-rollout/{RID}/training-token-capture/freeze"
    async with httpx.AsyncClient(transport=transport, base_url=URL) as client:
        packed = (await client.post(path, params={"columns": "packed"})).json()["snapshots"]
        plain = (await client.post(path)).json()["snapshots"]
        refused = await client.post(path, params={"columns": "zip"})
    assert [set(item) for item in packed] == [{"record", "columns", "extras"}] * 2
    assert all("token_ids_delta" in item and "extras" not in item for item in plain)
    assert refused.status_code == 422 and "columns" in refused.json()["error"]
