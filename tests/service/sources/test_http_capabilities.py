"""The http source asks a freeze extension (`columns=packed`, `entries=compact`) only of
a store advertising it.

The store is respx (docs/store-protocol.md#extensions-and-capabilities).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import respx

from tests.service.sources.test_http import BASE, FREEZE, snapshot_body
from token_finalizer.sources.http import HttpTokenSource

pytestmark = pytest.mark.anyio

ADVERTISED = {"protocol": 1, "features": ["packed_freeze"]}


@pytest.fixture
def store() -> Iterator[respx.MockRouter]:
    """A mocked capture store."""
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


@pytest.fixture
async def source() -> AsyncIterator[HttpTokenSource]:
    """An http source, closed after the test."""
    opened = HttpTokenSource(BASE, max_retries=1)
    yield opened
    await opened.close()


def _params(route: respx.Route) -> list[dict[str, str]]:
    return [dict(call.request.url.params) for call in route.calls]


async def test_a_store_without_capabilities_is_frozen_in_plain_v1(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """/capabilities answers 404: the freeze carries no query parameter."""
    store.get("/capabilities").respond(404, json={"error": "no such path"})
    freeze = store.post(FREEZE).respond(200, json=snapshot_body())
    snapshot = await source.freeze("r1")
    assert (_params(freeze), snapshot.snapshot_id) == ([{}], "snap-1")


async def test_an_advertising_store_gets_packed_columns_asked_once(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """packed_freeze advertised: every freeze asks columns=packed, the store asked once."""
    probe = store.get("/capabilities").respond(200, json=ADVERTISED)
    freeze = store.post(FREEZE).respond(200, json=snapshot_body())
    await source.freeze("r1")
    await source.freeze("r1")
    assert (_params(freeze), probe.call_count) == ([{"columns": "packed"}] * 2, 1)


async def test_a_partial_list_without_packed_freeze_is_plain(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A store advertising other features only: plain freezes."""
    store.get("/capabilities").respond(200, json={"protocol": 1, "features": ["compact_resolve"]})
    freeze = store.post(FREEZE).respond(200, json=snapshot_body())
    await source.freeze("r1")
    assert _params(freeze) == [{}]


async def test_a_refused_packed_freeze_asks_again_and_freezes_plainly(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A 404 to `columns=packed` from a store that stopped advertising it: frozen in v1."""
    store.get("/capabilities").mock(
        side_effect=[
            respx.MockResponse(200, json=ADVERTISED),
            respx.MockResponse(404, json={"error": "no such path"}),
        ]
    )
    freeze = store.post(FREEZE).mock(
        side_effect=lambda request: respx.MockResponse(
            404 if request.url.params else 200,
            json={"error": "no such path"} if request.url.params else snapshot_body(),
        )
    )
    snapshot = await source.freeze("r1")
    assert (_params(freeze), snapshot.version) == ([{"columns": "packed"}, {}], 3)


async def test_a_store_upgraded_later_is_asked_again_after_a_refusal(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """The probe met a restarting store (503): the next freeze asks again and packs."""
    store.get("/capabilities").mock(
        side_effect=[
            respx.MockResponse(503, json={"error": "restarting"}),
            respx.MockResponse(200, json=ADVERTISED),
        ]
    )
    freeze = store.post(FREEZE).respond(200, json=snapshot_body())
    await source.freeze("r1")
    await source.freeze("r1")
    assert _params(freeze) == [{}, {"columns": "packed"}]


async def test_compact_freeze_advertised_asks_entries_compact(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """compact_freeze advertised: the freeze asks entries=compact beside columns=packed."""
    features = ["packed_freeze", "compact_freeze"]
    store.get("/capabilities").respond(200, json={"protocol": 1, "features": features})
    freeze = store.post(FREEZE).respond(200, json=snapshot_body())
    await source.freeze("r1")
    assert _params(freeze) == [{"columns": "packed", "entries": "compact"}]


async def test_a_refused_compact_freeze_freezes_with_what_is_still_advertised(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A 422 to `entries=compact` from a store now advertising packed_freeze only: the
    freeze goes again with `columns=packed` alone."""
    store.get("/capabilities").mock(
        side_effect=[
            respx.MockResponse(
                200, json={"protocol": 1, "features": ["packed_freeze", "compact_freeze"]}
            ),
            respx.MockResponse(200, json=ADVERTISED),
        ]
    )
    freeze = store.post(FREEZE).mock(
        side_effect=lambda request: respx.MockResponse(
            422 if "entries" in request.url.params else 200,
            json={"error": "entries: unknown"}
            if "entries" in request.url.params
            else snapshot_body(),
        )
    )
    snapshot = await source.freeze("r1")
    assert (_params(freeze), snapshot.version) == (
        [{"columns": "packed", "entries": "compact"}, {"columns": "packed"}],
        3,
    )
