"""The mask-fraction guard shared through Redis (`guard: {redis: URL}`).

Every worker of every finalizer replica counts into the same totals, so a
run trips on the sum of what all of them finalized, and once tripped it is
refused by all of them. One hash per run, under the configured `key_prefix`:

    <prefix>run:<run id>   HASH   finalized, masked, tripped ("1" once tripped),
                                  reason:<mask reason> -> count

- `observe` is one Lua script (EVALSHA via redis-py's `register_script`):
  it counts the build, decides and sets `tripped`, and pushes the key's
  expiry `run_ttl_s` out, atomically, so two replicas counting the crossing
  pair at the same moment cannot both miss it.
- `check` is one HGETALL before any work: a tripped run is refused there.
- A run's key expires `run_ttl_s` (default 7 days) after its last counted
  finalize: a run nobody finalizes for that long is forgotten, tripped or not,
  and Redis holds only runs that are alive (each key is a few hundred bytes;
  run ids are at most MAX_RUN_ID_LENGTH characters).

**Redis out of reach: fail open.** The guard protects data quality; a
Redis outage must not stop training. Each command is retried like every
Redis call of the service (sources/redis/_retrying.py: slot moves, a
failover, a dropped connection) until `timeout_s` has passed; the counting
script only where it certainly did not run, so nothing is counted twice.
After that the check or count is logged (at most once per `_RETRY_AFTER_S`),
counted in `token_finalizer_guard_unavailable_total{operation}`, and the
finalize goes on unguarded. After a failure the guard leaves Redis alone
for `_RETRY_AFTER_S`, so an unreachable server costs one timeout per
window, not one per call. Counts missed meanwhile are lost, which can only
delay a trip, never cause a wrong one.

The Redis may be a Redis Cluster (`cluster`, seed `urls`; each run's hash is
one key, so one slot), and with `min_replicas_acked` N a count is taken as
done only once N replicas have it (WAIT on the script's own connection);
fewer in time is a failure like any other: fail open.

Every replica must use the same `max_mask_fraction` and
`mask_fraction_min_samples` (they are passed to the script per call): the
decision is taken by whichever replica counts the crossing call, and the
tripped flag is then shared by all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Final

from token_finalizer._constants import (
    DEFAULT_GUARD_KEY_PREFIX,
    DEFAULT_GUARD_RUN_TTL_S,
    DEFAULT_GUARD_TIMEOUT_S,
)
from token_finalizer.core.build import Build
from token_finalizer.core.errors import CaptureError, describe_exception
from token_finalizer.core.redaction import redact, redacted_url
from token_finalizer.core.store_urls import check_key_prefix, check_redis_seeds
from token_finalizer.service.guard import check_run_id, counted_reason, mask_fraction_refusal
from token_finalizer.service.metrics import ServiceMetrics
from token_finalizer.sources.redis import (
    LuaScript,
    RetryingRedis,
    check_cluster_mode,
    evalsha,
    evalsha_then_wait,
    ping_every_primary,
)
from token_finalizer.sources.redis._scripts import script_source

__all__ = ["RedisMaskFractionGuard"]

logger = logging.getLogger(__name__)

# After a Redis failure the guard skips Redis this long (finalizes go on unguarded).
_RETRY_AFTER_S: Final = 5.0

# One finalize counted (sources/redis/scripts/guard_observe.lua, its keys and arguments).
_OBSERVE: Final = LuaScript(script_source("guard_observe"))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(reply: Any) -> dict[str, str]:
    """A hash as str -> str, from HGETALL's mapping or the script's flat list."""
    if isinstance(reply, dict):
        return {_text(k): _text(v) for k, v in reply.items()}
    flat = list(reply)
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


class RedisMaskFractionGuard:
    """RunGuard whose counts and tripped flags live in Redis, shared by every replica."""

    def __init__(
        self,
        url: str | None = None,
        *,
        urls: Sequence[str] | None = None,
        cluster: bool = False,
        min_replicas_acked: int = 0,
        max_mask_fraction: float,
        min_samples: int,
        key_prefix: str = DEFAULT_GUARD_KEY_PREFIX,
        run_ttl_s: float = DEFAULT_GUARD_RUN_TTL_S,
        timeout_s: float = DEFAULT_GUARD_TIMEOUT_S,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        if not 0.0 <= max_mask_fraction <= 1.0:
            raise ValueError(f"max_mask_fraction must be in [0, 1], got {max_mask_fraction!r}")
        if min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {min_samples!r}")
        if not run_ttl_s > 0 or not timeout_s > 0:
            raise ValueError("run_ttl_s and timeout_s must be > 0")
        self.max_mask_fraction = max_mask_fraction
        self.min_samples = min_samples
        self.key_prefix = check_key_prefix(key_prefix)
        self._ttl_ms = max(1, round(run_ttl_s * 1000))
        if min_replicas_acked < 0:
            raise ValueError(f"min_replicas_acked must be >= 0, got {min_replicas_acked!r}")
        self._metrics = metrics
        seeds = check_redis_seeds(list(urls or []) or [url], cluster=cluster)
        self._where = redacted_url(seeds[0]) + (" (cluster)" if cluster else "")
        self._redis = RetryingRedis(
            seeds,
            cluster=cluster,
            timeout_s=timeout_s,
            label="mask-fraction guard redis",
            where=self._where,
        )
        self._replicas = min_replicas_acked
        self._down_until = 0.0
        self._closed = False

    def __repr__(self) -> str:  # never shows a password
        return f"RedisMaskFractionGuard({self._where!r}, key_prefix={self.key_prefix!r})"

    @property
    def enabled(self) -> bool:
        """Always: this guard is only opened when `max_mask_fraction` is configured."""
        return True

    def key(self, run_id: str) -> str:
        """The run's hash (the id's length is checked first)."""
        return f"{self.key_prefix}run:{check_run_id(run_id)}"

    # -- failing open ------------------------------------------------------------------

    def _skipping(self, operation: str) -> bool:
        """True (and counted) while Redis is being left alone after a failure."""
        if self._closed or time.monotonic() < self._down_until:
            self._unguarded(operation)
            return True
        return False

    def _failed(self, operation: str, exc: BaseException) -> None:
        self._down_until = time.monotonic() + _RETRY_AFTER_S
        self._unguarded(operation)
        logger.warning(
            "mask-fraction guard: redis %s unavailable (%s); finalizes go on unguarded "
            "for the next %.0f s",
            self._where,
            redact(f"{operation}: {type(exc).__name__}: {exc}"),
            _RETRY_AFTER_S,
        )

    def _unguarded(self, operation: str) -> None:
        if self._metrics is not None:
            self._metrics.guard_unavailable.labels(operation).inc()

    # -- RunGuard ----------------------------------------------------------------------

    def _refusal(self, run_id: str, fields: dict[str, str]) -> Exception:
        reasons = {
            name.removeprefix("reason:"): int(count)
            for name, count in fields.items()
            if name.startswith("reason:")
        }
        return mask_fraction_refusal(
            run_id,
            self.max_mask_fraction,
            finalized=int(fields.get("finalized", 0)),
            masked=int(fields.get("masked", 0)),
            reasons=reasons,
        )

    async def check(self, run_id: str) -> None:
        """Raise the 409 when any replica tripped this run (one HGETALL)."""
        key = self.key(run_id)
        if self._skipping("check"):
            return
        try:
            reply = await self._redis.call("check", lambda client: client.hgetall(key))
        except CaptureError as exc:
            self._failed("check", exc)
            return
        fields = _fields(reply)
        if fields.get("tripped") == "1":
            raise self._refusal(run_id, fields)

    async def observe(self, run_id: str, build: Build | None) -> None:
        """Count one build into the shared totals; raise the 409 once the run is tripped."""
        if build is None:
            return
        key = self.key(run_id)
        if self._skipping("observe"):
            return
        masked = "1" if build.mask_sample else "0"
        reason = counted_reason(build)
        args: list[str | int] = [
            masked,
            reason,
            self.min_samples,
            repr(self.max_mask_fraction),
            self._ttl_ms,
        ]
        try:
            # Not idempotent (it counts): retried only where it certainly did not run.
            reply = await self._redis.call("observe", self._counting(key, args), idempotent=False)
        except CaptureError as exc:
            self._failed("observe", exc)
            return
        if reply:
            raise self._refusal(run_id, _fields(reply))

    def _counting(self, key: str, args: list[str | int]) -> Any:
        """The step that runs the counting script (and WAITs, with min_replicas_acked)."""
        cluster, replicas = self._redis.cluster, self._replicas
        deadline = asyncio.get_running_loop().time() + self._redis.timeout_s

        async def step(client: Any) -> Any:
            if not replicas:
                return await evalsha(client, _OBSERVE, [key], args, cluster=cluster)
            # The script always writes, so WAIT after it needs no marker key.
            return await evalsha_then_wait(
                client,
                _OBSERVE,
                [key],
                args,
                cluster=cluster,
                replicas=replicas,
                deadline=deadline,
                sync_key=None,
            )

        return step

    async def counts(self, run_id: str) -> dict[str, str]:
        """The run's hash as stored (for operators and tests); empty when unknown."""
        key = self.key(run_id)
        return _fields(await self._redis.call("counts", lambda client: client.hgetall(key)))

    async def ping(self) -> None:
        """Raise StoreNodeUnreachable unless Redis (every primary of a cluster) answers PING."""
        await ping_every_primary(self._redis)

    async def probe(self) -> dict[str, Any]:
        """What /ready reports of the guard's Redis (it never makes /ready fail)."""
        try:
            await self.ping()
        except Exception as exc:
            return {"reachable": False, "error": redact(str(exc) or describe_exception(exc))}
        return {"reachable": True}

    async def check_cluster_mode(self) -> None:
        """ClusterModeRefused when the guard's server, given as one Redis, is a cluster node."""
        await check_cluster_mode(self._redis)

    async def aclose(self) -> None:
        """Close the connection pool; idempotent. A closed guard lets every call through."""
        if self._closed:
            return
        self._closed = True
        await self._redis.aclose()
