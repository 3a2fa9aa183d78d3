"""NeMo Gym 0.7.0's control route on the store server: every case of control_route.json.

The vectors hold what Gym's own route answered (status and body) for each
Authorization header and rollout id, after the same ledger writes; ours must
answer the same, so Gym's RolloutControlClient reads our manifests unchanged
(docs/staging.md#the-control-route).
"""

from __future__ import annotations

from collections.abc import Iterator
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import pytest

from tests.support.asgi import in_process
from tests.support.servers import running_app
from tests.support.staging_stores import row_of_commit
from tests.support.staging_vectors import load_staging_vectors, staging_case_ids, staging_cases
from token_finalizer import MemoryTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server.roles import StoreTokens

VECTORS = load_staging_vectors("control_route.json")
CASES = staging_cases("control_route.json")
TOKEN = VECTORS["auth_token"]


async def _setup(store: MemoryTokenStore) -> None:
    for op in VECTORS["ledger_setup"]:
        if op["op"] == "record":
            commit = op["commit"]
            await store.record_ledger_row(commit["rollout_id"], row_of_commit(commit))
        else:
            await store.record_ledger_failure(op["rollout_id"], op["model_call_id"], op["reason"])


def _served(tokens: StoreTokens) -> Iterator[httpx.Client]:
    store = MemoryTokenStore()
    anyio.run(_setup, store)
    with in_process(create_store_app(store, tokens=tokens)) as client:
        yield client


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """A store server whose control token is the vectors', after the vectors' ledger writes."""
    yield from _served(StoreTokens(writer=("w",), finalizer=("f",), control=(TOKEN,)))


@pytest.mark.parametrize("case", CASES, ids=staging_case_ids(CASES))
def test_the_route_answers_as_gyms(http: httpx.Client, case: dict[str, Any]) -> None:
    """The status and the body are Gym's for this header and id."""
    response = http.get(case["inputs"]["path"], headers=case["inputs"]["headers"])
    expected = case["expected"]
    assert (response.status_code, response.json()) == (expected["status"], expected["body"])


def test_a_finalizer_token_may_read_manifests(http: httpx.Client) -> None:
    """The finalizer's token is accepted too (it reads manifests through its own route anyway)."""
    path = VECTORS["route"].format(rollout_id="rollout-clean-chain")
    assert http.get(path, headers={"Authorization": "Bearer f"}).status_code == 200


def test_a_writer_token_is_refused_in_gyms_shape(http: httpx.Client) -> None:
    """A model server's writer token is not a control token: Gym's 401 body."""
    path = VECTORS["route"].format(rollout_id="rollout-clean-chain")
    response = http.get(path, headers={"Authorization": "Bearer w"})
    assert (response.status_code, response.json()) == (
        401,
        {"detail": "missing or invalid control-plane bearer token"},
    )


def test_the_route_is_absent_without_a_control_token() -> None:
    """Gym requires a token: with writer and finalizer tokens only, the route is not served."""
    path = VECTORS["route"].format(rollout_id="rollout-clean-chain")
    for client in _served(StoreTokens(writer=("w",), finalizer=("f",))):
        assert client.get(path, headers={"Authorization": "Bearer f"}).status_code == 404


def test_a_shared_token_mounts_the_route() -> None:
    """The single --token holds every role, control included."""
    path = VECTORS["route"].format(rollout_id="rollout-clean-chain")
    for client in _served(StoreTokens(shared=("one",))):
        assert client.get(path, headers={"Authorization": "Bearer one"}).status_code == 200


def test_a_trailing_space_after_the_token_is_stripped_by_http() -> None:
    """On a real server a trailing space never reaches the route: 200, as docs/staging.md says."""
    store = MemoryTokenStore()
    anyio.run(_setup, store)
    app = create_store_app(store, tokens=StoreTokens(writer=("w",), control=(TOKEN,)))
    path = VECTORS["route"].format(rollout_id="rollout-clean-chain")
    with running_app(app) as base:
        parts = urlsplit(base)
        connection = HTTPConnection(parts.hostname, parts.port, timeout=10)
        try:
            connection.putrequest("GET", path)
            connection.putheader("Authorization", f"Bearer {TOKEN} ")
            connection.endheaders()
            status = connection.getresponse().status
        finally:
            connection.close()
    documented = (Path(__file__).parents[3] / "docs" / "staging.md").read_text()
    refused = next(line for line in documented.splitlines() if "two spaces" in line)
    assert (status, "trailing space" in refused) == (200, False)
