"""Bytes a capture costs at rest, by layout and backend, against the information it holds.

    .venv/bin/python -m bench.footprint [--rollouts 4] [--calls 100] [--backends dir,redis]

Agent rollouts as a NeMo Gym 0.7 model server writes them (`bench/_hotpath_workload.py`:
+400 prompt / +100 generated tokens a turn), full prompts (0.7's default) and delta
records, written through our `HttpTokenSink` + `HttpLineageResolver` into
`token-finalizer store serve` over a directory and over Redis (a key prefix of the test
Redis), and into the in-process stand-in of Gym's own file store (`bench/_gym_baseline.py`).

Printed per side and layout: bytes at rest per rollout (a directory: every file of the
rollout; Redis: `MEMORY USAGE` of every key of the rollout) and the ratio to the floor
(distinct ids x 4 B + generated log probs x 4 B), then the wire bytes of the last call's
put body: the full prompt, what our sink sends for it (a delta put), and Gym's delta
record. See docs/store-protocol.md#packed-at-rest and #delta-put.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import redis

from bench._gym_baseline import stamp_entry
from bench._hotpath_driver import run_side
from bench._hotpath_sides import HttpSide, StandInSide
from bench._hotpath_workload import Workload
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.servers import free_port, running_process
from token_finalizer_client import HttpTokenSink

BACKENDS = ("dir", "redis")
LAYOUTS = ("full", "delta")


@dataclass(frozen=True, slots=True)
class Footprint:
    side: str
    layout: str
    bytes_per_rollout: float
    floor_per_rollout: float

    @property
    def ratio(self) -> float:
        return self.bytes_per_rollout / self.floor_per_rollout


def floor_bytes(workload: Workload) -> int:
    """The information of one rollout: its distinct ids and generated log probs, 4 B each."""
    per_turn = workload.new_prompt_tokens + workload.new_generation_tokens
    return workload.calls * per_turn * 4 + workload.calls * workload.new_generation_tokens * 4


def directory_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.iterdir() if path.is_file())


def redis_bytes(url: str, prefix: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        total = 0
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            total += int(client.memory_usage(key, samples=0) or 0)
        return total
    finally:
        client.close()


@contextlib.contextmanager
def _served(backend: str, url: str) -> Iterator[tuple[str, Path | str]]:
    """`store serve` over a fresh directory or key prefix: its URL and where it keeps data."""
    port = free_port()
    serve = ["store", "serve", "--port", str(port)]
    with contextlib.ExitStack() as stack:
        where: Path | str
        if backend == "dir":
            where = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="footprint-")))
            serve += ["--dir", str(where)]
        else:
            where = stack.enter_context(unique_prefix(url, "footprint"))
            serve += ["--redis", url, "--key-prefix", where]
        stack.enter_context(running_process(serve, port=port))
        yield f"http://127.0.0.1:{port}", where


@contextlib.asynccontextmanager
async def _http_side(url: str) -> AsyncIterator[HttpSide]:
    side = HttpSide(url)
    try:
        yield side
    finally:
        await side.close()


async def measure(workload: Workload, backends: tuple[str, ...], url: str) -> list[Footprint]:
    """Every side's footprint for one layout."""
    floor = floor_bytes(workload)
    found = []
    with tempfile.TemporaryDirectory(prefix="footprint-gym-") as directory:
        await run_side(StandInSide(Path(directory)), workload, burst_rounds=0)
        total = directory_bytes(Path(directory))
        found.append(Footprint("gym stand-in", workload.layout, total / workload.rollouts, floor))
    for backend in backends:
        with _served(backend, url) as (base, where):
            async with _http_side(base) as side:
                await run_side(side, workload, burst_rounds=0)
            total = directory_bytes(where) if isinstance(where, Path) else redis_bytes(url, where)
        per_rollout = total / workload.rollouts
        found.append(Footprint(f"ours {backend}", workload.layout, per_rollout, floor))
    return found


def wire_bytes(workload: Workload) -> tuple[int, int, int]:
    """The put body of one rollout's last call: the full prompt, what our sink sends for it
    (its parent's prefix by reference + the suffix), and Gym's own delta record."""
    sizes = []
    for delta in (False, True):
        script = Workload(1, workload.calls, delta).scripts()[0]
        parent = None
        call = script.next_call()
        for _ in range(workload.calls - 1):
            parent = call
            call = script.next_call()
        assert parent is not None
        cumulative = parent.prompt_token_ids + parent.generation_token_ids
        resolution = _Resolved(_Match(parent.model_call_id, cumulative))
        payload = stamp_entry(call, resolution, delta).model_dump(mode="json")
        sizes.append(len(orjson.dumps(payload)))
        if not delta:
            sink = HttpTokenSink(url="http://127.0.0.1:9")  # never connects: only builds
            sink._sent.keep(call.rollout_id, parent.model_call_id, tuple(cumulative))
            body = sink._delta_body(call.rollout_id, payload)
            assert body is not None
            sizes.append(len(orjson.dumps(body)))
    return sizes[0], sizes[1], sizes[2]


@dataclass(frozen=True, slots=True)
class _Match:
    model_call_id: str
    cumulative_token_ids: list[int]


@dataclass(frozen=True, slots=True)
class _Resolved:
    match: _Match
    status: str = "resolved"
    reason: str = ""


def report(rows: list[Footprint], wire: tuple[int, int, int], workload: Workload) -> str:
    lines = [
        f"footprint: {workload.rollouts} rollouts x {workload.calls} calls, "
        f"+{workload.new_prompt_tokens}/+{workload.new_generation_tokens} tokens a turn; "
        f"floor {rows[0].floor_per_rollout / 1e6:.3f} MB a rollout",
        f"{'side':<14} {'layout':<6} {'MB/rollout':>11} {'x floor':>8}",
    ]
    for row in rows:
        lines.append(
            f"{row.side:<14} {row.layout:<6} {row.bytes_per_rollout / 1e6:>11.3f} {row.ratio:>8.2f}"
        )
    full, sent, delta = wire
    lines.append(
        f"wire: last call's put body {full / 1e3:.1f} KB full prompt; our sink sends "
        f"{sent / 1e3:.1f} KB for it (delta put), {sent / delta:.2f}x Gym's "
        f"{delta / 1e3:.1f} KB delta record"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    args = parser.parse_args()
    backends = tuple(name for name in args.backends.split(",") if name)
    if set(backends) - set(BACKENDS):
        raise SystemExit(f"--backends: choose from {', '.join(BACKENDS)}")
    url = find_redis_url()
    rows: list[Footprint] = []
    for layout in LAYOUTS:
        workload = Workload(args.rollouts, args.calls, layout == "delta")
        rows.extend(asyncio.run(measure(workload, backends, url)))
    workload = Workload(args.rollouts, args.calls, False)
    print(report(rows, wire_bytes(workload), workload))


if __name__ == "__main__":
    main()
