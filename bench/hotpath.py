"""The model server's hot path: capture work per call via `store serve` vs NeMo Gym 0.7's store.

    .venv/bin/python -m bench.hotpath [--backends dir,redis] [--layouts delta,full]
        [--rollouts 64] [--calls 50] [--burst-rounds 5]
        [--growth-sizes 10,50,200] [--growth-rollouts 8] [--tracing off,sdk] [--quick]
        [--gym-python PY --gym-wheel DIR] [--profile DIR]

A NeMo Gym 0.7 model server that writes through our store (`HttpTokenSink` +
`HttpLineageResolver` -> `token-finalizer store serve`) waits, for every
model call, for one `lineage/resolve`, one `begin_call` and one `put`. This
bench replays agent rollouts as such a server does (`bench/_hotpath_driver.py`):
every rollout at once, each call sending the conversation so far, each turn
adding 400 prompt and 100 generated tokens, the entry stamped with its
lineage, fingerprints, cum_len and digest, and (layout `delta`) a delta
prompt when resolved; layout `full` keeps every prompt whole (0.7's default).

Sides, each in a fresh store:
- `gym stand-in` (the baseline): 0.7's file store + FileLineageStore in the
  model-server process, as `bench/_gym_baseline.py` re-implements them.
- `gym wheel` (with `--gym-python PY --gym-wheel DIR`): the real 0.7.0 wheel
  under PY (Python >= 3.13 with pydantic, orjson, numpy), DIR being the
  unpacked wheel's `nemo_gym` directory; it then is the baseline, and the
  stand-in's ratio to it says how faithful the stand-in is.
- `ours dir`, `ours redis`: `store serve --dir` / `--redis --key-prefix`, a
  real process on loopback (the Redis of the tests, `$TOKEN_FINALIZER_TEST_REDIS_URL`
  or 127.0.0.1:6379).
- `traced dir`, `traced redis` (with `--tracing` naming `sdk`): the same with
  OpenTelemetry on, each call within the caller's span and the store server
  exporting its spans over OTLP/HTTP to a receiver on loopback
  (bench/_hotpath_tracing.py; needs the `otel` extra). `--tracing off,sdk`
  runs both, one after the other per backend, and prints the overhead table:
  each figure traced / plain (docs/tracing.md#cost).

Figures (milliseconds; ratios = side / baseline of the same layout):
- capture p50/p99: resolve + begin_call + put of one call, over every call of
  `--rollouts` rollouts x `--calls` calls written at once; resolve, begin and
  put separately too.
- alone p50: resolving each rollout's next request (turn calls + 1) one at a
  time, nothing else running; burst p50/p99: all rollouts' next requests at
  once, `--burst-rounds` times.
- growth: `--growth-rollouts` rollouts at once of each `--growth-sizes`
  length, both layouts: resolve alone, capture p50/p99 and the capture p50 of
  the last tenth of the calls (the longest contexts). A per-call cost that
  re-reads the rollout grows with calls x context; the baseline's does not.

The goals (issue 27, delta puts on the wire): capture, resolve and burst p99 at 64
rollouts each <= 1x the baseline, resolve alone <= 3 ms, ratios flat in the
rollout's length; the goal summary says which goal each side meets.
`--profile DIR` samples each store server with py-spy during the main runs
and prints where its time goes. The client, the store
server, Redis and the baseline share the machine; the load average is printed
with the results. `--quick`: 8 rollouts x 10 calls, growth 5 and 20 calls at 2
rollouts, 2 burst rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench._hotpath_driver import SideSamples, run_side
from bench._hotpath_report import (
    TRACED_PREFIX,
    Row,
    goal_summary,
    growth_table,
    main_tables,
    profile_summary,
    tracing_table,
)
from bench._hotpath_sides import BACKENDS, served_side, standin_side
from bench._hotpath_tracing import TRACING_MODES, caller_scope, otlp_receiver_process, tracing_env
from bench._hotpath_wheel import run_wheel
from bench._hotpath_workload import Workload
from tests.support.redis import redis_url as find_redis_url

LAYOUTS = ("delta", "full")
STANDIN = "gym stand-in"
WHEEL = "gym wheel"


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if sorted(set(names) - set(allowed)):
        raise SystemExit(f"{what}: choose from {', '.join(allowed)} (comma-separated)")
    return names


def _sizes(text: str) -> list[int]:
    return [int(size) for size in text.split(",") if size.strip()]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default="dir,redis", help="ours: dir, redis ('': none)")
    parser.add_argument("--layouts", default="delta,full", help="delta, full")
    parser.add_argument("--rollouts", type=int, default=64, help="rollouts writing at once")
    parser.add_argument("--calls", type=int, default=50, help="calls per rollout")
    parser.add_argument("--burst-rounds", type=int, default=5, help="rounds of resolve bursts")
    parser.add_argument("--growth-sizes", default="10,50,200", help="'' skips the growth table")
    parser.add_argument("--growth-rollouts", type=int, default=8, help="at once, in growth runs")
    parser.add_argument("--new-prompt-tokens", type=int, default=400, help="per turn")
    parser.add_argument("--new-generation-tokens", type=int, default=100, help="per turn")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--gym-python", help="a Python >= 3.13 to run the real 0.7.0 wheel")
    parser.add_argument("--gym-wheel", type=Path, help="the unpacked wheel's nemo_gym directory")
    parser.add_argument("--profile", type=Path, help="py-spy the store servers into this dir")
    parser.add_argument("--tracing", default="off", help="off, sdk: each served side per mode")
    args = parser.parse_args()
    args.backends = _names(args.backends, BACKENDS, "--backends")
    args.layouts = _names(args.layouts, LAYOUTS, "--layouts") or list(LAYOUTS)
    args.tracing = _names(args.tracing, TRACING_MODES, "--tracing") or ["off"]
    if "sdk" in args.tracing and importlib.util.find_spec("opentelemetry.sdk") is None:
        parser.error("--tracing sdk needs the OpenTelemetry SDK: pip install -e '.[otel]'")
    args.growth_sizes = _sizes(args.growth_sizes)
    if args.quick:
        args.rollouts, args.calls, args.burst_rounds = 8, 10, 2
        args.growth_sizes, args.growth_rollouts = [5, 20], 2
    if (args.gym_python is None) != (args.gym_wheel is None):
        parser.error("--gym-python and --gym-wheel go together")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    return args


def _load() -> str:
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Bench:
    """Runs every side over one workload and keeps the rows for the tables."""

    def __init__(self, args: argparse.Namespace, redis_url: str, otlp: str | None) -> None:
        self.args = args
        self.redis_url = redis_url
        self.otlp = otlp  # the OTLP receiver's endpoint when a mode traces
        self.profiles: list[Path] = []

    def workload(self, rollouts: int, calls: int, layout: str) -> Workload:
        return Workload(
            rollouts=rollouts,
            calls=calls,
            delta=layout == "delta",
            new_prompt_tokens=self.args.new_prompt_tokens,
            new_generation_tokens=self.args.new_generation_tokens,
        )

    def _timed(self, name: str, workload: Workload, run: Callable[[], SideSamples]) -> SideSamples:
        start = time.perf_counter()
        samples = run()
        _progress(
            f"  {workload.layout:<5} {workload.rollouts}x{workload.calls} {name:<13} "
            f"{time.perf_counter() - start:7.1f} s  (load {_load()})"
        )
        return samples

    def _standin(self, workload: Workload, burst_rounds: int) -> SideSamples:
        with standin_side() as side:
            return asyncio.run(run_side(side, workload, burst_rounds=burst_rounds))

    def _served(
        self,
        backend: str,
        workload: Workload,
        burst_rounds: int,
        profile: Path | None,
        traced: bool,
    ) -> SideSamples:
        env = tracing_env(self.otlp) if traced and self.otlp else None
        scope = caller_scope() if traced else None

        async def run() -> SideSamples:
            async with served_side(backend, self.redis_url, profile, env) as side:
                if scope is None:
                    return await run_side(side, workload, burst_rounds=burst_rounds)
                return await run_side(side, workload, burst_rounds=burst_rounds, scope=scope)

        return asyncio.run(run())

    def rows(self, workload: Workload, burst_rounds: int, *, profiled: bool) -> list[Row]:
        """One row per side; the wheel is the baseline when it runs, else the stand-in."""
        args, rows = self.args, []
        has_wheel = args.gym_python is not None
        if has_wheel:
            samples = self._timed(
                WHEEL,
                workload,
                lambda: run_wheel(
                    args.gym_python, args.gym_wheel, workload, burst_rounds=burst_rounds
                ),
            )
            rows.append(Row(workload.layout, WHEEL, workload.calls, samples, baseline=True))
        samples = self._timed(STANDIN, workload, lambda: self._standin(workload, burst_rounds))
        rows.append(Row(workload.layout, STANDIN, workload.calls, samples, not has_wheel))
        for backend in args.backends:
            for mode in args.tracing:
                traced = mode == "sdk"
                side = f"{TRACED_PREFIX}{backend}" if traced else f"ours {backend}"
                profile = None
                if profiled and args.profile is not None:
                    traced_part = "-sdk" if traced else ""
                    profile = args.profile / f"store-{backend}{traced_part}-{workload.layout}.txt"
                    self.profiles.append(profile)
                served = functools.partial(
                    self._served, backend, workload, burst_rounds, profile, traced
                )
                samples = self._timed(side, workload, served)
                rows.append(Row(workload.layout, side, workload.calls, samples))
        return rows


def main() -> None:
    args = _arguments()
    with contextlib.ExitStack() as stack:
        receiver = None
        if "sdk" in args.tracing and args.backends:
            receiver = stack.enter_context(otlp_receiver_process())
        bench = Bench(args, find_redis_url(), None if receiver is None else receiver.endpoint)
        command = shlex.join([Path(sys.executable).name, "-m", "bench.hotpath", *sys.argv[1:]])
        load_before = _load()
        _progress(f"{command}  (load {load_before})")
        main_rows: list[Row] = []
        for layout in args.layouts:
            workload = bench.workload(args.rollouts, args.calls, layout)
            main_rows += bench.rows(workload, args.burst_rounds, profiled=True)
        growth_rows: list[Row] = []
        for calls in args.growth_sizes:
            for layout in args.layouts:
                workload = bench.workload(args.growth_rollouts, calls, layout)
                growth_rows += bench.rows(workload, 0, profiled=False)
    print(f"command: {command}")
    print(
        f"load average (1/5/15 min): {load_before} before, {_load()} after; {os.cpu_count()} cores"
    )
    print(
        f"per call: +{args.new_prompt_tokens} prompt / +{args.new_generation_tokens} generated "
        f"tokens; all latencies in ms"
    )
    print()
    print(f"{args.rollouts} rollouts x {args.calls} calls written at once")
    print("\n".join(main_tables(main_rows)))
    if growth_rows:
        print()
        print(f"growth: {args.growth_rollouts} rollouts at once; (ratio to the baseline)")
        print("\n".join(growth_table(growth_rows)))
    if receiver is not None:
        print()
        print(
            "tracing overhead: traced / plain, same layout and backend "
            f"(p50 in ms; the store servers exported {receiver.spans} spans over OTLP/HTTP "
            "to a receiver process on loopback; the caller's spans are exported nowhere)"
        )
        print("\n".join(tracing_table(main_rows)))
    print()
    print("\n".join(goal_summary(main_rows, growth_rows)))
    for profile in bench.profiles:
        print()
        print("\n".join(profile_summary(profile)))


if __name__ == "__main__":
    main()
