"""A `redis-server` with little memory, and writers that fill it (docs/capacity.md).

`limited_redis` starts a private server with a small `maxmemory` and the
given `maxmemory-policy`; `fill` writes rollouts of a few calls each through
a store until it refuses one with StoreMemoryFull, and returns the rollouts
it completed.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.redis_processes import RedisProcess, free_ports
from token_finalizer.core.errors import StoreMemoryFull
from token_finalizer.sources.redis import RedisTokenStore

__all__ = ["CALLS_PER_ROLLOUT", "call_entry", "fill", "limited_redis"]

CALLS_PER_ROLLOUT = 4
_PROMPT_TOKENS = 2_000
_MAX_ROLLOUTS = 10_000


@contextlib.contextmanager
def limited_redis(
    directory: Path, *, maxmemory: str = "8mb", policy: str = "noeviction"
) -> Iterator[RedisProcess]:
    """A private redis-server with `maxmemory` and `policy` until the block ends."""
    (port,) = free_ports(1)
    server = RedisProcess(port, directory, ["--maxmemory", maxmemory, "--maxmemory-policy", policy])
    server.start()
    try:
        if not server.answers():
            raise RuntimeError(f"redis-server did not start: {server.log_tail()}")
        yield server
    finally:
        server.kill()


def call_entry(rollout_id: str, index: int, prompt_tokens: int = _PROMPT_TOKENS) -> dict[str, Any]:
    """A full-prompt entry of `prompt_tokens` ids (a few tens of kB in Redis).

    The ids are random 32-bit values: stores keep ids packed and compressed at rest, so
    only ids that do not compress make each entry cost what its count says.
    """
    draw = random.Random(f"{rollout_id}/{index}").getrandbits
    return {
        "schema_version": 1,
        "rollout_id": rollout_id,
        "model_call_id": f"call-{index}",
        "prompt_token_ids": [draw(32) for _ in range(prompt_tokens)],
        "generation_token_ids": [7, 8, 9],
        "generation_log_probs": [-0.5, -0.25, -0.125],
    }


async def fill(store: RedisTokenStore, label: str = "fill") -> list[str]:
    """Write whole rollouts until the store refuses a write; the rollouts written whole."""
    written: list[str] = []
    for number in range(_MAX_ROLLOUTS):
        rollout_id = f"{label}-{number}"
        try:
            for index in range(CALLS_PER_ROLLOUT):
                await store.begin_call(rollout_id, f"call-{index}")
                await store.put(call_entry(rollout_id, index))
        except StoreMemoryFull:
            return written
        written.append(rollout_id)
    raise AssertionError(f"the store took {_MAX_ROLLOUTS} rollouts without refusing one")
