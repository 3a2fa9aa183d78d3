"""The hot-path bench's tables and the summary of a py-spy profile of the store server."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._hotpath_driver import SideSamples

__all__ = [
    "GROWTH_COLUMNS",
    "MAIN_COLUMNS",
    "TRACED_PREFIX",
    "Row",
    "goal_summary",
    "growth_table",
    "main_tables",
    "percentile",
    "profile_summary",
    "tracing_table",
]

Metric = Callable[[SideSamples, int], float]


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile; NaN when there are no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _last_tenth(samples: SideSamples, calls: int) -> list[float]:
    """Capture samples of the rollouts' last tenth of calls (the longest contexts)."""
    first = calls - max(1, calls // 10)
    return [ms for ms, turn in zip(samples.capture, samples.turns, strict=True) if turn >= first]


MAIN_COLUMNS: dict[str, Metric] = {
    "capture p50": lambda s, _: _median(s.capture),
    "capture p99": lambda s, _: percentile(s.capture, 0.99),
    "resolve p50": lambda s, _: _median(s.resolve),
    "resolve p99": lambda s, _: percentile(s.resolve, 0.99),
    "begin p50": lambda s, _: _median(s.begin),
    "put p50": lambda s, _: _median(s.put),
    "put p99": lambda s, _: percentile(s.put, 0.99),
    "alone p50": lambda s, _: _median(s.alone),
    "burst p50": lambda s, _: _median(s.burst),
    "burst p99": lambda s, _: percentile(s.burst, 0.99),
}
GROWTH_COLUMNS: dict[str, Metric] = {
    "alone p50": lambda s, _: _median(s.alone),
    "capture p50": lambda s, _: _median(s.capture),
    "capture p99": lambda s, _: percentile(s.capture, 0.99),
    "last 10% p50": lambda s, calls: _median(_last_tenth(s, calls)),
}


@dataclass(frozen=True, slots=True)
class Row:
    """One side's samples for one workload; `baseline` marks the row ratios divide by."""

    layout: str
    side: str
    calls: int
    samples: SideSamples
    baseline: bool = False


def _ratio(value: float, base: float, digits: int = 1) -> str:
    return f"{value / base:.{digits}f}x" if base > 0 else "-"


def main_tables(rows: Sequence[Row]) -> list[str]:
    """Latencies (ms) per side and layout, then each side's ratios to its layout's baseline."""
    names = list(MAIN_COLUMNS)
    head = f"{'layout':<6} {'side':<13}" + "".join(f"{name:>12}" for name in names)
    lines = [head + f"{'wall s':>9}"]
    for row in rows:
        values = [metric(row.samples, row.calls) for metric in MAIN_COLUMNS.values()]
        cells = "".join(f"{value:>12.1f}" for value in values)
        lines.append(f"{row.layout:<6} {row.side:<13}{cells}{row.samples.capture_wall_s:>9.1f}")
    lines += ["", "ratio to the baseline (same layout):", head]
    for row in rows:
        base = next((b for b in rows if b.baseline and b.layout == row.layout), None)
        if base is None or row is base:
            continue
        cells = "".join(
            f"{_ratio(metric(row.samples, row.calls), metric(base.samples, base.calls)):>12}"
            for metric in MAIN_COLUMNS.values()
        )
        lines.append(f"{row.layout:<6} {row.side:<13}{cells}")
    return lines


def growth_table(rows: Sequence[Row]) -> list[str]:
    """Per rollout length: latencies (ms) with each side's ratio to the baseline in brackets."""
    lines = [
        f"{'calls':>5} {'layout':<6} {'side':<13}" + "".join(f"{n:>18}" for n in GROWTH_COLUMNS)
    ]
    for row in rows:
        base = next(
            (b for b in rows if b.baseline and b.layout == row.layout and b.calls == row.calls),
            None,
        )
        cells = ""
        for metric in GROWTH_COLUMNS.values():
            value = metric(row.samples, row.calls)
            ratio = (
                ""
                if base is None or base is row
                else f" ({_ratio(value, metric(base.samples, base.calls))})"
            )
            cells += f"{f'{value:.1f}{ratio}':>18}"
        lines.append(f"{row.calls:>5} {row.layout:<6} {row.side:<13}{cells}")
    return lines


# A served side run with tracing on (`--tracing sdk`) is named `traced BACKEND`, its
# plain twin `ours BACKEND` (bench/hotpath.py).
TRACED_PREFIX = "traced "
_PLAIN_PREFIX = "ours "


def _cpu_ms_per_call(cpu_s: float, samples: SideSamples) -> float:
    return 1000.0 * cpu_s / len(samples.capture) if samples.capture else float("nan")


# Per traced side: the capture p50 off and on, what a call added, CPU per call of the
# store server and of the client process, then capture's ratios (on / off).
TRACING_HEAD = (
    f"{'layout':<6} {'backend':<8}{'off p50':>9}{'sdk p50':>9}{'+ms/call':>10}"
    f"{'server CPU ms/call':>20}{'client CPU ms/call':>20}{'p50 ratio':>11}{'p99 ratio':>11}"
)


def _twin(rows: Sequence[Row], row: Row) -> Row | None:
    """The plain run of a traced row: same layout, backend and length."""
    plain = _PLAIN_PREFIX + row.side.removeprefix(TRACED_PREFIX)
    return next(
        (o for o in rows if (o.layout, o.side, o.calls) == (row.layout, plain, row.calls)), None
    )


def tracing_table(rows: Sequence[Row]) -> list[str]:
    """Each traced side against its plain twin: latency and CPU per call, off and on."""
    lines = [TRACING_HEAD]
    for row in rows:
        plain = _twin(rows, row) if row.side.startswith(TRACED_PREFIX) else None
        if plain is None:
            continue
        off, on = plain.samples, row.samples
        p50_off, p50_on = _median(off.capture), _median(on.capture)
        server = (_cpu_ms_per_call(s.server_cpu_s, s) for s in (off, on))
        client = (_cpu_ms_per_call(s.client_cpu_s, s) for s in (off, on))
        p99 = _ratio(percentile(on.capture, 0.99), percentile(off.capture, 0.99), 2)
        lines.append(
            f"{row.layout:<6} {row.side.removeprefix(TRACED_PREFIX):<8}"
            f"{p50_off:>9.2f}{p50_on:>9.2f}{p50_on - p50_off:>+10.2f}"
            f"{' -> '.join(f'{ms:.3f}' for ms in server):>20}"
            f"{' -> '.join(f'{ms:.3f}' for ms in client):>20}"
            f"{_ratio(p50_on, p50_off, 2):>11}{p99:>11}"
        )
    return lines


# The capture-memory issue's goals (#27, with delta puts on the wire): capture p99,
# resolve p99 (while every rollout writes) and burst p99 (every rollout's next request
# at once) within this factor of the in-process baseline ...
GOAL_RATIO = 1.0
# ... and a resolve alone within this many milliseconds.
GOAL_ALONE_MS = 3.0


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def goal_summary(main_rows: Sequence[Row], growth_rows: Sequence[Row]) -> list[str]:
    """One line per served side and layout: each goal's figure and whether it is met.

    Growth: each side's capture p50 ratio to the baseline at every rollout
    length, shortest first; flat (or falling) means the per-call cost grows
    with the answer only, as the baseline's does.
    """
    lines = [
        f"goals: capture, resolve and burst p99 <= {GOAL_RATIO:g}x the baseline, "
        f"resolve alone p50 <= {GOAL_ALONE_MS:g} ms"
    ]
    for row in main_rows:
        base = next((b for b in main_rows if b.baseline and b.layout == row.layout), None)
        if base is None or row.baseline or row.side.startswith("gym"):
            continue
        capture = percentile(row.samples.capture, 0.99) / percentile(base.samples.capture, 0.99)
        resolve = percentile(row.samples.resolve, 0.99) / percentile(base.samples.resolve, 0.99)
        burst = percentile(row.samples.burst, 0.99) / percentile(base.samples.burst, 0.99)
        alone = _median(row.samples.alone)
        lines.append(
            f"  {row.layout:<5} {row.side:<10} capture p99 {capture:.1f}x "
            f"({_verdict(capture <= GOAL_RATIO)}), resolve p99 {resolve:.1f}x "
            f"({_verdict(resolve <= GOAL_RATIO)}), burst p99 {burst:.1f}x "
            f"({_verdict(burst <= GOAL_RATIO)}), alone p50 {alone:.1f} ms "
            f"({_verdict(alone <= GOAL_ALONE_MS)})"
        )
    sides = sorted({(r.layout, r.side) for r in growth_rows if not r.side.startswith("gym")})
    for layout, side in sides:
        series = []
        for row in sorted(growth_rows, key=lambda r: r.calls):
            if (row.layout, row.side) != (layout, side):
                continue
            base = next(
                (
                    b
                    for b in growth_rows
                    if b.baseline and (b.layout, b.calls) == (layout, row.calls)
                ),
                None,
            )
            if base is not None:
                ratio = _median(row.samples.capture) / _median(base.samples.capture)
                series.append(f"{row.calls}: {ratio:.1f}x")
        if series:
            lines.append(
                f"  {layout:<5} {side:<10} capture p50 ratio by length: {', '.join(series)}"
            )
    return lines


# A py-spy raw frame: "function (path/to/module.py:123)"; the line number is dropped.
_FRAME = re.compile(r"^(?P<function>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")
# Everything up to the package: site-packages, else our source roots or the standard library.
_PATH_PREFIX = re.compile(r"^.*(?:site-packages/)|^.*?(?:/service/|/client/|/lib/python3\.\d+/)")


def _short(frame: str) -> str:
    found = _FRAME.match(frame)
    if found is None:
        return frame
    return f"{found['function']} ({_PATH_PREFIX.sub('', found['path'])})"


# Innermost frames of a thread that waits for work: the event loop's poll, an idle pool thread.
_WAITING = ("EpollSelector.select (selectors.py)", "_worker (concurrent/futures/thread.py)")


def profile_summary(raw: Path, *, top: int = 15) -> list[str]:
    """The functions that hold most busy samples of a py-spy raw (collapsed stacks) file.

    Samples whose innermost frame waits for work (`_WAITING`) are counted, then
    left out of the shares. Self: share of busy samples with the function as
    the innermost frame (a C call such as fsync or a JSON parse is charged to
    the Python function that made it). Inclusive, for our own functions only
    (`token_finalizer`, the command line's entry frames left out): share of
    busy samples with the function anywhere on the stack, once per stack.
    """
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = waiting = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(frame) for frame in stack.split(";")]
        total += count
        if frames[-1] in _WAITING:
            waiting += count
            continue
        own[frames[-1]] += count
        for frame in set(frames):
            if "token_finalizer/" in frame and "token_finalizer/cli/" not in frame:
                inclusive[frame] += count
    busy = total - waiting
    if not busy:
        return [f"{raw.name}: no busy samples"]
    lines = [f"{raw.name}: {busy} busy samples of {total} (the rest wait for work)", "  self:"]
    lines += [f"    {100 * n / busy:5.1f}%  {name}" for name, n in own.most_common(top)]
    lines.append("  inclusive (ours):")
    lines += [f"    {100 * n / busy:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    return lines
