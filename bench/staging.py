"""External staging at speed: stage latency and throughput, and finalize to a verified row.

    .venv/bin/python -m bench.staging [--threads 1,64] [--rollouts 1] [--chain 4]
        [--prompt 512] [--generated 3584] [--backends dir,redis]
        [--calls 400] [--carry 400] [--call-generated 100] [--rounds 5]
        [--reference-python PY --reference-wheel DIR/nemo_gym]

1. Stage (`_staging_stage`): every thread stages `--rollouts` chains (at
   least 64 chains in all per run) of
   `--chain` calls, each a delta of `--prompt` + `--generated` tokens with
   log probabilities (4,096 tokens: about 100 KB of JSON, a long call as
   NeMo Gym 0.7's worker stages it), through one shared `HttpStagingSink` to
   `store serve` over a directory and over Redis. Reported: `stage()` p50,
   p99 and mean, records/s, beside NeMo RL's published TransferQueue put
   (1.6 ms mean, RDMA): the ratio p50 / 1.6 ms (goal: at most 2).
2. Finalize (`_staging_finalize`): a `--calls`-call rollout to a verified
   row through the finalizer and the client, against the trainer fetching
   the same snapshots through `HttpStagingSource` and running the wheel's
   `verify_and_linearize` itself (`--reference-python`, a Python 3.13 with
   pydantic and this client installed; `--reference-wheel`, the unpacked
   wheel's `nemo_gym` directory). Ratio: reference / ours (goal: at least 3);
   ours checks the chain's extras too, so a second ratio adds the reference
   doing the same check through `HttpStagingSource.fetch_extras`.

Both parts run in one invocation so the ratios are measured side by side,
under the same machine load (shown).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench._staging_finalize import finalize_servers, run_ours, run_reference, stage_rollout
from bench._staging_stage import StageRun, run_stage_bench, staging_store

TRANSFER_QUEUE_MEAN_MS = 1.6  # NeMo RL's published TransferQueue put, mean


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def _stage_line(run: StageRun) -> str:
    ratio = run.p50_ms / TRANSFER_QUEUE_MEAN_MS
    return (
        f"{run.backend:<6} {run.threads:>3} threads  {len(run.latencies):>5} stages  "
        f"p50 {run.p50_ms:8.2f} ms  p99 {run.p99_ms:8.2f} ms  mean {run.mean_ms:8.2f} ms  "
        f"{run.records_per_s:7.0f} records/s  p50/1.6ms {ratio:6.1f}x  failed {run.failures}"
    )


def _stage_part(args: argparse.Namespace) -> None:
    print(f"== stage: {args.prompt} + {args.generated} tokens per call, chains of {args.chain}")
    for backend in args.backends.split(","):
        with (
            tempfile.TemporaryDirectory() as directory,
            staging_store(backend, Path(directory)) as url,
        ):
            for threads in (int(value) for value in args.threads.split(",")):
                run = run_stage_bench(
                    url,
                    backend,
                    threads=threads,
                    # At least 64 rollouts per run, so one thread's percentiles mean something.
                    rollouts_per_thread=max(args.rollouts, 64 // threads),
                    calls=args.chain,
                    prompt=args.prompt,
                    generated=args.generated,
                )
                if threads == 1 and backend == args.backends.split(",")[0]:
                    print(f"   records of {run.mean_record_bytes / 1000:.0f} KB of JSON on average")
                print(f"   {_stage_line(run)}")


def _finalize_part(args: argparse.Namespace) -> None:
    print(
        f"== finalize: {args.calls} calls, +{args.carry} carried / +{args.call_generated} "
        f"generated each"
    )
    with tempfile.TemporaryDirectory() as directory:
        captures = Path(directory) / "capture"
        record = stage_rollout(captures, args.calls, args.carry, args.call_generated)
        with finalize_servers(captures) as (store, finalizer):
            ours = run_ours(finalizer, record, args.rounds)
            print(f"   {ours.tokens} tokens in the verified row")
            print(
                f"   ours: finalize through the client      best {ours.best_ms():8.1f} ms  "
                f"median {ours.median_ms():8.1f} ms"
            )
            if not (args.reference_python and args.reference_wheel):
                print("   reference: not run (give --reference-python and --reference-wheel)")
                return
            reference = run_reference(
                args.reference_python, args.reference_wheel, store, record, args.rounds
            )
    if (reference.tokens, reference.ids_sha256) != (ours.tokens, ours.ids_sha256):
        raise SystemExit("the reference verified a different row")
    for step in ("manifest", "fetch", "verify"):
        print(
            f"   reference: {step:<8}                    best {reference.best_ms(step):8.1f} ms  "
            f"median {reference.median_ms(step):8.1f} ms"
        )
    print(
        f"   reference: total                       best {reference.best_ms():8.1f} ms  "
        f"median {reference.median_ms():8.1f} ms"
    )
    print(
        f"   reference: + extras check              best {reference.best_ms('extras'):8.1f} ms  "
        f"median {reference.median_ms('extras'):8.1f} ms"
    )
    ratio = reference.best_ms() / ours.best_ms()
    print(f"   ratio reference / ours = {ratio:5.1f}x (best of {args.rounds}; goal >= 3x)")
    same_work = (reference.best_ms() + reference.best_ms("extras")) / ours.best_ms()
    print(f"   ratio with the extras check on both sides = {same_work:5.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,64")
    parser.add_argument("--rollouts", type=int, default=1)
    parser.add_argument("--chain", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--generated", type=int, default=3584)
    parser.add_argument("--backends", default="dir,redis")
    parser.add_argument("--calls", type=int, default=400, help="0: no finalize part")
    parser.add_argument("--carry", type=int, default=400)
    parser.add_argument("--call-generated", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reference-python")
    parser.add_argument("--reference-wheel", type=Path)
    parser.add_argument("--skip-stage", action="store_true")
    args = parser.parse_args()
    print(f"machine: {_load()}")
    if not args.skip_stage:
        _stage_part(args)
    if args.calls > 0:
        _finalize_part(args)
    print(f"machine after: {_load()}")


if __name__ == "__main__":
    main()
