"""Reading a full-prompt rollout: the compact freeze against the plain one, side by side.

    .venv/bin/python -m bench.compact_freeze [--calls 25 50 100 200] [--rounds 5]

One agent rollout as a NeMo Gym 0.7 model server writes it by default (every
prompt the whole context so far, +400 prompt / +100 generated tokens a turn,
lineage stamped), put into a Redis store (a key prefix of the test Redis) and
a memory store. Then, per size, the medians of interleaved rounds of reading
and parsing it into a snapshot:

- direct Redis: the plain read (the canonical lines expanded, then parsed, as
  every reader did before `compact_freeze`) against the store's freeze (stored
  values read straight into entries);
- http: the `http` source over a store server (in process, httpx's ASGI
  transport) freezing plain (zstd answer of every line) against compact
  (`entries=compact`: packed records in base64).

Printed: milliseconds, the plain/compact ratio, ms per 1k context tokens
(flat when a read is O(context)) and the answer's bytes. Both reads must give
the same entries. See docs/store-protocol.md#compact-freeze.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson

from tests.support.captures import agent_rollout
from tests.support.lineage import stamp_lineage
from tests.support.redis import redis_url, unique_prefix
from token_finalizer import MemoryTokenStore
from token_finalizer.core.entries import Snapshot
from token_finalizer.sources._entries import parse_capture
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server.capabilities import STORE_FEATURES

NEW_TOKENS_PER_TURN = 500  # +400 prompt / +100 generated, as bench/_hotpath_workload.py
GENERATION_SHARE = 0.2
URL = "http://capture-store.bench"


def full_prompt_rollout(rollout_id: str, calls: int) -> list[dict[str, Any]]:
    """A rollout of `calls` full-prompt calls, each resolved to the one before it."""
    entries = agent_rollout(
        rollout_id,
        calls=calls,
        new_tokens_per_turn=NEW_TOKENS_PER_TURN,
        generation_share=GENERATION_SHARE,
    )
    ids = [entry["model_call_id"] for entry in entries]
    parents = {call: (ids[i - 1] if i else None) for i, call in enumerate(ids)}
    return stamp_lineage(entries, parents)


def without_compact_freeze(app: Any) -> Any:
    """The store server advertising every feature but compact_freeze (a plain freeze)."""
    body = orjson.dumps(
        {"protocol": 1, "features": [f for f in STORE_FEATURES if f != "compact_freeze"]}
    )

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/capabilities":
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)

    return wrapped


async def _plain_redis(store: RedisTokenStore, rollout_id: str) -> Snapshot:
    frozen = await store.freeze_lines(rollout_id)
    entries = await asyncio.to_thread(parse_capture, frozen.lines, rollout_id, "bench")
    return Snapshot(rollout_id, entries, frozen.incomplete, frozen.snapshot_id, frozen.version)


def _same(first: Snapshot, second: Snapshot) -> bool:
    return len(first.entries) == len(second.entries) and all(
        a.to_dict(as_lists=True) == b.to_dict(as_lists=True)
        for a, b in zip(first.entries, second.entries, strict=True)
    )


async def _timed(read: Callable[[], Awaitable[Snapshot]]) -> float:
    start = time.perf_counter()
    await read()
    return time.perf_counter() - start


async def _answer_bytes(app: Any, rollout_id: str) -> tuple[int, int, int]:
    """Bytes of the plain answer (identity, zstd) and of the compact answer."""
    path = f"/ng-rollout/{rollout_id}/training-token-capture/freeze"
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=URL) as client:
        plain = await client.post(path, headers={"accept-encoding": "identity"})
        zstd = await client.post(path, headers={"accept-encoding": "zstd"})
        compact = await client.post(path, params={"entries": "compact"})
    zstd_size = int(zstd.headers.get("content-length") or len(zstd.content))
    return len(plain.content), zstd_size, len(compact.content)


async def _size(calls: int, rounds: int, redis_store: RedisTokenStore) -> dict[str, Any]:
    rollout_id = f"compact-{calls}"
    entries = full_prompt_rollout(rollout_id, calls)
    memory = MemoryTokenStore()
    for entry in entries:
        await memory.put(entry)
        await redis_store.put(entry)
    context = len(entries[-1]["prompt_token_ids"]) + len(entries[-1]["generation_token_ids"])
    app = create_store_app(memory)
    compact = HttpTokenSource(URL, transport=httpx.ASGITransport(app=app))
    plain = HttpTokenSource(URL, transport=httpx.ASGITransport(app=without_compact_freeze(app)))
    sides: dict[str, tuple[Callable[[], Awaitable[Snapshot]], Callable[[], Awaitable[Snapshot]]]]
    sides = {
        "redis direct": (
            lambda: _plain_redis(redis_store, rollout_id),
            lambda: redis_store.freeze(rollout_id),
        ),
        "http": (lambda: plain.freeze(rollout_id), lambda: compact.freeze(rollout_id)),
    }
    try:
        results: dict[str, Any] = {"calls": calls, "context": context}
        for name, (plain_read, compact_read) in sides.items():
            if not _same(await plain_read(), await compact_read()):
                raise SystemExit(f"{name}: the compact read differs from the plain one")
            plain_times, compact_times = [], []
            for _ in range(rounds):
                plain_times.append(await _timed(plain_read))
                compact_times.append(await _timed(compact_read))
            results[name] = (statistics.median(plain_times), statistics.median(compact_times))
        results["bytes"] = await _answer_bytes(app, rollout_id)
        return results
    finally:
        await compact.close()
        await plain.close()


def _report(results: list[dict[str, Any]]) -> None:
    print(
        f"{'calls':>5} {'context':>8} {'side':<13} {'plain ms':>9} {'compact ms':>10} "
        f"{'ratio':>6} {'plain ms/1k':>11} {'compact ms/1k':>13}"
    )
    for result in results:
        per_k = result["context"] / 1000
        for side in ("redis direct", "http"):
            plain, compact = result[side]
            print(
                f"{result['calls']:>5} {result['context']:>8} {side:<13} {plain * 1e3:>9.1f} "
                f"{compact * 1e3:>10.1f} {plain / compact:>5.1f}x {plain * 1e3 / per_k:>11.2f} "
                f"{compact * 1e3 / per_k:>13.2f}"
            )
    print()
    print(
        f"{'calls':>5} {'plain answer':>13} {'plain zstd':>11} {'compact':>9} {'zstd/compact':>12}"
    )
    for result in results:
        identity, zstd, compact = result["bytes"]
        print(
            f"{result['calls']:>5} {identity / 1e6:>11.2f}MB {zstd / 1e6:>9.2f}MB "
            f"{compact / 1e6:>7.2f}MB {zstd / compact:>11.1f}x"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[25, 50, 100, 200])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    url = redis_url()
    results = []
    with unique_prefix(url, "bench-compact") as prefix:
        redis_store = RedisTokenStore(url, key_prefix=prefix)
        try:
            for calls in args.calls:
                results.append(await _size(calls, args.rounds, redis_store))
        finally:
            await redis_store.close()
    _report(results)


if __name__ == "__main__":
    asyncio.run(main())
