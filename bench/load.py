"""Mixed traffic against `token-finalizer serve --workers 2`: errors, lost captures, memory.

    .venv/bin/python -m bench.load [--seconds 60] [--clients 32] [--large-every 5]

The reliability run of the service, on loopback against the real CLI server
(2 workers, a file source in a temporary directory):

- 32 clients each finalize small rollouts (5 calls, 2,000 tokens of context)
  one after another and retire every retirable answer as soon as it arrives,
  as a trainer does once the record is stored durably;
- one more client finalizes the 5M-token rollout (100 calls x 1,000 new
  tokens per turn) every 5 s, answer zstd-compressed, and retires it.

Every finalize takes a fresh rollout. All captures are written beforehand
with `FileTokenStore.put` (fsynced per call, as model servers write them) by
several processes, before the clock starts. A warm-up precedes the measured
run: the same small traffic for 3 s, and large finalizes until each worker
has served one.

Reported: small finalizes (count, per second, p50/p99), large finalizes
(count, p50, max), retires, errors by status (connection errors and timeouts
included), lost captures (every rollout's state in the store at the end), and
the service's RSS (uvicorn parent + workers, sampled every 0.5 s) at start
(idle after the warm-up), peak, and end (idle after the run). Targets: zero
5xx, zero lost captures, RSS growth end vs start <= 10%; also checked: no
connection errors, no worker restarted, enough rollouts written. Exits 1 on
a FAIL.

The load generator speaks raw HTTP/1.1 (`bench._common`) and decodes the
large answers in a separate process, so that it takes as little of the shared
cores as it can and never stalls the small clients' event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import math
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import zstandard

from bench._common import (
    RawResponse,
    finalize_request,
    post_request,
    read_response,
    running_service,
)
from bench.service import (
    LARGE_CALLS,
    LARGE_TOKENS_PER_TURN,
    RAMP_UP_S,
    SMALL_CALLS,
    SMALL_TOKENS_PER_TURN,
)
from tests.support.captures import agent_rollout
from token_finalizer import FileTokenStore
from token_finalizer_client._wire import retire_payload

WORKERS = 2
WARMUP_S = 3.0
# The warm-up repeats large finalizes until every worker has served one (each
# worker's first one allocates for good what later ones reuse), up to this many.
WARM_LARGE_MAX = 2 * WORKERS
# Quiet time before the start and end RSS samples, so that both are taken
# with no request in flight and compare what the workers retain.
SETTLE_S = 1.0
RSS_INTERVAL_S = 0.5
RSS_GROWTH_TARGET = 0.10
RSS_TREND_PARTS = 5  # growth that levels off vs growth that goes on
REQUEST_TIMEOUT_S = 120.0
ACCEPT_ENCODING = "zstd"  # what the client package asks for (it adds gzip, never used)
WRITE_CHUNK = 200  # small rollouts per writer task
WRITE_CONCURRENCY = 8  # puts in flight per writer process: each one waits on fsync


# -- captures -------------------------------------------------------------------------


async def _put_rollouts(directory: str, rollout_ids: list[str], calls: int, tokens: int) -> None:
    store = FileTokenStore(directory)
    pending = iter(rollout_ids)

    async def writer() -> None:
        for rollout_id in pending:
            for entry in agent_rollout(rollout_id, calls=calls, new_tokens_per_turn=tokens):
                await store.put(entry)

    await asyncio.gather(*(writer() for _ in range(WRITE_CONCURRENCY)))


def write_rollouts(directory: str, rollout_ids: list[str], calls: int, tokens: int) -> None:
    """Capture every rollout of `rollout_ids` with `FileTokenStore.put` (in a writer process)."""
    asyncio.run(_put_rollouts(directory, rollout_ids, calls, tokens))


def write_pool(directory: Path, small_ids: list[str], large_ids: list[str], writers: int) -> float:
    """Write all captures of the run with `writers` processes; the seconds it took."""
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(writers, mp_context=context) as pool:
        jobs = [
            pool.submit(
                write_rollouts, str(directory), [rollout_id], LARGE_CALLS, LARGE_TOKENS_PER_TURN
            )
            for rollout_id in large_ids
        ]
        jobs += [
            pool.submit(
                write_rollouts,
                str(directory),
                small_ids[first : first + WRITE_CHUNK],
                SMALL_CALLS,
                SMALL_TOKENS_PER_TURN,
            )
            for first in range(0, len(small_ids), WRITE_CHUNK)
        ]
        for job in concurrent.futures.as_completed(jobs):
            job.result()
    return time.perf_counter() - started


# -- the service's memory -----------------------------------------------------------------


def _children_by_scan(pid: int) -> list[int]:
    children = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{name}/status").read_text().splitlines():
                if line.startswith("PPid:"):
                    if int(line.split()[1]) == pid:
                        children.append(int(name))
                    break
    return children


def _children(pid: int) -> list[int]:
    """Direct children of `pid`: from /proc/PID/task/*/children, else by scanning /proc."""
    if not Path(f"/proc/self/task/{os.getpid()}/children").exists():
        return _children_by_scan(pid)
    children = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                children += [
                    int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                ]
    return children


def _rss_kib(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "parent"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    # multiprocessing's resource tracker, started along with uvicorn's spawned workers.
    return "tracker" if b"resource_tracker" in command else "worker"


def _server_socket_inode(server_port: int, client_port: int) -> int | None:
    """The inode of the service's end of our loopback connection, from /proc/net/tcp."""
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if (local_port, remote_port) == (server_port, client_port):
                return int(fields[9])
    return None


def serving_process(pids: list[int], server_port: int, client_port: int) -> int | None:
    """Which of `pids` holds the accepted end of the connection from `client_port`."""
    inode = _server_socket_inode(server_port, client_port)
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):  # closed meanwhile
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
    return None


@dataclass(frozen=True, slots=True)
class RssSample:
    """The RSS of every process of the service's tree at one moment."""

    at: float
    by_process: dict[int, tuple[str, int]]  # pid -> (role, KiB)

    @property
    def total_mb(self) -> float:
        return sum(kib for _, kib in self.by_process.values()) / 1024

    @property
    def workers(self) -> list[int]:
        return sorted(pid for pid, (role, _) in self.by_process.items() if role == "worker")

    def breakdown(self) -> str:
        order = {"parent": 0, "worker": 1}
        parts = sorted(
            self.by_process.items(), key=lambda item: (order.get(item[1][0], 2), item[0])
        )
        return ", ".join(f"{role} {pid} {kib / 1024:.0f}" for pid, (role, kib) in parts)


class RssSampler:
    """Samples the RSS of a process and all its descendants every RSS_INTERVAL_S, in a thread."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.samples: list[RssSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def take(self) -> RssSample:
        """Sample now (also kept for the peak)."""
        pids, queue = [], [self.root]
        while queue:
            pid = queue.pop()
            pids.append(pid)
            queue += _children(pid)
        by_process = {}
        for pid in pids:
            kib = _rss_kib(pid)
            if kib is not None:
                by_process[pid] = (_role(pid, self.root), kib)
        sample = RssSample(time.perf_counter(), by_process)
        with self._lock:
            self.samples.append(sample)
        return sample

    def between(self, first: RssSample, last: RssSample) -> list[RssSample]:
        """The samples from `first` to `last` (both included), in time order."""
        with self._lock:
            window = [s for s in self.samples if first.at <= s.at <= last.at]
        return sorted(window, key=lambda sample: sample.at)

    def _run(self) -> None:
        while not self._stop.wait(RSS_INTERVAL_S):
            self.take()

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


# -- traffic ------------------------------------------------------------------------------


class RequestFailed(Exception):
    """No HTTP answer; `kind` is "connection" or "timeout"."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class Connection:
    """One keep-alive HTTP/1.1 connection, reopened after a failure or a `Connection: close`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def exchange(self, request: bytes) -> RawResponse:
        """Send one request and read its answer; RequestFailed when none comes."""
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                if self._streams is None:
                    self._streams = await asyncio.open_connection("127.0.0.1", self.port)
                reader, writer = self._streams
                writer.write(request)
                response = await read_response(reader)
        except TimeoutError:
            await self.close()
            raise RequestFailed("timeout") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            await self.close()
            raise RequestFailed("connection") from None
        if response.headers.get("connection", "").lower() == "close":
            await self.close()
        return response

    def served_by(self, pids: list[int]) -> int | None:
        """Which of the service's processes accepted this connection (None if closed)."""
        if self._streams is None:
            return None
        client_port = self._streams[1].get_extra_info("sockname")[1]
        return serving_process(pids, self.port, client_port)

    async def close(self) -> None:
        if self._streams is not None:
            writer = self._streams[1]
            self._streams = None
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


@dataclass(frozen=True, slots=True)
class AnswerSummary:
    """What a client needs from a finalize answer: whether to retire, and the retire body."""

    rollout_id: str | None
    retirable: bool
    masked: bool
    retire_body: bytes


def read_finalize_answer(body: bytes, content_encoding: str | None) -> AnswerSummary:
    """Decode a finalize answer and build the retire body the client package would send."""
    if content_encoding == "zstd":
        body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    answer = orjson.loads(body)
    record = answer.get("record") or {}
    payload = retire_payload(answer.get("rollout_id"), answer.get("build"), answer.get("source"))
    return AnswerSummary(
        rollout_id=answer.get("rollout_id"),
        retirable=answer.get("retirable") is True,
        masked=bool(record.get("mask_sample")),
        retire_body=orjson.dumps(payload),
    )


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


@dataclass
class RunResult:
    """What the measured phase saw, and the warm-up's large finalizes."""

    warm_large: CycleStats
    small: CycleStats
    large: CycleStats
    rss: list[RssSample]  # from the start sample to the end sample

    @property
    def rss_start(self) -> RssSample:
        return self.rss[0]

    @property
    def rss_end(self) -> RssSample:
        return self.rss[-1]

    @property
    def rss_peak(self) -> RssSample:
        return max(self.rss, key=lambda sample: sample.total_mb)

    def rss_floors(self, parts: int) -> list[float]:
        """The lowest total in each of `parts` equal stretches of the run, MB.

        Transient buffers of a large finalize come and go; the floor is what stays.
        """
        began, span = self.rss_start.at, self.rss_end.at - self.rss_start.at
        floors = []
        for part in range(parts):
            low, high = began + span * part / parts, began + span * (part + 1) / parts
            window = [s.total_mb for s in self.rss if low <= s.at <= high]
            floors.append(min(window) if window else math.nan)
        return floors


async def drive(
    traffic: Traffic,
    sampler: RssSampler,
    args: argparse.Namespace,
    small_ids: list[str],
    large_ids: list[str],
) -> RunResult:
    """Warm up, settle, sample; run the measured traffic; settle, sample."""
    rollouts = iter(small_ids)
    warm_ids, measured_ids = large_ids[:WARM_LARGE_MAX], large_ids[WARM_LARGE_MAX:]
    _, warm_large = await traffic.phase(
        WARMUP_S, args.clients, rollouts, lambda stats: traffic.warm_large(warm_ids, stats)
    )
    await asyncio.sleep(SETTLE_S)
    start = sampler.take()
    small, large = await traffic.phase(
        args.seconds,
        args.clients,
        rollouts,
        lambda stats: traffic.large_client(measured_ids, args.large_every, stats),
    )
    await asyncio.sleep(SETTLE_S)
    end = sampler.take()
    return RunResult(warm_large, small, large, sampler.between(start, end))


def wait_for_workers(sampler: RssSampler, timeout: float = 20.0) -> list[int]:
    """The pids of the service's WORKERS worker processes, once they all exist."""
    deadline = time.monotonic() + timeout
    while len(workers := sampler.take().workers) < WORKERS:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if len(workers) != WORKERS:
        raise RuntimeError(f"expected {WORKERS} worker processes, found {workers}")
    return workers


# -- verdict ----------------------------------------------------------------------------


@dataclass
class CaptureCheck:
    """Every rollout's outcome, and the captures that should exist but do not."""

    outcomes: Counter[str]
    lost: Counter[str]
    retired_but_present: int


def check_captures(
    directory: Path, rollout_ids: list[str], outcomes: dict[str, str]
) -> CaptureCheck:
    """Read each rollout's state: only a capture its client retired may be gone.

    A finalized-but-kept, masked, failed or untouched capture must still be
    there (state not retired, JSONL present); one whose retire got no answer
    may be either way.
    """
    store = FileTokenStore(directory)
    check = CaptureCheck(Counter(), Counter(), 0)
    for rollout_id in rollout_ids:
        outcome = outcomes.get(rollout_id, "untouched")
        check.outcomes[outcome] += 1
        state = store.status(rollout_id)
        present = (
            state is not None
            and not state.get("retired")
            and (directory / f"{rollout_id}.tokens.jsonl").exists()
        )
        if outcome == "retired":
            check.retired_but_present += present
        elif outcome != "retire unknown" and not present:
            check.lost[outcome] += 1
    return check


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _row(label: str, values: list[float], per_second: float, *, p99: bool = True) -> str:
    if not values:
        return f"{label:<34} {0:>7} {per_second:>8.1f} {'-':>8} {'-':>8} {'-':>8}"
    p99_text = f"{1000 * _percentile(values, 0.99):>8.1f}" if p99 else f"{'-':>8}"
    return (
        f"{label:<34} {len(values):>7} {per_second:>8.1f} "
        f"{1000 * _percentile(values, 0.5):>8.1f} {p99_text} {1000 * max(values):>8.1f}"
    )


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def _service_log_problems(path: Path) -> list[str]:
    lines = path.read_text(errors="replace").splitlines()
    return [line for line in lines if "Traceback" in line or " ERROR " in line]


def _print_traffic(args: argparse.Namespace, result: RunResult, traffic: Traffic) -> None:
    small, large = result.small, result.large
    # count and latencies: every request of the measured phase, the ones still in
    # flight at the stop included; per s: answers that came before the stop.
    rows = (
        (f"small finalize ({args.clients} clients)", small.finalize, small.finalized_in_time, True),
        ("small retire", small.retire, small.retired_in_time, True),
        ("large finalize (5M tokens, zstd)", large.finalize, large.finalized_in_time, False),
        ("large retire", large.retire, large.retired_in_time, False),
    )
    print(f"\n{'traffic':<34} {'count':>7} {'per s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for label, latencies, in_time, p99 in rows:
        print(_row(label, latencies, in_time / args.seconds, p99=p99))
    errors = ", ".join(
        f"{what} {error}: {n}" for (what, error), n in sorted(traffic.errors.items())
    )
    print(f"errors by status (warm-up included): {errors or 'none'}")
    served = ", ".join(
        f"{pid or '?'}: {small.by_worker[pid]}/{large.by_worker[pid]}"
        for pid in sorted(set(small.by_worker) | set(large.by_worker))
    )
    print(f"per worker, small connections/large finalizes: {served}")
    cold = sorted(set(traffic.workers) - set(result.warm_large.by_worker))
    print(
        f"warm-up: {len(result.warm_large.finalize)} large finalizes"
        + (f"; no large one served by {cold}" if cold else ", every worker served one")
    )


def _print_memory(result: RunResult, log_problems: list[str]) -> None:
    start, peak, end = result.rss_start, result.rss_peak, result.rss_end
    print(
        f"service RSS MB ({len(start.by_process)} processes): start {start.total_mb:.1f}, "
        f"peak {peak.total_mb:.1f}, end {end.total_mb:.1f} "
        f"({100 * (end.total_mb / start.total_mb - 1):+.1f}%)"
    )
    print(f"  start: {start.breakdown()}\n  peak:  {peak.breakdown()}\n  end:   {end.breakdown()}")
    floors = ", ".join(f"{floor:.0f}" for floor in result.rss_floors(RSS_TREND_PARTS))
    print(f"  lowest total in each {100 // RSS_TREND_PARTS}% of the run: {floors}")
    print(f"service log: {len(log_problems)} ERROR/Traceback lines")
    for line in log_problems[:10]:
        print(f"  {line}")


def _targets(result: RunResult, traffic: Traffic, lost: int) -> list[tuple[str, bool, str]]:
    errors = traffic.errors.items()
    server_errors = sum(n for (_, error), n in errors if error.startswith("5"))
    no_answer = sum(n for (_, error), n in errors if error in ("connection", "timeout"))
    growth = result.rss_end.total_mb / result.rss_start.total_mb - 1
    restarted = result.rss_start.workers != result.rss_end.workers
    exhausted = result.small.exhausted
    return [
        ("zero 5xx", server_errors == 0, f"{server_errors}"),
        ("zero lost captures", lost == 0, f"{lost}"),
        (
            f"RSS growth <= {100 * RSS_GROWTH_TARGET:.0f}%",
            growth <= RSS_GROWTH_TARGET,
            f"{100 * growth:+.1f}%",
        ),
        ("zero connection errors/timeouts", no_answer == 0, f"{no_answer}"),
        ("no worker restarted", not restarted, "restarted" if restarted else "same pids"),
        (
            "rollout pool lasted the run",
            not exhausted,
            "exhausted: raise --pool-rate" if exhausted else "ok",
        ),
    ]


def report(
    args: argparse.Namespace,
    result: RunResult,
    traffic: Traffic,
    check: CaptureCheck,
    log_problems: list[str],
) -> bool:
    """Print the table and the targets; whether every target passed."""
    _print_traffic(args, result, traffic)
    outcomes = ", ".join(f"{n} {outcome}" for outcome, n in check.outcomes.most_common())
    lost = sum(check.lost.values())
    print(
        f"captures ({sum(check.outcomes.values())}): {outcomes}; "
        f"lost {lost}{f' {dict(check.lost)}' if lost else ''}; "
        f"retired but still present {check.retired_but_present}"
    )
    _print_memory(result, log_problems)
    targets = _targets(result, traffic, lost)
    print("targets:")
    for name, passed, figure in targets:
        print(f"  {name:<34} {_verdict(passed)} ({figure})")
    return all(passed for _, passed, _ in targets)


# -- main ---------------------------------------------------------------------------------


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=_positive, default=60.0, help="measured seconds (60)")
    parser.add_argument("--clients", type=int, default=32, help="small-finalize clients (32)")
    parser.add_argument(
        "--large-every", type=_positive, default=5.0, help="seconds between large finalizes (5)"
    )
    parser.add_argument(
        "--pool-rate",
        type=_positive,
        default=250.0,
        help="small rollouts written per second of traffic (250; must exceed the throughput)",
    )
    parser.add_argument("--writers", type=int, default=4, help="capture-writing processes (4)")
    args = parser.parse_args()

    small_count = math.ceil((WARMUP_S + args.seconds) * args.pool_rate)
    small_ids = [f"small-{index:06d}" for index in range(small_count)]
    # Enough for the warm-up, then one per --large-every of the measured run.
    large_ids = [
        f"large-{index:03d}"
        for index in range(WARM_LARGE_MAX + math.ceil(args.seconds / args.large_every))
    ]
    print(
        f"load: {args.seconds:.0f} s of mixed traffic against `token-finalizer serve --workers "
        f"{WORKERS}` on loopback, {os.cpu_count()} cores (warm-up {WARMUP_S:.0f} s first)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-load-") as work:
        capture_dir = Path(work) / "captures"
        capture_dir.mkdir()
        print(
            f"writing {small_count} small + {len(large_ids)} large captures with "
            f"FileTokenStore.put ({args.writers} processes) ...",
            flush=True,
        )
        written_s = write_pool(capture_dir, small_ids, large_ids, args.writers)
        print(f"written in {written_s:.0f} s; running ...", flush=True)
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as decoder:
            decoder.submit(int).result()  # started now, not during the run
            log_path = Path(work) / "service.stderr"
            with (
                running_service(capture_dir, WORKERS, stderr_path=log_path) as service,
                RssSampler(service.pid) as sampler,
            ):
                traffic = Traffic(service.port, wait_for_workers(sampler), decoder)
                result = asyncio.run(drive(traffic, sampler, args, small_ids, large_ids))
        check = check_captures(capture_dir, small_ids + large_ids, traffic.outcomes)
        passed = report(args, result, traffic, check, _service_log_problems(log_path))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
