"""One run of the full-store bench: a small Redis, `store serve` over it, writers that fill it.

Writers are NeMo Gym 0.7 model servers as `bench/_hotpath_sides.py` drives
them (HttpLineageResolver + HttpTokenSink; resolve, begin_call, put per
call). Each writer runs rollouts one after the other; a refused write (507,
`StoreFullError`) fails that call's capture and the rollout goes on, as Gym's
does (it masks). The run:

1. fills the store until the first refusal;
2. keeps writing `full_calls` more calls per writer while the store is full,
   timing each call's capture work (resolve + begin + put);
3. freezes and drops (retires) the finished rollouts through the `http`
   source, as a finalizer would, counting failures;
4. writes one fresh rollout: do writes resume?

See docs/capacity.md. Nothing here asserts a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench._hotpath_sides import HttpSide
from bench._hotpath_workload import RolloutScript, Workload
from tests.support.redis_processes import RedisProcess, free_ports
from tests.support.servers import free_port, stop_process, wait_for_health
from token_finalizer._constants import REDIS_MEMORY_CHECK_INTERVAL_S
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer_client import APIStatusError, StoreFullError

__all__ = ["FullStoreRun", "full_store_run", "small_redis"]


@dataclass
class FullStoreRun:
    """What one run measured (milliseconds) and counted."""

    mode: str
    capture_full_ms: list[float] = field(default_factory=list)
    capture_before_ms: list[float] = field(default_factory=list)
    # The refused write alone (the begin_call or put that answered 507), resolve excluded.
    refusal_ms: list[float] = field(default_factory=list)
    refused_507: int = 0
    other_errors: list[str] = field(default_factory=list)
    retired: int = 0
    retire_failures: int = 0
    resumed: bool = False
    health_when_full: str = ""


# A loaded machine (2 cores shared) may take long to start the store server.
_START_TIMEOUT_S = 180.0


@contextlib.contextmanager
def _store_serve(args: list[str], port: int, log: Path) -> Iterator[None]:
    """`token-finalizer store serve ARGS` until the block ends, its output in `log`."""
    with log.open("wb") as output:
        command = [sys.executable, "-m", "token_finalizer.cli", *args]
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}/health"
            wait_for_health(url, timeout=_START_TIMEOUT_S, process=process)
            yield
        finally:
            stop_process(process)


@contextlib.contextmanager
def small_redis(directory: Path, maxmemory: str) -> Iterator[RedisProcess]:
    """A private redis-server with `maxmemory` and noeviction."""
    (port,) = free_ports(1)
    server = RedisProcess(
        port, directory, ["--maxmemory", maxmemory, "--maxmemory-policy", "noeviction"]
    )
    server.start()
    try:
        if not server.answers():
            raise RuntimeError(f"redis-server did not start: {server.log_tail()}")
        yield server
    finally:
        server.kill()


class _Writers:
    """The writers' shared state: is the store full yet, and what each call cost."""

    def __init__(self, side: HttpSide, workload: Workload, full_calls: int, run: FullStoreRun):
        self.side, self.workload, self.run = side, workload, run
        self.full_calls = full_calls
        self.full = asyncio.Event()
        self.finished: list[str] = []
        self._numbers = iter(range(1_000_000))

    async def _call(self, script: RolloutScript) -> bool:
        """One model call's capture work; True when the store refused a write."""
        call = script.next_call()
        start = time.perf_counter()
        refused = False
        writing = start
        try:
            resolution = await self.side.resolve(call.rollout_id, call.request_items)
            writing = time.perf_counter()
            await self.side.begin_call(call.rollout_id, call.model_call_id)
            entry = self.side.entry(call, resolution, self.workload.delta)
            writing = time.perf_counter()
            await self.side.put(entry)
        except StoreFullError:
            refused = True
            self.run.refused_507 += 1
            self.run.refusal_ms.append(1000.0 * (time.perf_counter() - writing))
        except APIStatusError as error:  # anything but a 507 is a failure of the rule
            self.run.other_errors.append(f"{error.status_code}: {error.message[:120]}")
        elapsed = 1000.0 * (time.perf_counter() - start)
        if self.full.is_set():
            self.run.capture_full_ms.append(elapsed)
        else:
            self.run.capture_before_ms.append(elapsed)
        return refused

    async def writer(self) -> None:
        done_full = 0
        while done_full < self.full_calls:
            rollout_id = f"full-{next(self._numbers):05d}"
            script = RolloutScript(rollout_id, self.workload, random.Random(rollout_id))
            clean = True
            for _ in range(self.workload.calls):
                was_full = self.full.is_set()
                if await self._call(script):
                    clean = False
                    self.full.set()
                if was_full:
                    done_full += 1
                    if done_full >= self.full_calls:
                        break
            if clean and script.turn == self.workload.calls:
                self.finished.append(rollout_id)


async def _retire(base: str, rollout_ids: list[str], run: FullStoreRun) -> None:
    async with HttpTokenSource(base) as source:
        for rollout_id in rollout_ids:
            try:
                snapshot = await source.freeze(rollout_id)
                if await source.drop(
                    rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version
                ):
                    run.retired += 1
                else:
                    run.retire_failures += 1
            except Exception as error:
                run.retire_failures += 1
                run.other_errors.append(f"retire: {type(error).__name__}: {error}"[:160])


async def _resumes(side: HttpSide, workload: Workload) -> bool:
    await asyncio.sleep(2 * REDIS_MEMORY_CHECK_INTERVAL_S)  # the store's reading ages out
    script = RolloutScript("resumed", workload, random.Random(0))
    try:
        for _ in range(3):
            call = script.next_call()
            resolution = await side.resolve(call.rollout_id, call.request_items)
            await side.begin_call(call.rollout_id, call.model_call_id)
            await side.put(side.entry(call, resolution, workload.delta))
    except StoreFullError:
        return False
    return True


async def _drive(base: str, workload: Workload, full_calls: int, run: FullStoreRun) -> None:
    side = HttpSide(base)
    try:
        writers = _Writers(side, workload, full_calls, run)
        await asyncio.gather(*(writers.writer() for _ in range(workload.rollouts)))
        async with httpx.AsyncClient() as client:
            run.health_when_full = str((await client.get(base + "/health")).json().get("status"))
        await _retire(base, writers.finished, run)
        run.resumed = await _resumes(side, workload)
    finally:
        await side.close()


def full_store_run(
    directory: Path,
    *,
    mark: str,
    maxmemory: str,
    workload: Workload,
    full_calls: int,
) -> FullStoreRun:
    """One run with `--memory-high-water mark` ('off': only Redis's OOM refuses)."""
    run = FullStoreRun(mode=f"mark {mark}" if mark != "off" else "mark off (Redis OOM)")
    directory.mkdir(parents=True, exist_ok=True)
    with small_redis(directory / "redis", maxmemory) as server:
        port = free_port()
        args = ["store", "serve", "--redis", server.url, "--port", str(port)]
        args += ["--memory-high-water", mark]
        with _store_serve(args, port, directory / "store.log"):
            asyncio.run(_drive(f"http://127.0.0.1:{port}", workload, full_calls, run))
    return run
