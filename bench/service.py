"""The finalizer HTTP service under load, and its overhead on the 5M-token rollout.

    .venv/bin/python -m bench.service [--duration 8] [--clients 32] [--skip-large]

Part (a): small rollouts (5 calls, ~2k tokens of context) finalized by 32
concurrent keep-alive clients on loopback against the real CLI server
(`token-finalizer serve`), once with 1 worker and once with 2, in the same
run: finalize/s, p50 and p99 (target: >= 300/s with 2 workers). Every request
finalizes a fresh rollout (first freeze included). The load generator speaks
raw HTTP/1.1 over asyncio streams so that it costs the shared 2 cores as
little as possible; it runs in this process.

Part (b): the 5M-token rollout (100 calls x 1,000 new tokens per turn):
POST /finalize through HTTP (zstd, as harnesses ask, and uncompressed)
against an in-process call of the same function (`finalize_record`) on the
same frozen capture, interleaved in the same run (target: HTTP adds <= 25%).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench._common import finalize_request, read_answer, serving
from tests.support.captures import agent_rollout, record_for
from token_finalizer import FileTokenStore
from token_finalizer.core.codec import dumps_entry_line
from token_finalizer.core.delivery import finalize_record

SMALL_CALLS, SMALL_TOKENS_PER_TURN = 5, 400
LARGE_CALLS, LARGE_TOKENS_PER_TURN = 100, 1000
WARMUP_S = 1.0
RAMP_UP_S = 0.5  # all clients connected well within the warm-up
THROUGHPUT_TARGET = 300.0
OVERHEAD_TARGET = 1.25
LARGE_ROUNDS = 3


# -- setup ----------------------------------------------------------------------


def small_rollouts(count: int) -> tuple[list[str], list[dict[str, Any]]]:
    """The ids of `count` small rollouts, and the entries every one of them repeats."""
    template = agent_rollout(
        "template", calls=SMALL_CALLS, new_tokens_per_turn=SMALL_TOKENS_PER_TURN
    )
    return [f"small-{i:06d}" for i in range(count)], template


def write_small_rollouts(directory: Path, count: int) -> list[str]:
    """`count` small rollouts written as NeMo Gym writers do: one JSONL line per call.

    Lines appended outside the store's own `put` are indexed by the first
    freeze (docs/store-protocol.md), so every request of the benchmark pays that too.
    """
    rollout_ids, template = small_rollouts(count)
    for rollout_id in rollout_ids:
        lines = [dumps_entry_line({**entry, "rollout_id": rollout_id}) for entry in template]
        (directory / f"{rollout_id}.tokens.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return rollout_ids


# -- part (a): throughput ----------------------------------------------------------


async def load(base: str, rollout_ids: list[str], clients: int, duration: float) -> dict:
    """Keep `clients` connections busy for WARMUP_S + `duration`; measure the latter part."""
    port = int(base.rsplit(":", 1)[1])
    requests = (finalize_request(port, rollout_id) for rollout_id in rollout_ids)
    latencies: list[float] = []
    failures = 0
    exhausted = False
    started = time.perf_counter()
    measure_from = started + WARMUP_S
    stop_at = measure_from + duration

    async def client(index: int) -> None:
        nonlocal failures, exhausted
        # Clients arrive one by one, as harness workers do. A burst of connects
        # would be accepted by whichever worker woke first (asyncio accepts a
        # whole backlog per wake-up) and keep-alive would pin them all there.
        await asyncio.sleep(index * RAMP_UP_S / clients)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop_at:
                request = next(requests, None)
                if request is None:
                    exhausted = True
                    return
                sent = time.perf_counter()
                writer.write(request)
                status = await read_answer(reader)
                done = time.perf_counter()
                if sent >= measure_from and done <= stop_at:
                    latencies.append(done - sent)
                    failures += status != 200
        finally:
            writer.close()

    await asyncio.gather(*(client(index) for index in range(clients)))
    if exhausted:
        raise RuntimeError("ran out of fresh rollouts; raise the rollout count")
    latencies.sort()
    return {
        "rate": len(latencies) / duration,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "requests": len(latencies),
        "failures": failures,
    }


def throughput(work: Path, clients: int, duration: float) -> None:
    # Generous: no configuration on 2 cores gets near 1,500 finalizes/s.
    count = int((WARMUP_S + duration) * 1500)
    results = {}
    for workers in (1, 2):
        capture_dir = work / f"small-{workers}w"
        capture_dir.mkdir()
        rollout_ids = write_small_rollouts(capture_dir, count)
        with serving(capture_dir, workers) as base:
            results[workers] = asyncio.run(load(base, rollout_ids, clients, duration))
    print(
        f"\n(a) small rollouts ({SMALL_CALLS} calls, {SMALL_CALLS * SMALL_TOKENS_PER_TURN} "
        f"tokens of context), {clients} concurrent clients, {duration:.0f} s each, "
        f"{os.cpu_count()} cores"
    )
    print(
        f"{'workers':>8} {'finalize/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'requests':>9} "
        f"{'non-200':>8}"
    )
    for workers, r in results.items():
        print(
            f"{workers:>8} {r['rate']:>11.0f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
            f"{r['requests']:>9} {r['failures']:>8}"
        )
    two = results[2]["rate"]
    print(
        f"2 workers / 1 worker: {two / results[1]['rate']:.2f}x; "
        f"2 workers vs target {THROUGHPUT_TARGET:.0f}/s: {two / THROUGHPUT_TARGET:.2f}x "
        f"({'met' if two >= THROUGHPUT_TARGET else 'MISSED'})"
    )


# -- part (b): HTTP overhead on the 5M-token rollout --------------------------------


async def _write_large(capture_dir: Path, rollout_id: str) -> int:
    store = FileTokenStore(capture_dir)
    entries = agent_rollout(
        rollout_id, calls=LARGE_CALLS, new_tokens_per_turn=LARGE_TOKENS_PER_TURN
    )
    for entry in entries:
        await store.put(entry)
    return sum(len(e["prompt_token_ids"]) + len(e["generation_token_ids"]) for e in entries)


async def _in_process(capture_dir: Path, rollout_id: str) -> float:
    store = FileTokenStore(capture_dir)
    started = time.perf_counter()
    build = await finalize_record(record_for(rollout_id), store)
    elapsed = time.perf_counter() - started
    assert build is not None, "no build"
    assert not build.mask_sample, build.error
    return elapsed


def _over_http(client: httpx.Client, rollout_id: str, encoding: str) -> tuple[float, int]:
    started = time.perf_counter()
    with client.stream(
        "POST", "/finalize", json=record_for(rollout_id), headers={"Accept-Encoding": encoding}
    ) as response:
        wire = sum(len(chunk) for chunk in response.iter_raw())
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.status_code
    return elapsed, wire


def _over_http_decoded(client: httpx.Client, rollout_id: str) -> float:
    """Answer received, zstd-decompressed by httpx, and parsed by orjson on the client."""
    started = time.perf_counter()
    response = client.post(
        "/finalize", json=record_for(rollout_id), headers={"Accept-Encoding": "zstd"}
    )
    answer = orjson.loads(response.content)
    elapsed = time.perf_counter() - started
    assert answer["retirable"] is True
    return elapsed


def overhead(work: Path) -> None:
    capture_dir = work / "large"
    capture_dir.mkdir()
    rollout_id = "bench-5m"
    tokens = asyncio.run(_write_large(capture_dir, rollout_id))
    asyncio.run(_in_process(capture_dir, rollout_id))  # the first freeze, outside the timings
    times: dict[str, list[float]] = {
        "in-process finalize_record": [],
        "HTTP, zstd answer (bytes received)": [],
        "HTTP, zstd, + client decode + orjson.loads": [],
        "HTTP, identity answer (bytes received)": [],
    }
    wire: dict[str, int] = {}
    with serving(capture_dir, 1) as base, httpx.Client(base_url=base, timeout=120) as client:
        _over_http(client, rollout_id, "zstd")  # warm the server's imports and pools
        for _ in range(LARGE_ROUNDS):
            times["in-process finalize_record"].append(
                asyncio.run(_in_process(capture_dir, rollout_id))
            )
            elapsed, wire["zstd"] = _over_http(client, rollout_id, "zstd")
            times["HTTP, zstd answer (bytes received)"].append(elapsed)
            times["HTTP, zstd, + client decode + orjson.loads"].append(
                _over_http_decoded(client, rollout_id)
            )
            elapsed, wire["identity"] = _over_http(client, rollout_id, "identity")
            times["HTTP, identity answer (bytes received)"].append(elapsed)
    medians = {name: statistics.median(values) for name, values in times.items()}
    base_time = medians["in-process finalize_record"]
    print(
        f"\n(b) the 5M-token rollout ({LARGE_CALLS} calls, {tokens:,} tokens in the capture), "
        f"median of {LARGE_ROUNDS} interleaved rounds, 1 worker"
    )
    print(f"{'path':<42} {'seconds':>8} {'vs in-process':>14}")
    for name, value in medians.items():
        print(f"{name:<42} {value:>8.3f} {value / base_time:>13.2f}x")
    print(
        f"answer on the wire: zstd {wire['zstd'] / 1e6:.1f} MB, "
        f"identity {wire['identity'] / 1e6:.1f} MB"
    )
    ratio = medians["HTTP, zstd answer (bytes received)"] / base_time
    print(
        f"HTTP (zstd) adds {100 * (ratio - 1):.0f}% (target <= {100 * (OVERHEAD_TARGET - 1):.0f}%: "
        f"{'met' if ratio <= OVERHEAD_TARGET else 'MISSED'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per run")
    parser.add_argument("--clients", type=int, default=32, help="concurrent connections")
    parser.add_argument("--skip-large", action="store_true", help="only part (a)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-service-") as work:
        throughput(Path(work), args.clients, args.duration)
        if not args.skip_large:
            overhead(Path(work))


if __name__ == "__main__":
    main()
