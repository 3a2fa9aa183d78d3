"""HttpLineageResolver uses `?tokens=compact` and `known` only where the store advertises them.

The store is httpx.MockTransport behind a capabilities probe
(`tests.support.capabilities`); docs/store-protocol.md#extensions-and-capabilities.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.client.test_cumulative import compact
from tests.support.capabilities import Advertised, advertising
from token_finalizer_client import HttpLineageResolver

pytestmark = pytest.mark.anyio

URL = "http://store.test"
ITEMS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "And tomorrow?"},
]
PLAIN = {
    "status": "resolved",
    "reason": "",
    "match": {
        "model_call_id": "c1",
        "cumulative_token_ids": [1, 2, 3],
        "digest": "e" * 64,
        "prev_len": 3,
    },
}
COMPACT = {
    "status": "resolved",
    "reason": "",
    "match": {"model_call_id": "c1", "digest": "e" * 64, "prev_len": 3, **compact([1, 2, 3])},
}


def _store(features: list[str] | None) -> tuple[Advertised, list[httpx.Request]]:
    """A store answering each resolve in the form it was asked (plain or compact)."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=COMPACT if request.url.params.get("tokens") else PLAIN)

    return advertising(handle, features), seen


def _resolver(store: Advertised) -> HttpLineageResolver:
    return HttpLineageResolver(url=URL, transport=httpx.MockTransport(store))


def _sent(request: httpx.Request) -> tuple[dict[str, str], bool]:
    return dict(request.url.params), "known" in json.loads(request.content)


async def test_a_store_without_capabilities_gets_plain_v1() -> None:
    """No /capabilities (404): no query parameter, no `known`, and the match still resolves."""
    store, seen = _store(None)
    async with _resolver(store) as resolver:
        first = await resolver.resolve("r1", ITEMS)
        await resolver.resolve("r1", ITEMS)
    assert [_sent(request) for request in seen] == [({}, False), ({}, False)]
    assert first.match is not None and first.match.cumulative_token_ids == (1, 2, 3)


async def test_compact_without_known_prefix_sends_no_known() -> None:
    """A store advertising compact_resolve only: compact asked, `known` never named."""
    store, seen = _store(["compact_resolve"])
    async with _resolver(store) as resolver:
        await resolver.resolve("r1", ITEMS)
        await resolver.resolve("r1", ITEMS)
    assert [_sent(request) for request in seen] == [({"tokens": "compact"}, False)] * 2


async def test_known_prefix_without_compact_is_not_used() -> None:
    """`known` needs the compact answer: advertised alone, neither is sent."""
    store, seen = _store(["known_prefix"])
    async with _resolver(store) as resolver:
        await resolver.resolve("r1", ITEMS)
        await resolver.resolve("r1", ITEMS)
    assert [_sent(request) for request in seen] == [({}, False)] * 2


async def test_both_advertised_use_both() -> None:
    """compact_resolve and known_prefix advertised: the second resolve names its known prefix."""
    store, seen = _store(["compact_resolve", "known_prefix"])
    async with _resolver(store) as resolver:
        await resolver.resolve("r1", ITEMS)
        await resolver.resolve("r1", ITEMS)
    assert [_sent(request) for request in seen] == [
        ({"tokens": "compact"}, False),
        ({"tokens": "compact"}, True),
    ]


async def test_a_refused_extension_asks_again_and_resolves_in_v1() -> None:
    """A store replaced by a v1 one (422 to compact): asked again, the resolve sent plain."""
    store, seen = _store(["compact_resolve"])
    async with _resolver(store) as resolver:
        await resolver.resolve("r1", ITEMS)
        store.features = None  # another store took the address

        def older(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            if request.url.params:
                return httpx.Response(422, json={"error": "unknown query parameter"})
            return httpx.Response(200, json=PLAIN)

        store.handler = older
        resolution = await resolver.resolve("r1", ITEMS)
    assert resolution.match is not None and store.probes == 2
    assert [_sent(request) for request in seen[1:]] == [({"tokens": "compact"}, False), ({}, False)]


async def test_a_store_advertising_after_an_upgrade_is_used() -> None:
    """The probe met a store mid-upgrade (503): the next resolve asks again and uses compact."""
    store, seen = _store(["compact_resolve"])
    replies = iter([httpx.Response(503, json={"error": "restarting"})])
    advertise = store.__call__

    def upgrading(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/capabilities":
            return next(replies, None) or advertise(request)
        return advertise(request)

    async with HttpLineageResolver(url=URL, transport=httpx.MockTransport(upgrading)) as resolver:
        await resolver.resolve("r1", ITEMS)
        await resolver.resolve("r1", ITEMS)
    assert [_sent(request)[0] for request in seen] == [{}, {"tokens": "compact"}]


async def test_concurrent_resolves_share_one_probe() -> None:
    """Sixty-four resolves at once on a fresh resolver ask /capabilities once."""
    store, seen = _store(["compact_resolve", "known_prefix"])
    async with _resolver(store) as resolver:
        answers: list[Any] = await asyncio.gather(
            *(resolver.resolve(f"r{index}", ITEMS) for index in range(64))
        )
    assert (store.probes, len(seen), {answer.status for answer in answers}) == (
        1,
        64,
        {"resolved"},
    )
