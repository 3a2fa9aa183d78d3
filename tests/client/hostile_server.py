"""A hostile HTTP server on loopback: canned answers, trickled byte by byte or bombed.

The client tests point a real client at it to show what a broken or hostile
server (a capture store, a finalizer) can and cannot do to the client. It
speaks just enough HTTP/1.1 for httpx: it reads each request (Content-Length
bodies), records it, and writes the answer the test chose, optionally
trickling the head or the body a few bytes at a time.

    server = HostileServer(Canned(200, body, drip_body=True))
    with server.running() as url:
        ...
    server.requests  # ["POST /ng-rollout/r1/...", ...]

Several answers are given in turn, the last one to every request after them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from tests.support.loopback_http import read_request, serving

__all__ = ["Canned", "HostileServer"]

# A trickle: this many bytes, then this long a pause (a few bytes a second).
DRIP_BYTES = 2
DRIP_PAUSE_S = 0.25


@dataclass(frozen=True)
class Canned:
    """One answer, given to every request."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    drip_head: bool = False  # the status line and headers a few bytes at a time
    drip_body: bool = False  # the body a few bytes at a time

    def head(self) -> bytes:
        lines = [f"HTTP/1.1 {self.status} X", f"content-length: {len(self.body)}"]
        lines += [f"{name}: {value}" for name, value in self.headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()


class HostileServer:
    """Serve the answers on 127.0.0.1 while `running()`; `requests` lists what it received."""

    def __init__(self, *answers: Canned) -> None:
        self.answers: Sequence[Canned] = answers or (Canned(),)
        self.requests: list[str] = []

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        """Yield the base URL; every connection is cut when the block ends."""
        with serving(self._connection) as url:
            yield url

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await read_request(reader)) is not None:
                method, target, _, _ = request
                answer = self.answers[min(len(self.requests), len(self.answers) - 1)]
                self.requests.append(f"{method} {target}")
                await self._write(writer, answer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client hung up, or the server stops (mid-trickle)
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _write(self, writer: asyncio.StreamWriter, answer: Canned) -> None:
        for part, drip in ((answer.head(), answer.drip_head), (answer.body, answer.drip_body)):
            if not drip:
                writer.write(part)
                await writer.drain()
                continue
            for start in range(0, len(part), DRIP_BYTES):
                writer.write(part[start : start + DRIP_BYTES])
                await writer.drain()
                await asyncio.sleep(DRIP_PAUSE_S)
