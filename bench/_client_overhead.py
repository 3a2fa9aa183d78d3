"""The client's own cost per store call: plain vs compact resolve answers, orjson vs stdlib.

A canned store runs in a separate process and answers every request with
one precomputed body (a resolved match of `ids` token ids, plain or compact;
or a stored put), so what is measured is the client: building and sending
the request, reading, decoding and checking the answer. Per variant:

- alone: p50 latency of one resolve at a time;
- at `concurrency` at once (one shared resolver, as a model-server worker):
  p50 / p99 latency;
- client CPU per call, alone and at once: this process's CPU time over the
  calls (the server's CPU is its own process's), the figures that depend
  least on what else the machine runs.

orjson is switched off by the client's own switch (`_json._orjson = None`),
as the tests do. `decode_cost` isolates reading the answer (parse, check,
ids to a tuple), without the network: the part the compact form changes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import multiprocessing
import random
import socket
import statistics
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from tests.support.servers import free_port
from token_finalizer_client import HttpLineageResolver, HttpTokenSink, _json
from token_finalizer_client._resolver import _read_resolution

ITEMS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "And tomorrow?"},
]


def match_ids(count: int) -> list[int]:
    """The token ids of the measured match (the same every run)."""
    rng = random.Random(7)
    return [rng.randrange(150_000) for _ in range(count)]


def _match(ids: list[int], compact: bool) -> dict[str, Any]:
    match: dict[str, Any] = {"model_call_id": "call-049", "digest": "d" * 64, "prev_len": len(ids)}
    if compact:
        data = base64.b64encode(struct.pack(f"<{len(ids)}I", *ids)).decode()
        match["cumulative_tokens"] = {"encoding": "u32le", "length": len(ids), "data": data}
    else:
        match["cumulative_token_ids"] = ids
    return match


def resolve_body(ids: list[int], compact: bool) -> bytes:
    """A resolved answer carrying `ids`, in the plain or the compact form."""
    return orjson.dumps({"status": "resolved", "reason": "", "match": _match(ids, compact)})


async def _serve(port: int, body: bytes) -> None:
    head = (
        f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                request = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in request.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                writer.write(head + body)
                await writer.drain()

    server = await asyncio.start_server(connection, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def _run_server(port: int, body: bytes) -> None:
    asyncio.run(_serve(port, body))


@contextlib.contextmanager
def canned_store(body: bytes) -> Iterator[str]:
    """A process answering `body` to every request on loopback; yields its base URL."""
    port = free_port()
    process = multiprocessing.get_context("fork").Process(
        target=_run_server, args=(port, body), daemon=True
    )
    process.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.join(10)


@dataclass(frozen=True)
class Figures:
    """One variant's latencies and client CPU per call (seconds)."""

    alone_p50: float
    together_p50: float
    together_p99: float
    cpu_alone: float
    cpu_together: float


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def _measure(
    call: Callable[[], Awaitable[Any]], calls: int, concurrency: int, rounds: int
) -> Figures:
    async def timed() -> float:
        start = time.perf_counter()
        await call()
        return time.perf_counter() - start

    await asyncio.gather(*(timed() for _ in range(concurrency)))  # warm the pool
    start = time.process_time()
    alone = [await timed() for _ in range(calls)]
    cpu_alone = (time.process_time() - start) / calls
    start = time.process_time()
    together: list[float] = []
    for _ in range(rounds):
        together += await asyncio.gather(*(timed() for _ in range(concurrency)))
    cpu_together = (time.process_time() - start) / len(together)
    return Figures(
        statistics.median(alone),
        statistics.median(together),
        _percentile(together, 0.99),
        cpu_alone,
        cpu_together,
    )


@contextlib.contextmanager
def _orjson(enabled: bool) -> Iterator[None]:
    saved = _json._orjson
    _json._orjson = saved if enabled else None
    try:
        yield
    finally:
        _json._orjson = saved


def resolve_overhead(
    ids: int, calls: int, concurrency: int, rounds: int
) -> dict[tuple[str, str], Figures]:
    """Figures per (answer form, JSON library) for resolves whose match has `ids` ids."""
    token_ids = match_ids(ids)
    results: dict[tuple[str, str], Figures] = {}
    for form in ("plain", "compact"):
        with canned_store(resolve_body(token_ids, form == "compact")) as url:
            for library in ("orjson", "stdlib"):

                async def run() -> Figures:
                    async with HttpLineageResolver(url=url, timeout=60.0) as resolver:

                        async def one() -> None:
                            resolution = await resolver.resolve("r-1", ITEMS)
                            if resolution.match is None or resolution.match.prev_len != ids:
                                raise RuntimeError(f"the resolve failed: {resolution}")

                        return await _measure(one, calls, concurrency, rounds)

                with _orjson(library == "orjson"):
                    results[form, library] = asyncio.run(run())
    return results


def decode_cost(ids: int, repeats: int) -> dict[tuple[str, str], float]:
    """Seconds to read one resolve answer of `ids` ids (best of `repeats`), per form and library."""
    token_ids = match_ids(ids)
    costs: dict[tuple[str, str], float] = {}
    for form in ("plain", "compact"):
        body = resolve_body(token_ids, form == "compact")
        for library in ("orjson", "stdlib"):
            with _orjson(library == "orjson"):
                best = float("inf")
                for _ in range(repeats):
                    start = time.perf_counter()
                    resolution = _read_resolution(_json.loads(body))
                    best = min(best, time.perf_counter() - start)
                if resolution.match is None or resolution.match.cumulative_token_ids != tuple(
                    token_ids
                ):
                    raise RuntimeError(f"the {form} answer did not decode to its ids")
            costs[form, library] = best
    return costs


def put_overhead(tokens: int, calls: int, concurrency: int, rounds: int) -> dict[str, Figures]:
    """Figures per JSON library for puts of an entry of `tokens` prompt ids."""
    rng = random.Random(11)
    entry = {
        "rollout_id": "r-1",
        "model_call_id": "call-049",
        "prompt_token_ids": [rng.randrange(150_000) for _ in range(tokens)],
        "generation_token_ids": [rng.randrange(150_000) for _ in range(tokens // 5)],
        "generation_log_probs": [-rng.random() * 5 for _ in range(tokens // 5)],
        "parent_call_id": None,
    }
    results: dict[str, Figures] = {}
    with canned_store(b'{"stored": true}') as url:
        for library in ("orjson", "stdlib"):

            async def run() -> Figures:
                async with HttpTokenSink(url=url, timeout=60.0) as sink:
                    return await _measure(lambda: sink.put(entry), calls, concurrency, rounds)

            with _orjson(library == "orjson"):
                results[library] = asyncio.run(run())
    return results
