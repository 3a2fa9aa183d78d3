"""The retry layer of the redis store and guard (sources/redis/_retrying.py), on stand-in clients.

What a retry cures is retried until the deadline and then raised as
StoreUnreachable (503, never a masked record); what it cannot cure is
raised at once; anything the Redis client raises that is not a Redis error
(`AttributeError ... writelines` from a connection closed under a running
call) is one of the former, and the client is replaced. The same layer over
real servers: tests/integration/test_redis_cluster_*.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    MovedError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.support.asgi import in_process
from tests.support.captures import make_entry, record_for
from token_finalizer.api import create_app
from token_finalizer.core.errors import SourceUnavailable, StoreUnreachable
from token_finalizer.settings import settings_from_mapping
from token_finalizer.sources.redis import RedisTokenStore, RetryingRedis, _retrying

pytestmark = pytest.mark.anyio

DEADLINE_S = 0.5
CLOSED_UNDER_US = "'NoneType' object has no attribute 'writelines'"


class StandIn:
    """A client whose evalsha raises the queued errors first, then answers `reply`."""

    def __init__(self, *errors: BaseException, reply: Any = None) -> None:
        self.errors = list(errors)
        self.reply = reply
        self.calls = 0
        self.closed = False

    async def evalsha(self, *args: Any) -> Any:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.reply

    async def aclose(self) -> None:
        self.closed = True


def _store(client: StandIn) -> RedisTokenStore:
    return RedisTokenStore(client=client, key_prefix="t:", timeout_s=DEADLINE_S)


async def test_an_error_that_is_not_a_redis_error_ends_as_unreachable() -> None:
    """AttributeError on every try: StoreUnreachable after the deadline, never the raw error."""
    client = StandIn(*[AttributeError(CLOSED_UNDER_US)] * 1000)
    with pytest.raises(StoreUnreachable, match="writelines"):
        await _store(client).drop("r1", snapshot_id="s", version=1)
    assert client.calls > 1


async def test_passing_failures_are_retried_until_one_succeeds() -> None:
    """MOVED, CLUSTERDOWN and a lost connection, then an answer: the caller sees the answer."""
    client = StandIn(
        MovedError("3999 127.0.0.1:7001"),
        ClusterDownError("The cluster is down"),
        RedisConnectionError("Connection closed by server."),
        reply=1,
    )
    assert await _store(client).drop("r1", snapshot_id="s", version=1) is True
    assert client.calls == 4


async def test_a_request_redis_refuses_is_not_retried() -> None:
    """A script error fails the same way again: SourceUnavailable at once."""
    client = StandIn(ResponseError("Error running script (call to f_1): @user_script:1: boom"))
    with pytest.raises(SourceUnavailable) as failure:
        await _store(client).drop("r1", snapshot_id="s", version=1)
    assert not isinstance(failure.value, StoreUnreachable) and client.calls == 1


async def test_refused_credentials_are_unreachable_at_once() -> None:
    """WRONGPASS: the store cannot be used (503), and repeating it would not help."""
    client = StandIn(AuthenticationError("invalid username-password pair"))
    with pytest.raises(StoreUnreachable, match="refused"):
        await _store(client).drop("r1", snapshot_id="s", version=1)
    assert client.calls == 1


async def test_busy_script_replies_are_passing() -> None:
    """BUSY (another script is running) has no class of its own in redis-py, and passes."""
    client = StandIn(ResponseError("BUSY Redis is busy running a script."), reply=1)
    assert await _store(client).drop("r1", snapshot_id="s", version=1) is True


def _caller(client: StandIn) -> RetryingRedis:
    return RetryingRedis(
        [], cluster=False, timeout_s=DEADLINE_S, label="test", where="stand-in", client=client
    )


async def test_a_counting_call_is_not_repeated_when_it_may_have_run() -> None:
    """idempotent=False: after a lost connection it may have run once; not retried."""
    client = StandIn(RedisConnectionError("Connection reset by peer"), reply="ok")
    with pytest.raises(StoreUnreachable):
        await _caller(client).call("count", lambda c: c.evalsha(), idempotent=False)
    assert client.calls == 1


async def test_a_counting_call_is_repeated_when_it_certainly_did_not_run() -> None:
    """idempotent=False: a MOVED answer means it did not run; retried."""
    client = StandIn(MovedError("3999 127.0.0.1:7001"), reply="ok")
    assert await _caller(client).call("count", lambda c: c.evalsha(), idempotent=False) == "ok"


async def test_a_confused_client_of_ours_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that raises AttributeError is replaced by a fresh one, which answers."""
    broken, fresh = StandIn(AttributeError(CLOSED_UNDER_US)), StandIn(reply="ok")
    built = iter([broken, fresh])
    monkeypatch.setattr(_retrying, "new_client", lambda *args, **kwargs: next(built))
    caller = RetryingRedis(
        ["redis://127.0.0.1:1/0"], cluster=False, timeout_s=5, label="test", where="here"
    )
    try:
        assert await caller.call("op", lambda c: c.evalsha()) == "ok"
        assert (caller.replaced, caller.client) == (1, fresh)
    finally:
        await caller.aclose()
    assert broken.closed and fresh.closed


def _finalize_through(client: StandIn) -> Callable[[], Any]:
    settings = settings_from_mapping({"sources": {"local": {"kind": "memory"}}}, env={})
    app = create_app(settings, sources={"shared": _store(client)})

    def finalize() -> Any:
        with in_process(app) as http:
            return http.post("/finalize", params={"source": "shared"}, json=record_for("r1"))

    return finalize


def test_finalize_over_a_confused_client_is_503_not_500() -> None:
    """The redis source's non-Redis error reaches the harness as 503 + Retry-After."""
    answer = _finalize_through(StandIn(*[AttributeError(CLOSED_UNDER_US)] * 1000))()
    assert answer.status_code == 503 and "retry-after" in answer.headers


def test_finalize_while_a_slot_answers_moved_is_503_not_masked() -> None:
    """MOVED until the deadline (a node that does not serve the slot): 503, not freeze_failed."""
    answer = _finalize_through(StandIn(*[MovedError("3999 127.0.0.1:7001")] * 1000))()
    assert answer.status_code == 503, answer.text


async def test_a_put_through_the_layer_stores_once_it_answers() -> None:
    """A put whose first try met a lost connection is stored by the retry."""
    client = StandIn(RedisConnectionError("Connection closed by server."), reply=[b"new", 1, b"e1"])
    await _store(client).put(make_entry("r1", "c1", [1], [2]))
    assert client.calls == 2
