"""In-process clients of ASGI apps, for unit tests that need no socket.

`in_process(app)` yields a plain `httpx.Client` whose transport hands each
request to the app through `httpx.ASGITransport`, on one event loop running in
a helper thread (an anyio blocking portal). The app's lifespan runs around the
block exactly as under uvicorn: sources are opened at start-up, closed at
shutdown. There is no port and nothing to wait for before the first request.

(Starlette's TestClient does the same, but on the installed Starlette its
httpx-based client is deprecated in favour of the `httpx2` package.)

What an in-process client cannot show (a raw socket's bytes, a chunked body
arriving piece by piece, many connections at once, signals) is tested against
a real server from `tests.support.servers`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal

__all__ = ["BASE_URL", "in_process", "send_exactly"]

BASE_URL = "http://testserver"


class _Lifespan:
    """Drives an app's ASGI lifespan: startup before the first request, shutdown after the last."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._to_app = anyio.create_memory_object_stream[dict[str, Any]](math.inf)
        self._from_app = anyio.create_memory_object_stream[dict[str, Any]](math.inf)

    async def run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}}
        try:
            await self._app(scope, self._to_app[1].receive, self._from_app[0].send)
        except BaseException as exc:  # reported to whoever waits for the app's next answer
            self._from_app[0].send_nowait({"type": "lifespan.crashed", "error": exc})
            raise

    async def _exchange(self, event: str) -> None:
        await self._to_app[0].send({"type": f"lifespan.{event}"})
        answer = await self._from_app[1].receive()
        if answer["type"] == "lifespan.crashed":
            raise RuntimeError(f"the app's lifespan raised at {event}") from answer["error"]
        if answer["type"] != f"lifespan.{event}.complete":
            raise RuntimeError(f"lifespan {event} failed: {answer.get('message', answer)}")

    async def startup(self) -> None:
        await self._exchange("startup")

    async def shutdown(self) -> None:
        await self._exchange("shutdown")


class _PortalTransport(httpx.BaseTransport):
    """A sync transport: each request goes to the app over httpx.ASGITransport on the portal."""

    def __init__(self, app: Any, portal: BlockingPortal) -> None:
        self._asgi = httpx.ASGITransport(app=app)
        self._portal = portal

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # the body as one byte stream, usable from the event loop too

        async def call() -> tuple[int, list[tuple[bytes, bytes]], bytes]:
            response = await self._asgi.handle_async_request(request)
            assert isinstance(response.stream, httpx.AsyncByteStream)
            body = b"".join([chunk async for chunk in response.stream])
            return response.status_code, response.headers.raw, body

        status, headers, body = self._portal.call(call)
        # The body as the app sent it: the client decodes Content-Encoding itself.
        return httpx.Response(status, headers=headers, stream=httpx.ByteStream(body))


@contextlib.contextmanager
def in_process(app: Any) -> Iterator[httpx.Client]:
    """An httpx client of `app` called in-process; the app's lifespan runs for the block.

    Exceptions the app does not handle are raised in the test rather than
    hidden behind a 500.
    """
    with start_blocking_portal() as portal:
        lifespan = _Lifespan(app)
        task = portal.start_task_soon(lifespan.run)
        portal.call(lifespan.startup)
        try:
            transport = _PortalTransport(app, portal)
            with httpx.Client(transport=transport, base_url=BASE_URL) as client:
                yield client
        finally:
            portal.call(lifespan.shutdown)
            task.result(timeout=30)


def send_exactly(client: httpx.Client, method: str, path: str) -> httpx.Response:
    """Send `path` to the app with its bytes unchanged; fail if the client rewrote it.

    httpx keeps percent-escapes as written but removes literal `.` and `..`
    segments: paths with those need a raw socket against a real server.
    """
    response = client.request(method, path)
    sent = response.request.url.raw_path
    assert sent == path.encode(), f"the client rewrote {path!r} to {sent!r}"
    return response
