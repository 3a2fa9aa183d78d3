"""Request-time lineage resolution through `store serve`: file store vs redis store.

    .venv/bin/python -m bench.resolve [--rollouts 64] [--calls 50] [--new-tokens 500] [--rounds 5]

64 rollouts are committed as a NeMo Gym 0.7 model server commits them (50
calls each, every turn adding `--new-tokens` tokens to the context), once with
`delta_records` (each resolved call stores only its new prompt tokens) and
once with full prompts (the 0.7 default). Each layout is served by
`token-finalizer store serve` over a capture directory and over Redis (a
separate process on loopback). Then 64 asyncio tasks, one per rollout, each
stand for a model call arriving at turn 51: they resolve their rollout's next
request through one shared `HttpLineageResolver` (as one model-server worker
would), all at once, `--rounds` times. Every resolve must find the last call
with its full cumulative ids. Printed: the p50 of a resolve alone (one at a
time), then at 64 concurrent: p50 / p99 / max latency of one resolve, and
resolves per second. The client, the server and Redis share the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.gym_calls import Conversation
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.servers import free_port, running_process
from token_finalizer import FileTokenStore
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer_client import HttpLineageResolver

Rollout = tuple[Conversation, list[dict[str, Any]]]


def _rollouts(count: int, calls: int, new_tokens: int, delta: bool) -> list[Rollout]:
    """`count` conversations of `calls` committed calls each, with their entries."""
    rng = random.Random(7)
    rollouts = []
    for index in range(count):
        talk = Conversation(f"bench-resolve-{index:03d}")
        entries = []
        parent = None
        for turn in range(calls):
            call_id = f"call-{turn:03d}"
            generation = [rng.randrange(150_000) for _ in range(new_tokens // 4)]
            prompt = [rng.randrange(150_000) for _ in range(new_tokens - len(generation))]
            entries.append(
                talk.call(
                    call_id,
                    f"turn {turn} of rollout {index}",
                    new_prompt=prompt,
                    generation=generation,
                    parent_call_id=parent,
                    delta=delta and parent is not None,
                    then=f"tool output {turn}",
                )
            )
            parent = call_id
        rollouts.append((talk, entries))
    return rollouts


async def _commit(store: Any, rollouts: list[Rollout]) -> None:
    for _, entries in rollouts:
        for entry in entries:
            await store.put(entry)
    await store.close()


@contextlib.contextmanager
def _served(backend: str, rollouts: list[Rollout], redis_url: str) -> Iterator[str]:
    """`store serve` over the committed rollouts; yields its base URL."""
    port = free_port()
    serve = ["store", "serve", "--port", str(port)]
    if backend == "file":
        with tempfile.TemporaryDirectory() as directory:
            asyncio.run(_commit(FileTokenStore(Path(directory)), rollouts))
            with running_process([*serve, "--dir", directory], port=port):
                yield f"http://127.0.0.1:{port}"
        return
    with unique_prefix(redis_url, "bench-resolve") as prefix:
        asyncio.run(_commit(RedisTokenStore(redis_url, key_prefix=prefix), rollouts))
        with running_process([*serve, "--redis", redis_url, "--key-prefix", prefix], port=port):
            yield f"http://127.0.0.1:{port}"


async def _measure(
    url: str, rollouts: list[Rollout], rounds: int
) -> tuple[list[float], list[float], float]:
    """Resolve latencies (s): each rollout alone, then all at once `rounds` times; their wall time.

    A warm-up round first opens the connections, uncounted.
    """
    alone: list[float] = []
    together: list[float] = []
    wall = 0.0
    async with HttpLineageResolver(url=url, timeout=60.0) as resolver:

        async def one(talk: Conversation) -> float:
            last = f"call-{len(talk.cumulative) - 1:03d}"
            start = time.perf_counter()
            resolution = await resolver.resolve(talk.rollout_id, talk.items)
            elapsed = time.perf_counter() - start
            match = resolution.match
            if match is None or match.model_call_id != last:
                raise RuntimeError(f"{talk.rollout_id} did not resolve: {resolution}")
            if list(match.cumulative_token_ids) != talk.cumulative[last]:
                raise RuntimeError(f"{talk.rollout_id} resolved with the wrong token ids")
            return elapsed

        await asyncio.gather(*(one(talk) for talk, _ in rollouts))
        for talk, _ in rollouts:
            alone.append(await one(talk))
        for _ in range(rounds):
            start = time.perf_counter()
            together.extend(await asyncio.gather(*(one(talk) for talk, _ in rollouts)))
            wall += time.perf_counter() - start
    return alone, together, wall


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=64, help="concurrent model calls")
    parser.add_argument("--calls", type=int, default=50, help="committed calls per rollout")
    parser.add_argument("--new-tokens", type=int, default=500, help="context growth per turn")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds")
    args = parser.parse_args()
    redis_url = find_redis_url()
    print(
        f"{args.rollouts} concurrent resolves, each over a rollout of {args.calls} committed "
        f"calls (+{args.new_tokens} tokens per turn; the match carries "
        f"{args.calls * args.new_tokens:,} token ids); {args.rounds} rounds"
    )
    print(
        f"{'layout':<13} {'backend':<7} {'alone p50':>9} | {'p50 ms':>7} {'p99 ms':>7} "
        f"{'max ms':>7} {'res/s':>6}"
    )
    for delta in (True, False):
        rollouts = _rollouts(args.rollouts, args.calls, args.new_tokens, delta)
        for backend in ("file", "redis"):
            with _served(backend, rollouts, redis_url) as url:
                alone, together, wall = asyncio.run(_measure(url, rollouts, args.rounds))
            layout = "delta" if delta else "full prompts"
            print(
                f"{layout:<13} {backend:<7} {1000 * statistics.median(alone):>9.1f} | "
                f"{1000 * statistics.median(together):>7.1f} "
                f"{1000 * _percentile(together, 0.99):>7.1f} {1000 * max(together):>7.1f} "
                f"{len(together) / wall:>6.0f}"
            )


if __name__ == "__main__":
    main()
