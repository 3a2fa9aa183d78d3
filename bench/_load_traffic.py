"""bench.load, the traffic: small clients, the large-rollout loop, and the phases that run them.

Each client finalizes a fresh rollout and retires it as soon as the answer
says it may, as a trainer does once the record is stored durably. Errors and
every rollout's outcome accumulate on `Traffic` across the warm-up and the
measured phase.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import orjson
import zstandard

from bench._common import RawResponse, finalize_request, post_request
from bench._load_connection import AnswerSummary, Connection, RequestFailed, read_finalize_answer
from bench.service import RAMP_UP_S

__all__ = ["ACCEPT_ENCODING", "CycleStats", "Reader", "Traffic"]

ACCEPT_ENCODING = "zstd"  # what the client package asks for (it adds gzip, never used)


@dataclass
class CycleStats:
    """Finalize and retire latencies (seconds) of one kind of traffic in one phase."""

    stop_at: float
    finalize: list[float] = field(default_factory=list)
    retire: list[float] = field(default_factory=list)
    # Answered before stop_at: the throughput counts.
    finalized_in_time: int = 0
    retired_in_time: int = 0
    exhausted: bool = False
    # worker pid (0: unknown) -> small connections, or large finalizes, it served
    by_worker: Counter[int] = field(default_factory=Counter)


Reader = Callable[[RawResponse], Awaitable[AnswerSummary]]


class Traffic:
    """The clients of the run; errors and every rollout's outcome accumulate across phases."""

    def __init__(self, port: int, workers: list[int], decoder: concurrent.futures.Executor) -> None:
        self.port = port
        self.workers = workers
        self.decoder = decoder
        self.errors: Counter[tuple[str, str]] = Counter()
        # rollout id -> retired | kept | masked | not retirable | failed | retire unknown
        self.outcomes: dict[str, str] = {}

    async def _read_here(self, response: RawResponse) -> AnswerSummary:
        return read_finalize_answer(response.body, response.headers.get("content-encoding"))

    async def _read_elsewhere(self, response: RawResponse) -> AnswerSummary:
        # Tens of MB of JSON: decoded in another process, off this event loop.
        return await asyncio.get_running_loop().run_in_executor(
            self.decoder,
            read_finalize_answer,
            response.body,
            response.headers.get("content-encoding"),
        )

    def _failed(self, what: str, error: str, rollout_id: str, outcome: str = "failed") -> None:
        self.errors[what, error] += 1
        self.outcomes[rollout_id] = outcome

    async def cycle(
        self, connection: Connection, rollout_id: str, stats: CycleStats, read: Reader
    ) -> None:
        """Finalize one rollout; retire it as soon as the answer says it may."""
        request = finalize_request(self.port, rollout_id, accept_encoding=ACCEPT_ENCODING)
        sent = time.perf_counter()
        try:
            response = await connection.exchange(request)
        except RequestFailed as exc:
            self._failed("finalize", exc.kind, rollout_id)
            return
        answered = time.perf_counter()
        if response.status != 200:
            self._failed("finalize", str(response.status), rollout_id)
            return
        stats.finalize.append(answered - sent)
        stats.finalized_in_time += answered <= stats.stop_at
        try:
            answer = await read(response)
        except (ValueError, zstandard.ZstdError):
            self._failed("finalize", "undecodable answer", rollout_id)
            return
        if answer.rollout_id != rollout_id:
            self._failed("finalize", "answer for another rollout", rollout_id)
            return
        if not answer.retirable:
            self.outcomes[rollout_id] = "masked" if answer.masked else "not retirable"
            return
        sent = time.perf_counter()
        try:
            response = await connection.exchange(
                post_request(self.port, "/retire", answer.retire_body)
            )
        except RequestFailed as exc:
            self._failed("retire", exc.kind, rollout_id, "retire unknown")
            return
        if response.status != 200:
            self._failed("retire", str(response.status), rollout_id, "kept")
            return
        answered = time.perf_counter()
        stats.retire.append(answered - sent)
        stats.retired_in_time += answered <= stats.stop_at
        retired = orjson.loads(response.body).get("retired") is True
        self.outcomes[rollout_id] = "retired" if retired else "kept"

    async def small_client(
        self, index: int, clients: int, rollouts: Iterator[str], stats: CycleStats
    ) -> None:
        # Clients arrive one by one, so that both workers get connections (see bench.service).
        await asyncio.sleep(index * RAMP_UP_S / clients)
        connection = Connection(self.port)
        placed = False
        try:
            while time.perf_counter() < stats.stop_at:
                rollout_id = next(rollouts, None)
                if rollout_id is None:
                    stats.exhausted = True
                    return
                await self.cycle(connection, rollout_id, stats, self._read_here)
                if not placed:
                    stats.by_worker[connection.served_by(self.workers) or 0] += 1
                    placed = True
        finally:
            await connection.close()

    async def _large_cycle(self, rollout_id: str, stats: CycleStats) -> None:
        # A fresh connection each time: uvicorn closes keep-alive connections idle
        # for 5 s, and a request racing that close would count as a failure.
        connection = Connection(self.port)
        try:
            await self.cycle(connection, rollout_id, stats, self._read_elsewhere)
            stats.by_worker[connection.served_by(self.workers) or 0] += 1
        finally:
            await connection.close()

    async def large_client(self, rollout_ids: list[str], every: float, stats: CycleStats) -> None:
        """One large finalize every `every` seconds (at once if the previous one ran late)."""
        started = time.perf_counter()
        for turn, rollout_id in enumerate(rollout_ids):
            await asyncio.sleep(max(0.0, started + turn * every - time.perf_counter()))
            await self._large_cycle(rollout_id, stats)

    async def warm_large(self, rollout_ids: list[str], stats: CycleStats) -> None:
        """Large finalizes one after another until every worker has served one."""
        for rollout_id in rollout_ids:
            if set(self.workers) <= set(stats.by_worker):
                return
            await self._large_cycle(rollout_id, stats)

    async def phase(
        self,
        seconds: float,
        clients: int,
        rollouts: Iterator[str],
        large: Callable[[CycleStats], Awaitable[None]],
    ) -> tuple[CycleStats, CycleStats]:
        """Small clients for `seconds` alongside `large`; requests in flight are finished."""
        stop_at = time.perf_counter() + seconds
        small_stats, large_stats = CycleStats(stop_at), CycleStats(stop_at)
        await asyncio.gather(
            *(self.small_client(index, clients, rollouts, small_stats) for index in range(clients)),
            large(large_stats),
        )
        return small_stats, large_stats
