"""The blocking client's deadline: every socket operation of a try ends by it."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.client.hostile_server import Canned, HostileServer
from token_finalizer_client._deadline import bound_by_deadlines, deadline_scope


def test_a_default_client_is_bound() -> None:
    """httpx's pools are where the wrapper expects them (fails loudly if httpx changes)."""
    with httpx.Client() as client:
        assert bound_by_deadlines(client) is True


def test_binding_twice_wraps_once() -> None:
    """Binding an already bound client changes nothing."""
    with httpx.Client() as client:
        bound_by_deadlines(client)
        pool = client._transport._pool  # type: ignore[attr-defined]
        backend = pool._network_backend
        bound_by_deadlines(client)
        assert pool._network_backend is backend


def test_a_passed_deadline_fails_the_next_read() -> None:
    """Within a scope whose deadline has passed, a request fails with httpx's timeout."""
    server = HostileServer(Canned(200, b"{}", drip_head=True))
    with server.running() as url, httpx.Client(timeout=30.0) as client:
        bound_by_deadlines(client)
        with deadline_scope(time.monotonic() + 0.3), pytest.raises(httpx.TimeoutException):
            client.get(url)


def test_no_deadline_leaves_httpx_timeouts_alone() -> None:
    """Outside any scope, a bound client behaves as httpx does."""
    server = HostileServer(Canned(200, b"{}"))
    with server.running() as url, httpx.Client() as client:
        bound_by_deadlines(client)
        assert client.get(url).content == b"{}"
