"""StoreCapabilities: what a store advertises, asked once, shared, forgotten after a refusal.

The rules of docs/store-protocol.md#extensions-and-capabilities, on the
shared piece alone (the clients using it: test_resolver_capabilities.py,
test_staging_sink_capabilities.py, tests/service/sources/test_http_capabilities.py).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from token_finalizer_client._capabilities import StoreCapabilities, features_of

ADVERTISED = b'{"protocol": 1, "features": ["compact_resolve", "packed_stage"]}'


@pytest.mark.parametrize("status", [404, 405])
def test_a_store_without_the_route_has_no_feature(status: int) -> None:
    """404 and 405 (a store that predates /capabilities) advertise nothing, and say so."""
    assert features_of(status, b'{"error": "no such path"}') == frozenset()


def test_a_partial_list_is_exactly_what_is_supported() -> None:
    """A store advertising two features supports those two and no other."""
    capabilities = StoreCapabilities()
    answers = [
        capabilities.supports(name, lambda: (200, ADVERTISED))
        for name in ("compact_resolve", "packed_stage", "known_prefix", "packed_freeze")
    ]
    assert answers == [True, True, False, False]


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"protocol": 2, "features": ["compact_resolve"]}', b'{"protocol": 1}'],
)
def test_an_answer_that_is_not_protocol_1_advertises_nothing(body: bytes) -> None:
    """A 200 that is not `{"protocol": 1, "features": [...]}` means plain v1."""
    assert features_of(200, body) == frozenset()


def test_the_answer_is_kept_one_probe_for_every_call() -> None:
    """Asked once, the answer serves every later call."""
    capabilities = StoreCapabilities()
    for _ in range(5):
        capabilities.supports("compact_resolve", lambda: (200, ADVERTISED))
    assert capabilities.probes == 1


def test_a_probe_without_answer_is_asked_again_next_call() -> None:
    """A 503 (or no answer) is plain v1 for that call, and the next call asks again."""
    capabilities = StoreCapabilities()
    first = capabilities.supports("compact_resolve", lambda: (503, b""))
    second = capabilities.supports("compact_resolve", lambda: (200, ADVERTISED))
    assert (first, second, capabilities.probes) == (False, True, 2)


def test_a_probe_that_raises_is_plain_v1_for_that_call() -> None:
    """A probe that raises does not fail the call: it is answered False, and not kept."""

    def unreachable() -> tuple[int, bytes]:
        raise ConnectionError("refused")

    capabilities = StoreCapabilities()
    assert capabilities.supports("compact_resolve", unreachable) is False
    assert capabilities.known is None


def test_forget_makes_the_next_call_ask_an_upgraded_store() -> None:
    """After forget(), the store is asked again: one that now advertises more is used."""
    capabilities = StoreCapabilities()
    before = capabilities.supports("packed_stage", lambda: (404, b""))
    capabilities.forget()
    after = capabilities.supports("packed_stage", lambda: (200, ADVERTISED))
    assert (before, after, capabilities.probes) == (False, True, 2)


def test_a_kept_answer_expires() -> None:
    """Past its time to live the answer is asked again (a store upgraded in place)."""
    capabilities = StoreCapabilities(ttl_s=0.0)
    capabilities.supports("packed_stage", lambda: (404, b""))
    assert capabilities.supports("packed_stage", lambda: (200, ADVERTISED)) is True


@pytest.mark.anyio
async def test_concurrent_coroutines_share_one_probe() -> None:
    """Fifty coroutines asking at once cause one probe, and all read its answer."""
    capabilities = StoreCapabilities()
    release = asyncio.Event()

    async def probe() -> tuple[int, bytes]:
        await release.wait()
        return 200, ADVERTISED

    waiting = [
        asyncio.ensure_future(capabilities.asupports("compact_resolve", probe)) for _ in range(50)
    ]
    await asyncio.sleep(0)
    release.set()
    assert (await asyncio.gather(*waiting), capabilities.probes) == ([True] * 50, 1)


@pytest.mark.anyio
async def test_a_cancelled_waiter_does_not_cancel_the_probe() -> None:
    """The first caller cancelled mid-probe: the others still get the answer."""
    capabilities = StoreCapabilities()
    release = asyncio.Event()

    async def probe() -> tuple[int, bytes]:
        await release.wait()
        return 200, ADVERTISED

    first = asyncio.ensure_future(capabilities.asupports("compact_resolve", probe))
    second = asyncio.ensure_future(capabilities.asupports("compact_resolve", probe))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert (await second, capabilities.probes) == (True, 1)


def test_concurrent_threads_share_one_probe() -> None:
    """Eight threads asking at once cause one probe, and all read its answer."""
    capabilities = StoreCapabilities()
    started = threading.Barrier(8)
    answers: list[bool] = []

    def probe() -> tuple[int, bytes]:
        threading.Event().wait(0.05)  # the others arrive while it is under way
        return 200, ADVERTISED

    def ask() -> None:
        started.wait()
        answers.append(capabilities.supports("packed_stage", probe))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (answers, capabilities.probes) == ([True] * 8, 1)


def test_each_event_loop_may_probe_without_waiting_for_another() -> None:
    """asyncio.run per call: each loop gets the kept answer, or probes on its own loop."""
    capabilities = StoreCapabilities()

    async def probe() -> tuple[int, bytes]:
        return 200, ADVERTISED

    answers = [asyncio.run(capabilities.asupports("packed_stage", probe)) for _ in range(3)]
    assert (answers, capabilities.probes) == ([True] * 3, 1)
