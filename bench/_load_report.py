"""bench.load, the report: the traffic table, captures, memory, and the targets.

Count and latencies cover every request of the measured phase, the ones still
in flight at the stop included; "per s" counts the answers that came before
the stop.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from bench._load_captures import CaptureCheck
from bench._load_rss import RssSample
from bench._load_traffic import CycleStats, Traffic

__all__ = ["RSS_GROWTH_TARGET", "RSS_TREND_PARTS", "RunResult", "report", "service_log_problems"]

RSS_GROWTH_TARGET = 0.10
RSS_TREND_PARTS = 5  # growth that levels off vs growth that goes on


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


def service_log_problems(path: Path) -> list[str]:
    """The ERROR and Traceback lines of the service's own log (its stderr)."""
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
