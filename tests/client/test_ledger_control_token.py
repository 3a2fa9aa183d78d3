"""`HttpCaptureLedger(control_token=...)`: manifests read through NeMo Gym's control route.

A Gym model server holds a writer token (its ledger writes) and serves Gym's
own control route over `ledger.manifest`; a writer token cannot read
manifests (the finalizer role), so the ledger reads them through the store
server's control route with the control token (docs/staging.md#the-client).
Against the real store server on loopback.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.support.servers import running_app
from tests.support.staging_vectors import case_by_name
from token_finalizer import MemoryTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server.roles import StoreTokens
from token_finalizer_client import (
    AuthenticationError,
    HttpCaptureLedger,
    PermissionDeniedError,
)

pytestmark = pytest.mark.anyio

WRITER, FINALIZER, CONTROL = "writer-token", "finalizer-token", "control-token"
RECORD_CHAIN = case_by_name("ledger.json", "record_chain")
COMMITS = [op["commit"] for op in RECORD_CHAIN["inputs"]["ops"] if op["op"] == "record"]


@pytest.fixture(scope="module")
def store_url() -> Iterator[str]:
    """A store server with a writer, a finalizer and a control token."""
    tokens = StoreTokens(writer=(WRITER,), finalizer=(FINALIZER,), control=(CONTROL,))
    with running_app(create_store_app(MemoryTokenStore(), tokens=tokens)) as url:
        yield url


@pytest.fixture
async def model_server(store_url: str) -> AsyncIterator[HttpCaptureLedger]:
    """A model server's ledger: the writer token, and the control token for manifests."""
    ledger = HttpCaptureLedger(store_url, token=WRITER, control_token=CONTROL)
    yield ledger
    await ledger.close()


async def _recorded(ledger: HttpCaptureLedger) -> str:
    """A fresh rollout holding ledger.json's record_chain commits; its id."""
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    for commit in copy.deepcopy(COMMITS):
        commit["rollout_id"] = rollout_id
        commit["record"]["staging_key"] = f"{rollout_id}/{commit['record']['model_call_id']}"
        commit["staging_chain"] = [
            f"{rollout_id}/{k.split('/')[1]}" for k in commit["staging_chain"]
        ]
        await ledger.record(commit)
    return rollout_id


async def _manifest(url: str, rollout_id: str, **tokens: Any) -> dict[str, Any]:
    ledger = HttpCaptureLedger(url, **tokens)
    try:
        return await ledger.manifest(rollout_id)
    finally:
        await ledger.close()


async def test_the_control_token_reads_the_manifest(
    model_server: HttpCaptureLedger, store_url: str
) -> None:
    """Writer + control token: the manifest is the one the finalizer role reads."""
    rollout_id = await _recorded(model_server)
    assert await model_server.manifest(rollout_id) == await _manifest(
        store_url, rollout_id, token=FINALIZER
    )


async def test_the_writer_token_alone_cannot_read_manifests(
    model_server: HttpCaptureLedger, store_url: str
) -> None:
    """Without a control token, a writer's manifest read is refused (403: the finalizer role)."""
    rollout_id = await _recorded(model_server)
    with pytest.raises(PermissionDeniedError):
        await _manifest(store_url, rollout_id, token=WRITER)


async def test_a_wrong_control_token_is_refused(store_url: str) -> None:
    """Another control token: the control route's 401."""
    with pytest.raises(AuthenticationError):
        await _manifest(store_url, "r-1", token=WRITER, control_token="not-it")


async def test_an_unknown_rollout_has_an_empty_manifest(model_server: HttpCaptureLedger) -> None:
    """Through the control route too, a rollout without rows has empty lists."""
    manifest = await model_server.manifest("never-written")
    assert (manifest["records"], manifest["failures"]) == ([], [])


async def test_a_bad_rollout_id_is_a_value_error(model_server: HttpCaptureLedger) -> None:
    """An id outside the store id rule raises ValueError (Gym's protocol) before sending."""
    with pytest.raises(ValueError, match="rollout_id"):
        await model_server.manifest("../etc")


def test_an_empty_control_token_is_refused() -> None:
    """An empty control token is a configuration mistake, said at construction."""
    with pytest.raises(ValueError, match="control_token is empty"):
        HttpCaptureLedger("http://store.test", token=WRITER, control_token="")


def test_the_control_token_is_never_shown() -> None:
    """The ledger's repr names neither token."""
    ledger = HttpCaptureLedger("http://store.test", token=WRITER, control_token=CONTROL)
    assert CONTROL not in repr(ledger) and WRITER not in repr(ledger)
