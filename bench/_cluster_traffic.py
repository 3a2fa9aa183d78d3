"""bench.cluster_faults, the traffic: the capture store's kind of Redis calls, and their record.

Each of `tasks` coroutines loops over a shared population of rollouts and,
per rollout, runs what the redis store runs: a Lua script over the rollout's
six hash-tagged keys (EVALSHA through `register_script`), a plain HSET, now
and then a read-only script, a DEL of all six keys, and (one task) a SCAN of
every primary. Every call is timed and its outcome (None, or the exception
that escaped) recorded with the moment it ended, so a report can say which
exceptions came out, how often, and when.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bench._cluster_recipes import NotAcknowledged, script_then_wait

__all__ = [
    "KEY_PARTS",
    "PUT_SCRIPT",
    "READ_SCRIPT",
    "Call",
    "Outcomes",
    "Runner",
    "rollout_keys",
    "run_traffic",
]

KEY_PARTS = ("state", "entries", "digests", "order", "intents", "incomplete")

# A put as the store does it: every one of the six keys is written in one
# script, so a slot whose keys are half migrated answers TRYAGAIN.
PUT_SCRIPT = """
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('RPUSH', KEYS[4], ARGV[1])
redis.call('LTRIM', KEYS[4], -20, -1)
redis.call('SADD', KEYS[5], ARGV[1])
redis.call('SADD', KEYS[6], 'none')
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'updated_at', t[1])
return {'new', version}
"""

# A freeze-like read: the ids in order, then each stored line.
READ_SCRIPT = """
local ids = redis.call('LRANGE', KEYS[4], 0, -1)
local lines = {}
for i = 1, #ids do lines[i] = redis.call('HGET', KEYS[2], ids[i]) or '' end
return {redis.call('HGET', KEYS[1], 'version') or '0', lines}
"""

WAIT_MS = 500
_SCAN_EVERY = 200  # ops of task 0 between two SCAN passes
_DELETE_EVERY = 16
_READ_EVERY = 4
_DIGITS = re.compile(r"\d+")
_ADDRESS = re.compile(r"\d+\.\d+\.\d+\.\d+:\d+")


def rollout_keys(prefix: str, rollout_id: str) -> list[str]:
    """The six keys of one rollout, sharing its hash tag."""
    return [f"{prefix}{{ng:{rollout_id}}}:{part}" for part in KEY_PARTS]


def shape(exc: BaseException) -> str:
    """An exception as `Type: message` with addresses and numbers generalised."""
    text = _ADDRESS.sub("HOST:PORT", str(exc).splitlines()[0] if str(exc) else "")
    return f"{type(exc).__name__}: {_DIGITS.sub('N', text)[:110]}"


@dataclass(frozen=True, slots=True)
class Call:
    """One timed call: when it ended (monotonic), how long it took, what escaped."""

    op: str
    ended: float
    seconds: float
    error: str | None


@dataclass
class Outcomes:
    """Every call of a run, in the order they ended."""

    calls: list[Call] = field(default_factory=list)

    def errors(self) -> Counter[str]:
        """`(operation) Type: message` -> how many calls ended so."""
        return Counter(f"({call.op}) {call.error}" for call in self.calls if call.error)

    def failed(self) -> list[Call]:
        return [call for call in self.calls if call.error]

    def longest_gap(self, since: float) -> float:
        """The longest time after `since` without one successful call ending."""
        ends = sorted(call.ended for call in self.calls if not call.error and call.ended >= since)
        if not ends:
            return float("nan")
        points = [since, *ends]
        return max(b - a for a, b in itertools.pairwise(points))


# `Runner(op_name, call)` runs one operation however the mode under study
# wants (raw, or through a retrying caller) and returns its result.
Runner = Callable[[str, Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


async def _timed(
    outcomes: Outcomes, op: str, runner: Runner, call: Callable[[Any], Awaitable[Any]]
) -> None:
    started = time.monotonic()
    error: str | None = None
    try:
        await runner(op, call)
    except Exception as exc:  # the point: record whatever escapes
        error = shape(exc)
    ended = time.monotonic()
    outcomes.calls.append(Call(op, ended, ended - started, error))


async def _task(
    number: int,
    runner: Runner,
    scripts: dict[str, Any],
    prefix: str,
    population: int,
    stop: asyncio.Event,
    outcomes: Outcomes,
    wait_replicas: int,
) -> None:
    picker = random.Random(number)
    count = 0
    while not stop.is_set():
        count += 1
        rollout = f"r{picker.randrange(population)}"
        keys = rollout_keys(prefix, rollout)
        call_id = f"c{count}-{number}"

        async def put(client: Any, keys: list[str] = keys, call_id: str = call_id) -> Any:
            args = [call_id, "x" * 64, "d"]
            if not wait_replicas:
                return await scripts["put"](keys=keys, args=args, client=client)
            reply, acks = await script_then_wait(
                client, scripts["put"], keys, args, replicas=wait_replicas, timeout_ms=WAIT_MS
            )
            if acks < wait_replicas:
                raise NotAcknowledged(f"{acks} of {wait_replicas} replicas within {WAIT_MS} ms")
            return reply

        await _timed(outcomes, "evalsha put", runner, put)

        async def touch(client: Any, key: str = keys[0], count: int = count) -> Any:
            return await client.hset(key, "touched", str(count))

        await _timed(outcomes, "hset", runner, touch)
        if count % _READ_EVERY == 0:

            async def read(client: Any, keys: list[str] = keys) -> Any:
                return await scripts["read"](keys=keys, args=[], client=client)

            await _timed(outcomes, "evalsha read", runner, read)
        if count % _DELETE_EVERY == 0:

            async def delete(client: Any, keys: list[str] = keys) -> Any:
                return await client.delete(*keys)

            await _timed(outcomes, "del", runner, delete)
        if number == 0 and count % _SCAN_EVERY == 0:

            async def scan(client: Any) -> Any:
                return [key async for key in client.scan_iter(match=f"{prefix}*:state", count=1000)]

            await _timed(outcomes, "scan", runner, scan)


async def run_traffic(
    runner: Runner,
    scripts: dict[str, Any],
    *,
    prefix: str,
    tasks: int,
    population: int,
    stop: asyncio.Event,
    wait_replicas: int = 0,
) -> Outcomes:
    """Drive `tasks` coroutines until `stop` is set; every call's outcome.

    With `wait_replicas`, every put is followed by WAIT on its connection and
    fails with NotAcknowledged when fewer replicas had it in time.
    """
    outcomes = Outcomes()
    await asyncio.gather(
        *(
            _task(number, runner, scripts, prefix, population, stop, outcomes, wait_replicas)
            for number in range(tasks)
        )
    )
    return outcomes
