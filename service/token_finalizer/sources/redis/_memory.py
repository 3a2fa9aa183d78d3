"""Redis's memory as the capture store sees it: one reading, a short cache, and the rules.

- `read_memory(redis)`: `INFO memory stats` of the server (of every primary of
  a cluster): used bytes, `maxmemory`, the eviction policy, `evicted_keys`. A
  cluster answers with its fullest primary (rollouts spread evenly over the
  slots, and the first primary to fill refuses writes), the first primary
  whose policy may evict, and the evictions of every primary summed.
- `MemoryWatch`: the store's view of it. At start (`refuse_eviction`) a
  policy other than `noeviction` is refused unless allowed, and the evictions
  so far are remembered; before each write that adds capture data
  (`check_room`) the last reading, at most REDIS_MEMORY_CHECK_INTERVAL_S old,
  decides whether it is above the high-water mark (507 at once, no round trip
  spent on the write); /health reads it afresh (`health`).

See docs/capacity.md and docs/store-protocol.md#capacity.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Final

from token_finalizer._constants import REDIS_MEMORY_CHECK_INTERVAL_S, REDIS_PING_TIMEOUT_S
from token_finalizer.core.errors import CaptureError, EvictionPolicyRefused, StoreMemoryFull
from token_finalizer.sources.redis._retrying import RetryingRedis

__all__ = ["MemoryReading", "MemoryWatch", "read_memory"]

SAFE_POLICY: Final = "noeviction"
MEMORY_FULL: Final = "memory_full"
CAPTURES_EVICTED: Final = "captures_evicted"
EVICTION_POLICY: Final = "eviction_policy"


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """One reading of a Redis store's memory (metrics read these fields too).

    `used` and `max` are bytes (`max` 0: no `maxmemory`, so no mark applies);
    `high_water` is the store's mark as a fraction of `max` (None: no mark);
    `evicted_keys` counts since the Redis server started; `node` is the
    `host:port` the figures come from.
    """

    used: int
    max: int
    high_water: float | None
    policy: str
    evicted_keys: int
    node: str

    @property
    def fraction(self) -> float | None:
        """`used / max`; None without `maxmemory`."""
        return self.used / self.max if self.max > 0 else None

    @property
    def above_mark(self) -> bool:
        """True when writes that add capture data are refused."""
        fraction = self.fraction
        return fraction is not None and self.high_water is not None and fraction >= self.high_water

    def to_dict(self) -> dict[str, Any]:
        """`{"used", "max", "fraction", "high_water"}`, as /health and a 507 show them."""
        fraction = self.fraction
        return {
            "used": self.used,
            "max": self.max,
            "fraction": None if fraction is None else round(fraction, 4),
            "high_water": self.high_water if self.max > 0 else None,
        }


def _as_int(value: object) -> int:
    return int(value) if isinstance(value, int | float | str) and str(value).isdigit() else 0


def _fields(reply: Any, node_name: str) -> dict[str, Any]:
    """The parsed INFO of one node (redis-py may wrap it in {node name: fields})."""
    if isinstance(reply, dict) and node_name in reply and isinstance(reply[node_name], dict):
        return dict(reply[node_name])
    return dict(reply) if isinstance(reply, dict) else {}


def _policy(fields: dict[str, Any]) -> str:
    policy = fields.get("maxmemory_policy", "")
    return policy.decode() if isinstance(policy, bytes) else str(policy)


async def _info(client: Any, node: Any = None) -> Any:
    if node is None:
        return await client.execute_command("INFO", "memory", "stats")
    return await client.execute_command("INFO", "memory", "stats", target_nodes=node)


async def read_memory(redis: RetryingRedis, high_water: float | None) -> MemoryReading:
    """One reading of the server (every primary of a cluster), retried until the deadline."""
    if not redis.cluster:
        reply = await redis.call("reading memory", _info)
        fields = _fields(reply, redis.node)
        return MemoryReading(
            used=_as_int(fields.get("used_memory")),
            max=_as_int(fields.get("maxmemory")),
            high_water=high_water,
            policy=_policy(fields),
            evicted_keys=_as_int(fields.get("evicted_keys")),
            node=redis.node,
        )

    async def every_primary(client: Any) -> list[tuple[str, dict[str, Any]]]:
        nodes = client.get_primaries()
        replies = await asyncio.gather(*(_info(client, node) for node in nodes))
        return [
            (node.name, _fields(reply, node.name))
            for node, reply in zip(nodes, replies, strict=True)
        ]

    answers = sorted(await redis.call("reading memory of every primary", every_primary))
    readings = [
        MemoryReading(
            used=_as_int(fields.get("used_memory")),
            max=_as_int(fields.get("maxmemory")),
            high_water=high_water,
            policy=_policy(fields),
            evicted_keys=_as_int(fields.get("evicted_keys")),
            node=name,
        )
        for name, fields in answers
    ]
    fullest = max(readings, key=lambda r: -1.0 if r.fraction is None else r.fraction)
    evicting = next((r for r in readings if r.policy != SAFE_POLICY), fullest)
    return MemoryReading(
        used=fullest.used,
        max=fullest.max,
        high_water=high_water,
        policy=evicting.policy,
        evicted_keys=sum(r.evicted_keys for r in readings),
        node=evicting.node if evicting.policy != SAFE_POLICY else fullest.node,
    )


def _percent(value: float) -> str:
    return f"{value:.1%}"


class MemoryWatch:
    """A redis store's memory: refused policies at start, the mark before writes, /health.

    `high_water` is a fraction of `maxmemory` in (0, 1] (None: never refuse a
    write for memory); `allow_eviction` accepts an evicting policy (the
    operator's documented choice; /health still turns 503 on evictions).
    """

    def __init__(
        self,
        redis: RetryingRedis,
        *,
        high_water: float | None,
        allow_eviction: bool,
        interval_s: float = REDIS_MEMORY_CHECK_INTERVAL_S,
    ) -> None:
        valid = isinstance(high_water, int | float) and 0 < high_water <= 1
        if high_water is not None and not valid:
            raise ValueError(f"memory_high_water must be in (0, 1] or None, got {high_water!r}")
        self._redis = redis
        self.high_water = None if high_water is None else float(high_water)
        self.allow_eviction = allow_eviction
        self._interval_s = interval_s
        self._last: MemoryReading | None = None
        self._read_at = -math.inf
        self._lock = asyncio.Lock()
        # evicted_keys when this process first read it: growth from there is ours to report.
        self.evicted_at_start: int | None = None

    @property
    def last(self) -> MemoryReading | None:
        """The latest reading, if any (what metrics export)."""
        return self._last

    async def read(self) -> MemoryReading:
        """A fresh reading, remembered (the first one sets the evictions baseline)."""
        reading = await read_memory(self._redis, self.high_water)
        if self.evicted_at_start is None or reading.evicted_keys < self.evicted_at_start:
            # First reading, or a Redis that restarted since (its counters start again).
            self.evicted_at_start = reading.evicted_keys
        self._last = reading
        self._read_at = asyncio.get_running_loop().time()
        return reading

    async def _recent(self) -> MemoryReading | None:
        """The last reading if young enough, else a new one; None when Redis does not say."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._read_at < self._interval_s:
            return self._last
        async with self._lock:
            if loop.time() - self._read_at < self._interval_s:
                return self._last  # another writer read it meanwhile
            try:
                async with asyncio.timeout(REDIS_PING_TIMEOUT_S):
                    return await self.read()
            except (CaptureError, TimeoutError):
                # The write itself will say what is wrong; no writer waits on this again soon.
                self._read_at = loop.time()
                return self._last

    def full_error(self, what: str, reading: MemoryReading | None) -> StoreMemoryFull:
        """The 507 of a refused write, naming the memory (when known)."""
        where = f"redis store {self._redis.where}"
        if reading is None or reading.fraction is None:
            return StoreMemoryFull(
                f"{where}: {what} refused: Redis is out of memory (OOM at maxmemory); "
                "freeze and retire rollouts to free it (docs/capacity.md)",
                None if reading is None else reading.to_dict(),
            )
        mark = reading.high_water
        above = f"above the high-water mark {_percent(mark)}" if mark is not None else "full"
        return StoreMemoryFull(
            f"{where}: {what} refused: node {reading.node} uses {reading.used} of "
            f"{reading.max} bytes ({_percent(reading.fraction or 0.0)}), {above}; freeze "
            "and retire rollouts to free it, or give Redis more memory (docs/capacity.md)",
            reading.to_dict(),
        )

    async def check_room(self, what: str) -> None:
        """Raise StoreMemoryFull when the store is above its mark (by a recent reading)."""
        if self.high_water is None:
            return
        reading = await self._recent()
        if reading is not None and reading.above_mark:
            raise self.full_error(what, reading)

    async def memory_full(self, what: str) -> StoreMemoryFull:
        """The error for Redis's own OOM refusal, with the freshest reading that can be had."""
        try:
            async with asyncio.timeout(REDIS_PING_TIMEOUT_S):
                reading: MemoryReading | None = await self.read()
        except (CaptureError, TimeoutError):
            reading = self._last
        return self.full_error(what, reading)

    async def refuse_eviction(self) -> MemoryReading:
        """Read the memory; EvictionPolicyRefused for a policy that may evict, unless allowed."""
        reading = await self.read()
        if reading.policy != SAFE_POLICY and not self.allow_eviction:
            raise EvictionPolicyRefused(
                f"redis store {self._redis.where}: node {reading.node} has maxmemory-policy "
                f"{reading.policy!r}, which may evict capture keys (tombstones included); "
                f"run `CONFIG SET maxmemory-policy {SAFE_POLICY}` (a managed Redis: set it in "
                "its parameter group), or accept the risk with --allow-eviction / "
                "allow_eviction: true (docs/capacity.md#eviction)"
            )
        return reading

    def verdict(self, reading: MemoryReading) -> str | None:
        """`captures_evicted`, `eviction_policy` (an evicting policy set since the start, not
        allowed), `memory_full`, or None (healthy), for /health and /ready."""
        if self.evicted_at_start is not None and reading.evicted_keys > self.evicted_at_start:
            return CAPTURES_EVICTED
        if reading.policy != SAFE_POLICY and not self.allow_eviction:
            return EVICTION_POLICY
        if reading.above_mark:
            return MEMORY_FULL
        return None
