"""The hot-path bench's timing loop, the same for every side (standard library only).

A side is what a NeMo Gym 0.7 model server holds: a lineage resolver, a token
sink with `begin_call`, and the writer's entry stamping. For every model call
of every rollout, all rollouts at once, the driver does what 0.7's capture
middleware does around a generation:

    resolve(rollout, request items) -> begin_call(rollout, call) -> [generate]
    -> stamp the entry (lineage, fingerprints, cum_len, digest, delta prompt) -> put(entry)

and times the three store operations. Stamping is the model server's own work,
the same on every side, so it is left out of "capture work". Every resolve is
checked (status, parent id, cumulative ids) outside the timed span: a side
that resolves wrongly fails the bench instead of looking fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from bench._hotpath_workload import ModelCall, RolloutScript, Workload

__all__ = ["CallScope", "CaptureSide", "SideSamples", "run_side"]

# What a model call's work runs within: the model server's own request span when the
# bench traces (bench/_hotpath_tracing.py), else nothing. Entered before the timed
# span and left after it: the caller's span is the model server's cost, not ours.
CallScope = Callable[[], contextlib.AbstractContextManager[object]]


def _no_scope() -> contextlib.AbstractContextManager[object]:
    return contextlib.nullcontext()


class CaptureSide(Protocol):
    """A model server's capture endpoints: Gym's in-process file store, or our store over HTTP."""

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> Any:
        """A LineageResolution-shaped answer: `.status`, `.match.model_call_id`, ..."""

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None: ...

    def entry(self, call: ModelCall, resolution: Any, delta: bool) -> Any:
        """The entry the writer puts: stamped with the resolution, a delta prompt if asked."""

    async def put(self, entry: Any) -> None: ...


@dataclass
class SideSamples:
    """Latencies in milliseconds; one capture sample per model call, `turns[i]` its turn."""

    capture: list[float] = field(default_factory=list)
    resolve: list[float] = field(default_factory=list)
    begin: list[float] = field(default_factory=list)
    put: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    alone: list[float] = field(default_factory=list)
    burst: list[float] = field(default_factory=list)
    capture_wall_s: float = 0.0
    # CPU seconds the capture phase took: this process's (the client's, all its threads)
    # and the store server's, where the side can tell (`server_cpu_s`); NaN otherwise.
    client_cpu_s: float = float("nan")
    server_cpu_s: float = float("nan")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SideSamples:
        return cls(**data)


def _status(resolution: Any) -> str:
    return str(getattr(resolution.status, "value", resolution.status))


def _check(resolution: Any, rollout_id: str, parent: str | None, cumulative: Sequence[int]) -> None:
    """Raise unless `resolution` names `parent` (None: a root) with exactly `cumulative`."""
    status = _status(resolution)
    if parent is None:
        if status != "root":
            raise RuntimeError(f"{rollout_id}: the first call resolved {status}, not root")
        return
    match = resolution.match
    if status != "resolved" or match is None or match.model_call_id != parent:
        reason = getattr(resolution, "reason", "")
        raise RuntimeError(
            f"{rollout_id}: expected {parent}, got {status} {reason!r} {match!r:.80}"
        )
    if list(match.cumulative_token_ids) != list(cumulative):
        raise RuntimeError(f"{rollout_id}: {parent} resolved with the wrong cumulative token ids")


def _ms(start: float, end: float) -> float:
    return 1000.0 * (end - start)


async def _write_rollout(
    side: CaptureSide, script: RolloutScript, samples: SideSamples, scope: CallScope
) -> None:
    delta = script.workload.delta
    for _ in range(script.workload.calls):
        call = script.next_call()
        with scope():
            start = time.perf_counter()
            resolution = await side.resolve(call.rollout_id, call.request_items)
            resolved = time.perf_counter()
            await side.begin_call(call.rollout_id, call.model_call_id)
            begun = time.perf_counter()
            _check(resolution, call.rollout_id, call.parent_call_id, call.parent_cumulative)
            entry = side.entry(call, resolution, delta)
            writing = time.perf_counter()
            await side.put(entry)
            written = time.perf_counter()
        samples.resolve.append(_ms(start, resolved))
        samples.begin.append(_ms(resolved, begun))
        samples.put.append(_ms(writing, written))
        samples.capture.append(_ms(start, begun) + _ms(writing, written))
        samples.turns.append(call.turn)


async def _resolve_next(side: CaptureSide, script: RolloutScript, scope: CallScope) -> float:
    """Resolve the request the rollout's next call would send; its latency (ms), checked."""
    items = script.request()
    with scope():
        start = time.perf_counter()
        resolution = await side.resolve(script.rollout_id, items)
        elapsed = _ms(start, time.perf_counter())
    _check(resolution, script.rollout_id, script.last_call_id, script.cumulative)
    return elapsed


async def run_side(
    side: CaptureSide, workload: Workload, *, burst_rounds: int, scope: CallScope = _no_scope
) -> SideSamples:
    """Capture every rollout at once, then resolve alone, then resolve in bursts.

    Alone: each rollout's next request in turn, nothing else running (the
    first resolve after its last put, as a real next call would see it).
    Burst: all rollouts' next requests at once, `burst_rounds` times.
    Each model call (and each next request) runs within `scope()`.
    """
    scripts = workload.scripts()
    samples = SideSamples()
    server_cpu = getattr(side, "server_cpu_s", None)
    server_before = None if server_cpu is None else server_cpu()
    client_before = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(_write_rollout(side, script, samples, scope) for script in scripts))
    samples.capture_wall_s = time.perf_counter() - start
    samples.client_cpu_s = time.process_time() - client_before
    server_after = None if server_cpu is None else server_cpu()
    if server_before is not None and server_after is not None:
        samples.server_cpu_s = server_after - server_before
    for script in scripts:
        samples.alone.append(await _resolve_next(side, script, scope))
    for _ in range(burst_rounds):
        samples.burst.extend(
            await asyncio.gather(*(_resolve_next(side, s, scope) for s in scripts))
        )
    return samples
