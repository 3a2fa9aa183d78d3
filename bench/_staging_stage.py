"""Stage latency and throughput: `HttpStagingSink.stage()` from many threads to `store serve`.

Each thread plays one inference worker's completion threads: it stages the
calls of its own rollouts in order (a call's parent is staged before it, as
a serving engine finishes them), every call a delta of `prompt` new prompt
tokens and `generated` generated tokens with log probabilities, built and
hashed as NeMo Gym 0.7's worker builds them before the timer starts (the
hashing is the worker's, the sink's cost is the store round trip). Every
stage goes through one shared `HttpStagingSink` over loopback HTTP to one
`store serve` process (over a directory, or over Redis), which validates
the record, runs the custody checks against its parent chain, and makes it
durable before it answers.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench._common import staged_chain
from tests.support.redis import store_backend
from tests.support.servers import free_port, running_process
from token_finalizer_client import HttpStagingSink

__all__ = ["StageRun", "run_stage_bench", "staging_store"]

WRITER = "bench-writer"


@dataclass(frozen=True, slots=True)
class StageRun:
    """One run's figures: per-stage latencies (seconds), wall time, failures, record size."""

    backend: str
    threads: int
    latencies: tuple[float, ...]
    wall_s: float
    failures: int
    mean_record_bytes: float

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.latencies) * 1000

    @property
    def records_per_s(self) -> float:
        return len(self.latencies) / self.wall_s


def _rollout(calls: int, prompt: int, generated: int, seed: int) -> list[dict[str, Any]]:
    """One rollout's staged calls as wire JSON, root first (the worker's hashing done here)."""
    rollout_id = f"bench-{uuid.uuid4().hex[:12]}"
    chain = staged_chain(rollout_id, calls, prompt, generated, seed=seed, weight_version=1)
    return [orjson.loads(orjson.dumps(record.to_json())) for record in chain]


@contextmanager
def staging_store(backend: str, directory: Path) -> Iterator[str]:
    """`store serve` over a directory or over Redis (a prefix of its own); its base URL."""
    with ExitStack() as stack:
        options = store_backend(stack, backend, directory, "bench-staging")
        port = free_port()
        args = ["store", "serve", *options, "--port", str(port), "--writer-token", WRITER]
        stack.enter_context(running_process([*args, "--finalizer-token", "bench-f"], port=port))
        yield f"http://127.0.0.1:{port}"


def run_stage_bench(
    url: str,
    backend: str,
    *,
    threads: int,
    rollouts_per_thread: int,
    calls: int,
    prompt: int,
    generated: int,
) -> StageRun:
    """Stage every thread's rollouts through one shared sink; the latencies of every stage."""
    work = [
        [
            record
            for r in range(rollouts_per_thread)
            for record in _rollout(calls, prompt, generated, seed=t * 1000 + r)
        ]
        for t in range(threads)
    ]
    sizes = [len(orjson.dumps(record)) for records in work for record in records]
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    with HttpStagingSink(url, token=WRITER, timeout=120.0) as sink:
        # One warm-up stage opens the pool's first connection outside the timing.
        sink.stage(_rollout(1, 8, 8, seed=999_999)[0])

        def worker(records: list[dict[str, Any]]) -> None:
            nonlocal failures
            mine, failed = [], 0
            start.wait()
            for record in records:
                began = time.perf_counter()
                result = sink.stage(record)
                mine.append(time.perf_counter() - began)
                failed += not result.ok
            with lock:
                latencies.extend(mine)
                failures += failed

        pool = [threading.Thread(target=worker, args=(records,)) for records in work]
        for thread in pool:
            thread.start()
        start.wait()
        began = time.perf_counter()
        for thread in pool:
            thread.join()
        wall = time.perf_counter() - began
    return StageRun(backend, threads, tuple(latencies), wall, failures, statistics.fmean(sizes))
