"""A full Redis store: capture work per model call while it is full, with and without the mark.

    python -m bench.full_store [--maxmemory 64mb] [--rollouts 8] [--calls 40] [--full-calls 40]

A private `redis-server` (`maxmemory`, noeviction), `store serve` over it,
and writers (HttpTokenSink + HttpLineageResolver, one 0.7 model server per
rollout at once) that fill it past the high-water mark; then the finished
rollouts are frozen and retired and one more rollout is written. Side by
side in one run: the mark at 0.9 (the default) and the mark off (only
Redis's own OOM refuses, the baseline). Reported: capture work per call
before the store filled (p90, the machine's own pace) and p50 / p90 / max
while it is full (goal: p90 <= 50 ms; 0.4.0 measured
29 s), the 507s, any other error (there must be none), the retires, and
whether writes resumed. See docs/capacity.md.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from bench._full_store_run import FullStoreRun, full_store_run
from bench._hotpath_workload import Workload

_GOAL_P90_MS = 50.0


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    if not samples:
        return (float("nan"),) * 3
    values = np.asarray(samples)
    return float(np.percentile(values, 50)), float(np.percentile(values, 90)), float(values.max())


def report(runs: list[FullStoreRun]) -> list[str]:
    """The table of the runs, the ratio of each to the first, and the goal's verdict."""
    lines = [
        f"{'mode':<22} {'before':>6} {'p90':>6} {'full':>6} {'p50 ms':>8} {'p90 ms':>8} "
        f"{'max ms':>8} {'507s':>6} {'errors':>6} {'retired':>8} {'resumed':>8} health",
    ]
    base = _percentiles(runs[0].capture_full_ms)
    for run in runs:
        p50, p90, top = _percentiles(run.capture_full_ms)
        before_p90 = _percentiles(run.capture_before_ms)[1]
        lines.append(
            f"{run.mode:<22} {len(run.capture_before_ms):>6} {before_p90:>6.1f} "
            f"{len(run.capture_full_ms):>6} "
            f"{p50:>8.1f} {p90:>8.1f} {top:>8.1f} {run.refused_507:>6} "
            f"{len(run.other_errors):>6} {run.retired:>5}/{run.retired + run.retire_failures:<2} "
            f"{'yes' if run.resumed else 'NO':>8} {run.health_when_full}"
        )
    for run in runs:
        p50, p90, top = _percentiles(run.refusal_ms)
        lines.append(
            f"refused write alone ({run.mode}): p50 {p50:.1f} ms, p90 {p90:.1f} ms, "
            f"max {top:.1f} ms over {len(run.refusal_ms)} 507s"
        )
    for run in runs:
        full_p90 = _percentiles(run.capture_full_ms)[1]
        before_p90 = _percentiles(run.capture_before_ms)[1]
        lines.append(
            f"ratio {run.mode}: capture p90 while full / before full {full_p90 / before_p90:.2f}x"
        )
    for run in runs[1:]:
        p50, p90, top = _percentiles(run.capture_full_ms)
        lines.append(
            f"ratio {run.mode} / {runs[0].mode}: p50 {p50 / base[0]:.2f}x, "
            f"p90 {p90 / base[1]:.2f}x, max {top / base[2]:.2f}x"
        )
    for run in runs:
        p90 = _percentiles(run.capture_full_ms)[1]
        verdict = "met" if p90 <= _GOAL_P90_MS else "NOT met"
        lines.append(f"goal {run.mode}: capture p90 while full {p90:.1f} ms <= 50 ms: {verdict}")
        lines.extend(f"  error: {error}" for error in run.other_errors[:5])
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maxmemory", default="64mb", help="the Redis's maxmemory (64mb)")
    parser.add_argument("--rollouts", type=int, default=8, help="writers at once (8)")
    parser.add_argument("--calls", type=int, default=40, help="calls per rollout (40)")
    parser.add_argument(
        "--full-calls", type=int, default=40, help="calls per writer while full (40)"
    )
    parser.add_argument("--delta", action="store_true", help="Gym delta records (default full)")
    args = parser.parse_args()
    workload = Workload(rollouts=args.rollouts, calls=args.calls, delta=args.delta)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-full-store-") as directory:
        for mark in ("0.9", "off"):
            runs.append(
                full_store_run(
                    Path(directory) / mark,
                    mark=mark,
                    maxmemory=args.maxmemory,
                    workload=workload,
                    full_calls=args.full_calls,
                )
            )
    print(
        f"full store: {args.rollouts} writers x {args.calls} calls ({workload.layout} prompts, "
        f"+{workload.new_prompt_tokens}/+{workload.new_generation_tokens} a turn), "
        f"maxmemory {args.maxmemory}, {args.full_calls} calls per writer while full"
    )
    print("\n".join(report(runs)))


if __name__ == "__main__":
    main()
