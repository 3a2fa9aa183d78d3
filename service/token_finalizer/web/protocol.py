"""The HTTP/1.1 protocol both servers run under uvicorn: h11, with deadlines on what clients send.

uvicorn closes a keep-alive connection that stays idle, but it gives a client
all the time in the world to send a request head: one byte a second keeps a
connection, and its file descriptor, open forever, and a few hundred such
clients exhaust the process's open files so that not even /health is
accepted any more. `DeadlineH11Protocol` is uvicorn's h11 protocol plus:

- **a request-head deadline**: from the moment a connection is made (or, on a
  kept-alive connection, from the first byte after a response) the client has
  REQUEST_HEAD_TIMEOUT_S to deliver a whole request line and headers;
  otherwise it is answered 408 and closed. Once a head has arrived the app
  owns the connection: a body is bounded by web/body.py's deadline, the
  answer by the app. After the answer the clock runs again, so a body the
  app never read must also finish arriving in time;
- **a connection cap** (uvicorn's `limit_concurrency`, sized together with the
  listen backlog to fit the open-file limit, web/deadlines.py): when it is
  reached, a new connection displaces the connection that has waited longest
  for its client (an idle keep-alive connection or a stalled request head),
  so a probe still gets in while hundreds of stalled clients are connected.
  A connection that finds every slot busy with a request is closed; a
  request arriving at the cap is answered 503 by uvicorn.

`server_options()` is what every `uvicorn.run` of the project passes; it
runs the server on uvloop when it is installed (a Linux and macOS dependency
of the service): the event loop's own work per request (socket reads and
writes, callbacks, timers) is a large part of a small request's cost, and
uvloop does it in C (docs/architecture.md#round-trips). A server that runs
its own loop (`store serve`) starts it with `event_loop_factory()`.
"""

from __future__ import annotations

import asyncio
import importlib
import weakref
from collections.abc import Callable
from typing import Any

import h11
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from token_finalizer._constants import REQUEST_HEAD_TIMEOUT_S, SERVER_KEEPALIVE_S
from token_finalizer.web.deadlines import check_deadlines, connection_limits, request_head_timeout_s

__all__ = ["DeadlineH11Protocol", "event_loop_factory", "server_options"]

# Per server: the connections waiting for their client, longest-waiting first
# (a dict keeps insertion order; a connection is re-inserted when it starts waiting).
_WAITING: weakref.WeakKeyDictionary[ServerState, dict[DeadlineH11Protocol, None]] = (
    weakref.WeakKeyDictionary()
)


def _waiting_connections(server_state: ServerState) -> dict[DeadlineH11Protocol, None]:
    waiting = _WAITING.get(server_state)
    if waiting is None:
        waiting = _WAITING[server_state] = {}
    return waiting


def _head_timeout_answer(seconds: float) -> bytes:
    body = orjson.dumps(
        {"error": f"the request line and headers did not arrive within {seconds:g} s"}
    )
    head = (
        "HTTP/1.1 408 Request Timeout\r\n"
        "content-type: application/json\r\n"
        "connection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline and a displacing connection cap."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        try:
            self.head_timeout_s = request_head_timeout_s()
        except ValueError:  # the CLI refuses to start with it; an embedding gets the default
            self.head_timeout_s = REQUEST_HEAD_TIMEOUT_S
        self._head_timer: asyncio.TimerHandle | None = None
        self._waiting = _waiting_connections(server_state)

    # -- uvicorn's protocol interface ---------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_waiting()
        self._arm_head_deadline()
        self._make_room()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:
            # A whole request head arrived: the app has the connection now.
            self._stop_waiting()
        elif (
            self._awaiting_client() and self._head_timer is None and not self.transport.is_closing()
        ):
            # The first bytes after a response (uvicorn stopped its keep-alive
            # timer): the next head, or the rest of a body the app never read.
            self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request at once
        if self._awaiting_client():
            self._start_waiting()  # idle: uvicorn's keep-alive timer runs until a byte comes
        else:
            self._stop_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._stop_waiting()  # another protocol takes the transport over
        super().handle_websocket_upgrade(event)

    # -- deadline and cap -------------------------------------------------------------------

    def _awaiting_client(self) -> bool:
        """No request is with the app: the connection waits for the client to send."""
        return self.cycle is None or self.cycle.response_complete

    def _start_waiting(self) -> None:
        self._waiting.pop(self, None)
        self._waiting[self] = None

    def _stop_waiting(self) -> None:
        self._waiting.pop(self, None)
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _arm_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_deadline_passed)

    def _head_deadline_passed(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE:
            # Nothing of a request was parsed yet: tell the client why it is cut off.
            self.transport.write(_head_timeout_answer(self.head_timeout_s))
        self._close()

    def _close(self) -> None:
        """Close now, and stop counting this connection against the cap at once."""
        self._stop_waiting()
        self.connections.discard(self)
        self.transport.close()

    def _make_room(self) -> None:
        limit = self.limit_concurrency
        if limit is None or len(self.connections) < limit:
            return
        oldest = next((waiting for waiting in self._waiting if waiting is not self), None)
        if oldest is not None:
            oldest._close()
        if len(self.connections) > limit:  # every other connection is busy with a request
            self._close()


def server_options() -> dict[str, Any]:
    """The `uvicorn.run`/`uvicorn.Config` options of every server of the project.

    ValueError (naming the variable) when a deadline override in the
    environment is invalid.
    """
    check_deadlines()
    limit, backlog = connection_limits()
    return {
        "http": DeadlineH11Protocol,
        "limit_concurrency": limit,
        "backlog": backlog,
        "timeout_keep_alive": SERVER_KEEPALIVE_S,
        # uvloop when installed, else asyncio's loop (uvicorn's "auto").
        "loop": "auto",
    }


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop factory when uvloop is installed, else None (asyncio's default).

    For `asyncio.Runner(loop_factory=...)` of a server that starts its loop
    itself: the same choice as `server_options()`'s `"loop": "auto"`.
    """
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
