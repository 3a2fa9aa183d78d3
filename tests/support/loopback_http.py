"""A raw asyncio HTTP/1.1 server on loopback, for test doubles that misbehave on purpose.

`serving(connection)` runs `asyncio.start_server(connection, ...)` on its own event
loop in a background thread and yields the base URL; when the block ends every
connection still open (a hang, a trickle) is cancelled. `read_request` reads one
Content-Length framed request, which is all httpx sends these doubles.
Used by tests/client/hostile_server.py and tests/support/fault_proxy.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager

from tests.support.servers import free_port

__all__ = ["Connection", "read_request", "serving"]

Connection = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.contextmanager
def serving(
    connection: Connection,
    *,
    lifespan: Callable[[], AbstractAsyncContextManager[object]] | None = None,
) -> Iterator[str]:
    """Serve `connection` on 127.0.0.1 inside `lifespan()` (entered on the server's loop)."""
    port = free_port()
    ready = threading.Event()
    stop: list[asyncio.Event] = []
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        async with lifespan() if lifespan is not None else contextlib.nullcontext():
            server = await asyncio.start_server(connection, "127.0.0.1", port)
            stop.append(asyncio.Event())
            ready.set()
            async with server:
                await stop[0].wait()
            # Connections parked mid-answer (a hang, a trickle) end with the server.
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def run() -> None:
        loop.run_until_complete(serve())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)


async def read_request(
    reader: asyncio.StreamReader,
) -> tuple[str, str, dict[str, str], bytes] | None:
    """Method, target, lower-cased headers and body of the next request; None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, target, headers, body
