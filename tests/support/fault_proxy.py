"""A fault-injecting HTTP proxy for loopback integration tests.

Sits between the finalizer and a real capture-store server and, per request,
forwards faithfully or injects one fault: never answer, reset the connection
mid-body, answer a status, answer garbage, or rewrite the upstream's JSON.
It speaks just enough HTTP/1.1 (Content-Length bodies, keep-alive) for httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from tests.support.loopback_http import read_request, serving

__all__ = ["Fault", "FaultProxy"]

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Fault:
    """What the proxy does with the next requests (`times` None: every request)."""

    kind: str = "pass"  # pass | hang | reset | status | garbage | rewrite
    status: int = 500
    times: int | None = None
    rewrite: Callable[[Any], Any] | None = None
    seen: int = field(default=0, init=False)

    def applies(self) -> bool:
        self.seen += 1
        return self.kind != "pass" and (self.times is None or self.seen <= self.times)


class FaultProxy:
    """Run with `with FaultProxy(upstream).running() as url:`; set `.fault` at any time."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.fault = Fault()
        self.requests: list[str] = []

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        with serving(self._connection, lifespan=self._upstream_client) as url:
            yield url

    @contextlib.asynccontextmanager
    async def _upstream_client(self) -> AsyncIterator[None]:
        async with httpx.AsyncClient(timeout=30.0) as client:
            self._client = client
            yield

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await read_request(reader)) is not None:
                method, path, headers, body = request
                self.requests.append(f"{method} {path}")
                if not await self._answer(writer, method, path, headers, body):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer(
        self,
        writer: asyncio.StreamWriter,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
    ) -> bool:
        """Answer one request; False when the connection must end."""
        fault = self.fault
        injecting = fault.applies()
        if injecting and fault.kind == "hang":
            await asyncio.sleep(3600)
            return False
        if injecting and fault.kind == "status":
            _write(writer, fault.status, orjson.dumps({"error": f"injected {fault.status}"}))
            await writer.drain()
            return True
        if injecting and fault.kind == "garbage":
            _write(writer, 200, b"<html>this is not json</html>")
            await writer.drain()
            return True
        forwarded = {k: v for k, v in headers.items() if k not in _HOP_BY_HOP}
        forwarded["accept-encoding"] = "identity"
        upstream = await self._client.request(
            method, self.upstream + path, content=body, headers=forwarded
        )
        payload = upstream.content
        if injecting and fault.kind == "rewrite" and fault.rewrite is not None:
            payload = orjson.dumps(fault.rewrite(orjson.loads(payload)))
        if injecting and fault.kind == "reset":
            _write(writer, upstream.status_code, payload, body_limit=len(payload) // 2)
            await writer.drain()
            sock = writer.get_extra_info("socket")
            # SO_LINGER 0 turns the close into a TCP reset instead of a clean FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        _write(writer, upstream.status_code, payload)
        await writer.drain()
        return True


def _write(
    writer: asyncio.StreamWriter, status: int, body: bytes, *, body_limit: int | None = None
) -> None:
    head = (
        f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: keep-alive\r\n\r\n"
    )
    writer.write(head.encode() + (body if body_limit is None else body[:body_limit]))
