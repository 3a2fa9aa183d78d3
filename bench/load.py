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

This module holds the command line and the run's timeline; the parts live in

    bench/_load_captures.py    writing every capture beforehand, checking them all after
    bench/_load_connection.py  one keep-alive HTTP/1.1 connection, finalize-answer decoding
    bench/_load_traffic.py     the small clients, the large-rollout loop, the phases
    bench/_load_rss.py         the service's process tree: RSS sampling, who served what
    bench/_load_report.py      the printed report and the targets
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import math
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path

from bench._common import running_service
from bench._load_captures import check_captures, write_pool
from bench._load_report import RunResult, report, service_log_problems
from bench._load_rss import RssSampler, wait_for_workers
from bench._load_traffic import Traffic

WORKERS = 2
WARMUP_S = 3.0
# The warm-up repeats large finalizes until every worker has served one (each
# worker's first one allocates for good what later ones reuse), up to this many.
WARM_LARGE_MAX = 2 * WORKERS
# Quiet time before the start and end RSS samples, so that both are taken
# with no request in flight and compare what the workers retain.
SETTLE_S = 1.0


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
                traffic = Traffic(service.port, wait_for_workers(sampler, WORKERS), decoder)
                result = asyncio.run(drive(traffic, sampler, args, small_ids, large_ids))
        check = check_captures(capture_dir, small_ids + large_ids, traffic.outcomes)
        passed = report(args, result, traffic, check, service_log_problems(log_path))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
