"""Bytes a capture costs at rest, by layout and backend, against the information it holds.

    .venv/bin/python -m bench.footprint [--rollouts 4] [--calls 100]
        [--backends dir,redis,cluster] [--log-probs f32,f64]

Agent rollouts as a NeMo Gym 0.7 model server writes them (`bench/_hotpath_workload.py`:
+400 prompt / +100 generated tokens a turn), full prompts (0.7's default) and delta
records, written through our `HttpTokenSink` + `HttpLineageResolver` into
`token-finalizer store serve` over a directory, over Redis (a key prefix of the test
Redis) and over a private 3-primary Redis Cluster, and into the in-process stand-in of
Gym's own file store (`bench/_gym_baseline.py`). Log probs are float32 values, as an
engine sampling in float32 reports them; `--log-probs f64` adds doubles that are not.

Printed per side and layout: bytes at rest per rollout (a directory: every file of the
rollout; Redis: `MEMORY USAGE` of every key of the rollout, on every primary of a cluster)
and the ratio to the floor
(distinct ids x 4 B + generated log probs x 4 B), then the wire bytes of the last call's
put body: the full prompt, what our sink sends for it (a delta put), and Gym's delta
record. See docs/store-protocol.md#packed-at-rest and #delta-put.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import redis

from bench._common import staged_chain
from bench._gym_baseline import stamp_entry
from bench._hotpath_driver import run_side
from bench._hotpath_sides import HttpSide, StandInSide
from bench._hotpath_workload import Workload
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.redis_cluster import RedisCluster
from tests.support.servers import free_port, running_process
from token_finalizer_client import HttpStagingSink, HttpTokenSink

BACKENDS = ("dir", "redis", "cluster")
LOG_PROBS = ("f32", "f64")
LAYOUTS = ("full", "delta", "staged")


@dataclass(frozen=True, slots=True)
class Footprint:
    side: str
    layout: str
    log_probs: str
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


def redis_bytes(urls: list[str], prefix: str) -> int:
    """`MEMORY USAGE` of every key under `prefix` on each of the nodes `urls` name."""
    total = 0
    for url in urls:
        client = redis.Redis.from_url(url)
        try:
            for key in client.scan_iter(match=f"{prefix}*", count=1000):
                total += int(client.memory_usage(key, samples=0) or 0)
        finally:
            client.close()
    return total


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a served store keeps its data: a directory, or a key prefix on Redis nodes."""

    directory: Path | None = None
    prefix: str = ""
    nodes: tuple[str, ...] = ()

    def bytes_at_rest(self) -> int:
        if self.directory is not None:
            return directory_bytes(self.directory)
        return redis_bytes(list(self.nodes), self.prefix)


@contextlib.contextmanager
def _served(backend: str, url: str, cluster: RedisCluster | None) -> Iterator[tuple[str, _Place]]:
    """`store serve` over a fresh directory or key prefix: its URL and where it keeps data."""
    port = free_port()
    serve = ["store", "serve", "--port", str(port)]
    with contextlib.ExitStack() as stack:
        if backend == "dir":
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="footprint-")))
            place = _Place(directory=directory)
            serve += ["--dir", str(directory)]
        elif backend == "redis":
            prefix = stack.enter_context(unique_prefix(url, "footprint"))
            place = _Place(prefix=prefix, nodes=(url,))
            serve += ["--redis", url, "--key-prefix", place.prefix]
        else:
            assert cluster is not None
            nodes = tuple(node.url for node in cluster.primaries_now())
            place = _Place(prefix=f"footprint-{uuid.uuid4().hex[:8]}:", nodes=nodes)
            serve += ["--redis", cluster.seed_urls[0], "--redis-cluster"]
            serve += ["--key-prefix", place.prefix]
        stack.enter_context(running_process(serve, port=port))
        yield f"http://127.0.0.1:{port}", place


@contextlib.asynccontextmanager
async def _http_side(url: str) -> AsyncIterator[HttpSide]:
    side = HttpSide(url)
    try:
        yield side
    finally:
        await side.close()


def staged_footprints(
    workload: Workload, backends: tuple[str, ...], url: str, cluster: RedisCluster | None
) -> list[Footprint]:
    """External staging: each call's staged delta through `HttpStagingSink` (no ledger rows)."""
    floor = floor_bytes(workload)
    found = []
    for backend in backends:
        with _served(backend, url, cluster) as (base, place):
            with HttpStagingSink(base, timeout=60.0) as sink:
                for index in range(workload.rollouts):
                    for record in _staged_rollout(workload, index):
                        result = sink.stage(record.to_json())
                        assert result.ok, result.error
            total = place.bytes_at_rest()
        shape = ("staged", workload.log_probs)
        found.append(Footprint(f"ours {backend}", *shape, total / workload.rollouts, floor))
    return found


def _staged_rollout(workload: Workload, index: int) -> list[Any]:
    chain = staged_chain(
        f"footprint-staged-{workload.log_probs}-{index:03d}",
        workload.calls,
        workload.new_prompt_tokens,
        workload.new_generation_tokens,
        seed=workload.seed + index,
        weight_version=1,
        float32_log_probs=workload.log_probs == "f32",
    )
    return list(chain)


async def measure(
    workload: Workload, backends: tuple[str, ...], url: str, cluster: RedisCluster | None
) -> list[Footprint]:
    """Every side's footprint for one layout."""
    floor = floor_bytes(workload)
    shape = (workload.layout, workload.log_probs)
    found = []
    with tempfile.TemporaryDirectory(prefix="footprint-gym-") as directory:
        await run_side(StandInSide(Path(directory)), workload, burst_rounds=0)
        total = directory_bytes(Path(directory))
        found.append(Footprint("gym stand-in", *shape, total / workload.rollouts, floor))
    for backend in backends:
        with _served(backend, url, cluster) as (base, place):
            async with _http_side(base) as side:
                await run_side(side, workload, burst_rounds=0)
            total = place.bytes_at_rest()
        found.append(Footprint(f"ours {backend}", *shape, total / workload.rollouts, floor))
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
        f"{'side':<14} {'layout':<6} {'logprob':<7} {'MB/rollout':>11} {'x floor':>8}",
    ]
    for row in rows:
        lines.append(
            f"{row.side:<14} {row.layout:<6} {row.log_probs:<7} "
            f"{row.bytes_per_rollout / 1e6:>11.3f} {row.ratio:>8.2f}"
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
    parser.add_argument("--log-probs", default="f32", help="f32, f64 or both (f32,f64)")
    args = parser.parse_args()
    backends = _choices(parser, "--backends", args.backends, BACKENDS)
    kinds = _choices(parser, "--log-probs", args.log_probs, LOG_PROBS)
    url = find_redis_url()
    rows: list[Footprint] = []
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(RedisCluster()) if "cluster" in backends else None
        for kind in kinds:
            for layout in LAYOUTS:
                workload = Workload(args.rollouts, args.calls, layout == "delta", log_probs=kind)
                if layout == "staged":
                    rows.extend(staged_footprints(workload, backends, url, cluster))
                else:
                    rows.extend(asyncio.run(measure(workload, backends, url, cluster)))
    workload = Workload(args.rollouts, args.calls, False)
    print(report(rows, wire_bytes(workload), workload))


def _choices(
    parser: argparse.ArgumentParser, flag: str, given: str, known: tuple[str, ...]
) -> tuple[str, ...]:
    chosen = tuple(name for name in given.split(",") if name)
    if not chosen or set(chosen) - set(known):
        parser.error(f"{flag}: choose from {', '.join(known)}")
    return chosen


if __name__ == "__main__":
    main()
