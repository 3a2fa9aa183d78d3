"""bench.load, one client connection: raw keep-alive HTTP/1.1 and finalize-answer decoding.

`read_finalize_answer` is also run in a separate decoder process for the
large answers, so it must stay a plain module-level function.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import orjson
import zstandard

from bench._common import RawResponse, read_response
from bench._load_rss import serving_process

__all__ = ["AnswerSummary", "Connection", "RequestFailed", "read_finalize_answer"]

REQUEST_TIMEOUT_S = 120.0


class RequestFailed(Exception):
    """No HTTP answer; `kind` is "connection" or "timeout"."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class Connection:
    """One keep-alive HTTP/1.1 connection, reopened after a failure or a `Connection: close`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def exchange(self, request: bytes) -> RawResponse:
        """Send one request and read its answer; RequestFailed when none comes."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                if self._streams is None:
                    self._streams = await asyncio.open_connection("127.0.0.1", self.port)
                reader, writer = self._streams
                writer.write(request)
                response = await read_response(reader)
        except TimeoutError:
            await self.close()
            raise RequestFailed("timeout") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            await self.close()
            raise RequestFailed("connection") from None
        if response.headers.get("connection", "").lower() == "close":
            await self.close()
        return response

    def served_by(self, pids: list[int]) -> int | None:
        """Which of the service's processes accepted this connection (None if closed)."""
        if self._streams is None:
            return None
        client_port = self._streams[1].get_extra_info("sockname")[1]
        return serving_process(pids, self.port, client_port)

    async def close(self) -> None:
        if self._streams is not None:
            writer = self._streams[1]
            self._streams = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


@dataclass(frozen=True, slots=True)
class AnswerSummary:
    """What a client needs from a finalize answer: whether to retire, and the retire body."""

    rollout_id: str | None
    retirable: bool
    masked: bool
    retire_body: bytes


def read_finalize_answer(body: bytes, content_encoding: str | None) -> AnswerSummary:
    """Decode a finalize answer and build the retire body the client package would send."""
    if content_encoding == "zstd":
        body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    answer = orjson.loads(body)
    record = answer.get("record") or {}
    # The retire body is the answer's `retire` object, as the client package sends it.
    payload = answer.get("retire")
    return AnswerSummary(
        rollout_id=answer.get("rollout_id"),
        retirable=payload is not None,
        masked=bool(record.get("mask_sample")),
        retire_body=orjson.dumps(payload),
    )
