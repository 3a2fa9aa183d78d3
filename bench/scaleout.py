"""Scale-out: finalizer processes side by side, on the redis store and on the file store.

    .venv/bin/python -m bench.scaleout [--clients 32] [--rollouts 2000] [--calls 100] [--rounds 3]

Part (a): small rollouts (5 calls, 2k tokens of context) finalized through 1
and through 2 `token-finalizer serve` processes (1 worker each, so 2 processes
are 2 replicas), over a `redis` source and over a `file` source, all in the
same run. A fixed number of fresh rollouts per configuration (first freeze
included), after a warm-up; `--clients` keep-alive connections, spread
round-robin over the processes' ports. The load generator speaks raw
HTTP/1.1 over asyncio streams (bench/_common.py) in this process. Figures:
finalize/s, p50, p99, and the 2-process / 1-process ratios. On this 2-core
machine the load generator, Redis and the finalizers share the cores.

Part (b): the 100-call rollout (each call adds 500 prompt tokens and
generates 500), captured with full prompts and as 0.7 delta records, in the
file store (JSONL lines, bench/lineage.py's writer) and in the redis store
(RedisTokenStore.put, as model servers write through the store server):
finalize time in this process (freeze + build) and through HTTP (`serve`, 1
worker, zstd answer received in full), medians of interleaved rounds, and
the redis/file ratios. All four builds must agree.

Redis: $TOKEN_FINALIZER_TEST_REDIS_URL, else redis://127.0.0.1:6379/0; every
key is written under a fresh prefix and deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench._common import _stop, finalize_request, read_answer
from bench.lineage import NEW_TOKENS_PER_TURN, lineage_entries
from bench.lineage import write_capture as write_file_capture
from bench.service import SMALL_CALLS, SMALL_TOKENS_PER_TURN, small_rollouts, write_small_rollouts
from tests.support.captures import record_for
from tests.support.redis import delete_prefix, redis_url, unique_prefix
from tests.support.servers import free_port, wait_for_health
from token_finalizer import FileTokenStore
from token_finalizer.core.codec import encode_json
from token_finalizer.core.delivery import finalize_record
from token_finalizer.sources.redis import RedisTokenStore

WARMUP_ROLLOUTS = 200
RAMP_UP_S = 0.5
WRITE_CONCURRENCY = 32


# -- processes -----------------------------------------------------------------------------


def _config(kind: str, where: str, prefix: str = "") -> str:
    if kind == "file":
        return f"sources:\n  local: {{kind: file, dir: '{where}'}}\n"
    return f"sources:\n  local: {{kind: redis, url: '{where}', key_prefix: '{prefix}'}}\n"


@contextlib.contextmanager
def finalizers(config_text: str, work: Path, processes: int) -> Iterator[list[int]]:
    """`processes` separate `token-finalizer serve` processes (1 worker each); their ports."""
    config = work / f"config-{time.monotonic_ns()}.yaml"
    config.write_text(config_text)
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(processes):
            port = free_port()
            command = [sys.executable, "-m", "token_finalizer.cli", "serve"]
            command += ["--config", str(config), "--port", str(port)]
            process = subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            stack.callback(_stop, process)
            wait_for_health(f"http://127.0.0.1:{port}/health", process=process)
            ports.append(port)
        yield ports


# -- part (a): throughput --------------------------------------------------------------------


async def put_small_rollouts(store: RedisTokenStore, count: int) -> list[str]:
    """`count` small rollouts put into `store` by WRITE_CONCURRENCY tasks, as the store server
    would; the store is closed after."""
    rollout_ids, template = small_rollouts(count)
    queue = iter(rollout_ids)

    async def writer() -> None:
        for rollout_id in queue:
            for entry in template:
                await store.put({**entry, "rollout_id": rollout_id})

    try:
        await asyncio.gather(*(writer() for _ in range(WRITE_CONCURRENCY)))
    finally:
        await store.close()
    return rollout_ids


async def load(ports: list[int], rollout_ids: list[str], clients: int) -> dict[str, Any]:
    """Finalize every rollout once over `clients` keep-alive connections; measure after warm-up.

    The measured window runs from the first request after the warm-up being
    sent to the last answer received: rate = measured requests / window.
    """
    pending = iter(enumerate(rollout_ids))
    latencies: list[float] = []
    failures = 0
    window: dict[str, float] = {}

    async def client(index: int) -> None:
        nonlocal failures
        port = ports[index % len(ports)]
        # Clients arrive one by one, as harness workers do (see bench/service.py).
        await asyncio.sleep(index * RAMP_UP_S / clients)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for number, rollout_id in pending:
                sent = time.perf_counter()
                if number == WARMUP_ROLLOUTS:
                    window["start"] = sent
                writer.write(finalize_request(port, rollout_id))
                status = await read_answer(reader)
                done = time.perf_counter()
                if number >= WARMUP_ROLLOUTS:
                    latencies.append(done - sent)
                    failures += status != 200
                    window["end"] = max(window.get("end", done), done)
        finally:
            writer.close()

    await asyncio.gather(*(client(index) for index in range(clients)))
    latencies.sort()
    elapsed = window["end"] - window["start"]
    return {
        "rate": len(latencies) / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "requests": len(latencies),
        "failures": failures,
    }


def throughput(work: Path, url: str, clients: int, rollouts: int) -> dict[tuple[str, int], Any]:
    count = WARMUP_ROLLOUTS + rollouts
    results: dict[tuple[str, int], Any] = {}
    for kind in ("redis", "file"):
        for processes in (1, 2):
            if kind == "file":
                capture_dir = work / f"small-{processes}p"
                capture_dir.mkdir()
                rollout_ids = write_small_rollouts(capture_dir, count)
                with finalizers(_config("file", str(capture_dir)), work, processes) as ports:
                    results[kind, processes] = asyncio.run(load(ports, rollout_ids, clients))
                continue
            with unique_prefix(url, "scaleout") as prefix:
                rollout_ids = asyncio.run(
                    put_small_rollouts(RedisTokenStore(url, key_prefix=prefix), count)
                )
                with finalizers(_config("redis", url, prefix), work, processes) as ports:
                    results[kind, processes] = asyncio.run(load(ports, rollout_ids, clients))
    print(
        f"\n(a) small rollouts ({SMALL_CALLS} calls, {SMALL_CALLS * SMALL_TOKENS_PER_TURN} tokens "
        f"of context): {rollouts} fresh rollouts after {WARMUP_ROLLOUTS} of warm-up, "
        f"{clients} keep-alive clients, {os.cpu_count()} cores"
    )
    print(
        f"{'store':>6} {'processes':>10} {'finalize/s':>11} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'requests':>9} {'non-200':>8}"
    )
    for (kind, processes), r in results.items():
        print(
            f"{kind:>6} {processes:>10} {r['rate']:>11.0f} {r['p50_ms']:>8.1f} "
            f"{r['p99_ms']:>8.1f} {r['requests']:>9} {r['failures']:>8}"
        )
    for kind in ("redis", "file"):
        ratio = results[kind, 2]["rate"] / results[kind, 1]["rate"]
        print(f"{kind}: 2 processes / 1 process: {ratio:.2f}x")
    for processes in (1, 2):
        ratio = results["redis", processes]["rate"] / results["file", processes]["rate"]
        print(f"{processes} process(es): redis / file: {ratio:.2f}x")
    return results


# -- part (b): the 100-call rollout -----------------------------------------------------------


async def _write_redis_lineage(url: str, prefix: str, calls: int, *, delta: bool) -> int:
    """The capture put call by call into the redis store; the bytes of its entry lines."""
    store = RedisTokenStore(url, key_prefix=prefix)
    size = 0
    try:
        for entry in lineage_entries("r", calls, delta=delta):
            await store.put(entry)
            size += len(orjson.dumps(entry)) + 1
    finally:
        await store.close()
    return size


async def _in_process(store: Any) -> tuple[float, bytes]:
    """Seconds to freeze and build through `store` in this process, and the build's bytes."""
    try:
        started = time.perf_counter()
        build = await finalize_record(record_for("r"), store)
        elapsed = time.perf_counter() - started
    finally:
        close = getattr(store, "close", None)
        if close is not None and asyncio.iscoroutinefunction(close):
            await close()
    assert build is not None, "no build"
    assert not build.mask_sample, build
    signature = build.to_dict()
    signature.pop("_capture_snapshot")
    return elapsed, encode_json(signature)


def _over_http(port: int) -> float:
    """Seconds from POST /finalize to the whole zstd answer received."""
    body = orjson.dumps(record_for("r"))
    headers = {"Content-Type": "application/json", "Accept-Encoding": "zstd"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600.0) as client:
        started = time.perf_counter()
        response = client.post("/finalize", content=body, headers=headers)
        raw = response.read()
        elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.status_code
    assert raw, "empty answer"
    return elapsed


def large(work: Path, url: str, calls: int, rounds: int) -> None:
    captures = [(store, kind) for store in ("file", "redis") for kind in ("full", "delta")]
    sizes: dict[tuple[str, str], int] = {}
    local: dict[tuple[str, str], list[float]] = {key: [] for key in captures}
    remote: dict[tuple[str, str], list[float]] = {key: [] for key in captures}
    signatures: dict[tuple[str, str], bytes] = {}
    base_prefix = f"tf-scaleout-large:{os.getpid()}:{time.monotonic_ns()}:"
    prefixes = {kind: f"{base_prefix}{kind}:" for kind in ("full", "delta")}
    dirs = {kind: work / f"large-{kind}" for kind in ("full", "delta")}
    try:
        for kind in ("full", "delta"):
            dirs[kind].mkdir()
            delta = kind == "delta"
            sizes["file", kind] = write_file_capture(dirs[kind], "r", calls, delta=delta)
            sizes["redis", kind] = asyncio.run(
                _write_redis_lineage(url, prefixes[kind], calls, delta=delta)
            )

        def open_store(store: str, kind: str) -> Any:
            if store == "file":
                return FileTokenStore(dirs[kind])
            return RedisTokenStore(url, key_prefix=prefixes[kind], timeout_s=120)

        for _ in range(rounds):
            for store, kind in captures:
                elapsed, signatures[store, kind] = asyncio.run(_in_process(open_store(store, kind)))
                local[store, kind].append(elapsed)
        assert len(set(signatures.values())) == 1, "the four captures built differently"
        for store, kind in captures:
            where = str(dirs[kind]) if store == "file" else url
            config = _config(store, where, prefixes[kind])
            with finalizers(config, work, 1) as (port,):
                remote[store, kind] = [_over_http(port) for _ in range(rounds)]
    finally:
        for prefix in prefixes.values():
            delete_prefix(url, prefix)
    print(
        f"\n(b) the {calls}-call rollout (+{NEW_TOKENS_PER_TURN // 2} prompt / "
        f"+{NEW_TOKENS_PER_TURN // 2} generated tokens per call), median of {rounds} rounds"
    )
    print(f"{'capture':>8} {'store':>6} {'entry MB':>9} {'in process s':>13} {'HTTP s':>8}")
    medians: dict[tuple[str, str], tuple[float, float]] = {}
    for store, kind in captures:
        medians[store, kind] = (
            statistics.median(local[store, kind]),
            statistics.median(remote[store, kind]),
        )
        print(
            f"{kind:>8} {store:>6} {sizes[store, kind] / 1e6:>9.2f} "
            f"{medians[store, kind][0]:>13.3f} {medians[store, kind][1]:>8.3f}"
        )
    for kind in ("full", "delta"):
        (fl, fh), (rl, rh) = medians["file", kind], medians["redis", kind]
        print(f"{kind}: redis / file  in process {rl / fl:.2f}x, through HTTP {rh / fh:.2f}x")
    for store in ("file", "redis"):
        (full_l, full_h), (delta_l, delta_h) = medians[store, "full"], medians[store, "delta"]
        print(
            f"{store}: full / delta  in process {full_l / delta_l:.1f}x, "
            f"through HTTP {full_h / delta_h:.1f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32, help="keep-alive connections")
    parser.add_argument(
        "--rollouts", type=int, default=2000, help="measured small rollouts per configuration"
    )
    parser.add_argument("--calls", type=int, default=100, help="calls of the large rollout")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of part (b)")
    parser.add_argument("--skip-large", action="store_true", help="only part (a)")
    args = parser.parse_args()
    url = redis_url()
    with tempfile.TemporaryDirectory(prefix="bench-scaleout-") as work:
        throughput(Path(work), url, args.clients, args.rollouts)
        if not args.skip_large:
            large(Path(work), url, args.calls, args.rounds)


if __name__ == "__main__":
    main()
