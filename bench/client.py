"""The client and the offline batch command against a live service on loopback.

    .venv/bin/python -m bench.client [--records 48] [--repeats 3]
    .venv/bin/python -m bench.client --overhead-only [--match-ids 25000] [--concurrency 64]

Part 1: one finalize of the 5M-token rollout (100 calls x 1,000 new tokens per
turn) through `FinalizerClient`, answer zstd-compressed (the default) vs
uncompressed: wall time and bytes on the wire.

Part 2: `AsyncFinalizerClient.finalize_many` over a batch of medium rollouts,
one request at a time vs 8 at a time.

Part 3: `token-finalizer finalize` over the same batch as a JSONL file, in
this process (`--config`) vs through the service (`--server`).

Part 4: the store clients' own cost per call (bench/_client_overhead.py),
against a canned store in another process: `HttpLineageResolver` with the
match's `--match-ids` ids answered plain vs compact (`?tokens=compact`), each
with orjson vs the stdlib, alone and at `--concurrency` at once; then
`HttpTokenSink.put` of a `--match-ids`-token entry, orjson vs stdlib.
`--overhead-only` runs just this part.

Every case is measured in the same run on the same data; best of --repeats.
Freezing is idempotent, so repeating a finalize rebuilds the same snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench._client_overhead import (
    Figures,
    decode_cost,
    match_ids,
    put_overhead,
    resolve_body,
    resolve_overhead,
)
from tests.support.captures import agent_rollout, record_for
from tests.support.servers import running_app
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.cli import main as cli_main
from token_finalizer.settings import settings_from_mapping
from token_finalizer_client import AsyncFinalizerClient, FinalizerClient

BIG = "bench-client-big"


def _best(repeats: int, run: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


async def _capture(store: FileTokenStore, rollout_id: str, calls: int, tokens: int) -> None:
    for entry in agent_rollout(rollout_id, calls=calls, new_tokens_per_turn=tokens):
        await store.put(entry)


def _wire_bytes(url: str, body: bytes, accept_encoding: str) -> int:
    headers = {"Content-Type": "application/json", "Accept-Encoding": accept_encoding}
    with httpx.Client(timeout=120) as http:
        response = http.post(url + "/finalize", content=body, headers=headers)
        response.raise_for_status()
        return response.num_bytes_downloaded


def _row(name: str, left: str, right: str, ratio: str) -> None:
    print(f"{name:<44} {left:>16} {right:>16} {ratio:>8}")


def _big_answer(url: str, repeats: int) -> None:
    record = record_for(BIG)
    body = json.dumps(record).encode()
    with FinalizerClient(url) as zstd_client, FinalizerClient(url) as plain_client:
        # The one knob the client does not expose: what it accepts back.
        plain_client._http.headers["Accept-Encoding"] = "identity"
        zstd_time = _best(repeats, lambda: zstd_client.finalize(record))
        plain_time = _best(repeats, lambda: plain_client.finalize(record))
    zstd_bytes = _wire_bytes(url, body, "zstd")
    plain_bytes = _wire_bytes(url, body, "identity")
    _row("5M-token finalize", "zstd", "identity", "ratio")
    _row(
        "  wall time (s)", f"{zstd_time:.3f}", f"{plain_time:.3f}", f"{plain_time / zstd_time:.2f}x"
    )
    _row(
        "  answer bytes on the wire",
        f"{zstd_bytes:,}",
        f"{plain_bytes:,}",
        f"{plain_bytes / zstd_bytes:.0f}x",
    )


def _batch_concurrency(url: str, ids: list[str], repeats: int) -> None:
    records = [record_for(rollout_id) for rollout_id in ids]

    async def run(concurrency: int) -> None:
        async with AsyncFinalizerClient(url) as client:
            await client.finalize_many(records, concurrency=concurrency)

    one = _best(repeats, lambda: asyncio.run(run(1)))
    eight = _best(repeats, lambda: asyncio.run(run(8)))
    _row(f"finalize_many, {len(ids)} records", "concurrency 8", "concurrency 1", "ratio")
    _row("  wall time (s)", f"{eight:.3f}", f"{one:.3f}", f"{one / eight:.2f}x")


def _batch_cli(url: str, config: Path, batch: Path, repeats: int) -> None:
    output = batch.with_suffix(".out.jsonl")

    def run(*target: str) -> None:
        with contextlib.redirect_stderr(io.StringIO()):
            status = cli_main(["finalize", str(batch), "-o", str(output), *target])
        if status != 0:
            raise RuntimeError(f"finalize exited {status}")

    in_process = _best(repeats, lambda: run("--config", str(config)))
    served = _best(repeats, lambda: run("--server", url))
    lines = len(batch.read_text().splitlines())
    _row(f"token-finalizer finalize, {lines} lines", "--config", "--server", "ratio")
    _row("  wall time (s)", f"{in_process:.3f}", f"{served:.3f}", f"{served / in_process:.2f}x")


def _overhead_row(name: str, figures: Figures, wire: str = "") -> None:
    print(
        f"  {name:<22} {1000 * figures.alone_p50:>9.2f} {1000 * figures.cpu_alone:>9.2f} "
        f"{1000 * figures.together_p50:>9.2f} {1000 * figures.together_p99:>9.2f} "
        f"{1000 * figures.cpu_together:>9.2f} {wire:>10}"
    )


def _store_overhead(args: argparse.Namespace) -> None:
    calls, concurrency, rounds = args.calls, args.concurrency, args.rounds
    print(
        f"store clients, per call: {calls} alone, then {rounds} rounds of {concurrency} at once "
        f"(canned store in another process)"
    )
    header = f"{'alone p50':>9} {'alone cpu':>9} {'p50':>9} {'p99':>9} {'cpu':>9} {'answer B':>10}"
    print(f"  {'(ms per call)':<22} {'':>19} {f'{concurrency} at once':^29}")
    print(f"  {f'resolve, {args.match_ids:,} ids':<22} {header}")
    resolves = resolve_overhead(args.match_ids, calls, concurrency, rounds)
    sizes = {
        form: f"{len(resolve_body(match_ids(args.match_ids), form == 'compact')):,}"
        for form in ("plain", "compact")
    }
    for (form, library), figures in resolves.items():
        _overhead_row(f"{form} + {library}", figures, sizes[form])
    costs = decode_cost(args.match_ids, repeats=50)
    decoded = ", ".join(f"{form}+{lib} {1000 * cost:.2f}" for (form, lib), cost in costs.items())
    print(f"  reading one answer, no network (ms, best of 50): {decoded}")
    base = resolves["plain", "stdlib"].cpu_alone
    best = resolves["compact", "orjson"].cpu_alone
    print(f"  client CPU alone, plain+stdlib / compact+orjson: {base / best:.2f}x")
    print(f"  {f'put, {args.match_ids:,} ids':<22} {header}")
    puts = put_overhead(args.match_ids, calls, concurrency, rounds)
    for library, figures in puts.items():
        _overhead_row(library, figures)
    ratio = puts["stdlib"].cpu_alone / puts["orjson"].cpu_alone
    print(f"  client CPU alone, stdlib / orjson: {ratio:.2f}x")


def main() -> None:
    """Run the comparisons and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=48, help="medium rollouts in the batch")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--overhead-only", action="store_true", help="only part 4")
    parser.add_argument("--match-ids", type=int, default=25_000, help="ids of a resolved match")
    parser.add_argument("--calls", type=int, default=200, help="store calls one at a time")
    parser.add_argument("--concurrency", type=int, default=64, help="store calls at once")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of concurrent store calls")
    args = parser.parse_args()
    if args.overhead_only:
        _store_overhead(args)
        return
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        capture_dir = root / "capture"
        capture_dir.mkdir()
        store = FileTokenStore(capture_dir)
        ids = [f"bench-client-{n:03d}" for n in range(args.records)]

        async def fill() -> None:
            await _capture(store, BIG, 100, 1000)
            for rollout_id in ids:
                await _capture(store, rollout_id, 20, 500)

        print("writing captures ...", flush=True)
        asyncio.run(fill())
        config = {"sources": {"local": {"kind": "file", "dir": str(capture_dir)}}}
        config_path = root / "finalizer.yaml"
        config_path.write_text(json.dumps(config))
        batch = root / "batch.jsonl"
        batch.write_text("".join(json.dumps(record_for(i)) + "\n" for i in ids))
        with running_app(create_app(settings_from_mapping(config, env={}))) as url:
            _big_answer(url, args.repeats)
            _batch_concurrency(url, ids, args.repeats)
            _batch_cli(url, config_path, batch, args.repeats)
    _store_overhead(args)


if __name__ == "__main__":
    main()
