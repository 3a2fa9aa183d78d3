"""A resolve naming a known prefix: the compact answer carries only the ids after it.

docs/store-protocol.md#known-prefix. The store server, in-process over a
memory and a file store, answers raw requests; the prefix counts only when
its digest is the token digest of the match's leading ids.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.gym_calls import two_turns
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.core.token_digest import token_digest
from token_finalizer.store_server import create_store_app
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    context_digests,
)

pytestmark = pytest.mark.anyio

BASE = "http://store.test"
RESOLVE = "/ng-rollout/r1/training-token-capture/lineage/resolve"
FIRST = [101, 102, 103, 201, 202]
WHOLE = [*FIRST, 301, 302, 401]


@dataclass
class Store:
    """A raw client of a store server holding rollout r1, and the items of r1's next request."""

    client: httpx.AsyncClient
    items: list[dict[str, Any]]

    async def resolve(self, known: Any, form: str = "compact") -> httpx.Response:
        body = {
            "fingerprint_version": FINGERPRINT_VERSION,
            "fingerprint": assistant_fingerprint(self.items),
            "context_digests": context_digests(self.items),
            "known": known,
        }
        return await self.client.post(f"{RESOLVE}?tokens={form}", json=body)

    async def tokens(self, known: Any) -> dict[str, Any]:
        answer = await self.resolve(known)
        assert answer.status_code == 200, answer.text
        tokens: dict[str, Any] = answer.json()["match"]["cumulative_tokens"]
        return tokens


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """r1 holds two calls, the second a delta after the first (cumulative ids `WHOLE`)."""
    opened = MemoryTokenStore() if request.param == "memory" else FileTokenStore(tmp_path / "c")
    talk, first, second = two_turns()
    await opened.put(first)
    await opened.put(second)
    transport = httpx.ASGITransport(app=create_store_app(opened))
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
        yield Store(client, talk.items)


def _ids(tokens: dict[str, Any]) -> list[int]:
    return np.frombuffer(base64.b64decode(tokens["data"]), dtype="<u4").tolist()


async def test_a_known_prefix_is_not_sent_again(store: Store) -> None:
    """Naming the first call's ids gets `offset` 5 and only the three ids after them."""
    tokens = await store.tokens({"length": len(FIRST), "digest": token_digest(FIRST)})
    assert (tokens["offset"], tokens["length"], _ids(tokens)) == (5, 3, WHOLE[5:])


async def test_an_empty_known_prefix_gets_every_id_after_offset_zero(store: Store) -> None:
    """Length 0 with the empty sequence's digest is a prefix of anything: offset 0, all ids."""
    tokens = await store.tokens({"length": 0, "digest": token_digest([])})
    assert (tokens["offset"], _ids(tokens)) == (0, WHOLE)


async def test_a_prefix_whose_digest_differs_gets_the_whole_ids(store: Store) -> None:
    """A digest that is not the match's leading ids' gets the whole ids and no offset."""
    tokens = await store.tokens({"length": len(FIRST), "digest": token_digest([9, 9, 9, 9, 9])})
    assert "offset" not in tokens and _ids(tokens) == WHOLE


async def test_a_prefix_longer_than_the_match_gets_the_whole_ids(store: Store) -> None:
    """A known length past the match's ids is no prefix of it."""
    longer = [*WHOLE, 7]
    tokens = await store.tokens({"length": len(longer), "digest": token_digest(longer)})
    assert "offset" not in tokens and _ids(tokens) == WHOLE


async def test_the_plain_form_ignores_a_known_prefix(store: Store) -> None:
    """Only the compact form is shortened: the plain list stays whole."""
    answer = await store.resolve({"length": len(FIRST), "digest": token_digest(FIRST)}, "plain")
    assert answer.json()["match"]["cumulative_token_ids"] == WHOLE


@pytest.mark.parametrize(
    ("known", "named"),
    [
        ("abc", "known.length"),
        ({"length": -1, "digest": "a" * 64}, "known.length"),
        ({"length": True, "digest": "a" * 64}, "known.length"),
        ({"length": "5", "digest": "a" * 64}, "known.length"),
        ({"length": 5}, "known.digest"),
        ({"length": 5, "digest": "A" * 64}, "known.digest"),
        ({"length": 5, "digest": "a" * 63}, "known.digest"),
    ],
    ids=["not-object", "negative", "bool", "string-length", "no-digest", "uppercase", "short"],
)
async def test_a_malformed_known_prefix_is_422(store: Store, known: Any, named: str) -> None:
    """A `known` that is not {length >= 0, 64-hex digest} is refused, naming the field."""
    answer = await store.resolve(known)
    assert answer.status_code == 422 and named in answer.json()["error"]
