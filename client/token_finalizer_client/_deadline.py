"""One deadline for a blocking try's whole exchange: connect, send, the head and every byte after.

httpx's timeouts bound each socket operation, not their sum: a server that
sends two bytes a second never lets a read wait long, and holds a blocking
call for as long as it likes, its status line and headers included. The
asyncio clients wrap each try in `asyncio.timeout`; a blocking client has no
such scope, so its connection pools get a network backend whose every
connect, read and write waits at most until the deadline of the try running
in this thread (`deadline_scope`), and fails with httpx's own timeout error
past it (docs/architecture.md#bounded-answers).

httpx does not let a caller choose the network backend of its default
transports; `bound_by_deadlines` wraps the backend of each pool a client
already has. It relies on two attributes of httpx and httpcore (the
transport's `_pool`, the pool's `_network_backend`) and reports whether it
found them: without them the blocking client still checks the deadline
between the chunks of an answer's body.
"""

from __future__ import annotations

import contextlib
import contextvars
import ssl
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpcore
import httpx

__all__ = ["bound_by_deadlines", "deadline_scope", "past_deadline"]

# The monotonic deadline of the try this thread (or task) is running; None: no deadline.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "token_finalizer_client_deadline", default=None
)


@contextlib.contextmanager
def deadline_scope(deadline: float | None) -> Iterator[None]:
    """Every network operation of this thread ends by `deadline` (time.monotonic) in the block."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def past_deadline(deadline: float | None) -> bool:
    """Whether `deadline` (time.monotonic; None: none) has passed."""
    return deadline is not None and time.monotonic() >= deadline


def _remaining(timeout: float | None, error: type[httpcore.TimeoutException]) -> float | None:
    """`timeout` cut to what is left of the current deadline; `error` once nothing is."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the try's whole exchange took longer than its timeout")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation ends by the current deadline."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _remaining(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _remaining(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        wait = _remaining(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, wait))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """Opens connections that end each operation by the current deadline."""

    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        wait = _remaining(timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, wait, local_address, socket_options)
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        wait = _remaining(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._backend.connect_unix_socket(path, wait, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def bound_by_deadlines(client: httpx.Client) -> bool:
    """Make each pool of `client` honour `deadline_scope`; False when one could not be reached."""
    transports = [client._transport, *client._mounts.values()]
    reached = True
    for transport in transports:
        if transport is None:  # a mount that disables a proxy for some URLs
            continue
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if isinstance(backend, httpcore.NetworkBackend):
            if not isinstance(backend, _DeadlineBackend):
                pool._network_backend = _DeadlineBackend(backend)  # type: ignore[union-attr]
        elif isinstance(transport, httpx.HTTPTransport):
            reached = False  # httpx changed: the body's deadline checks remain
    return reached
