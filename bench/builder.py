"""Builder + projection vs a per-token-trie baseline, and the in-process end to end.

    .venv/bin/python -m bench.builder

Part 1 runs our builder and projection side by side with `bench/_trie_baseline.py`
on the same parsed input in the same process, checks the outputs are byte for
byte identical once serialized, and prints both times and the ratio (target:
>= 20x on the 5M-token case).

Part 2 measures the whole in-process path on the 5M-token case: a file store
written by `put`, then freeze -> build -> rebuilt record serialized with orjson
(target: <= 0.6 s), in a fresh subprocess so its peak RSS is its own (target:
<= 3x the capture's JSON size).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time

import orjson

from bench._trie_baseline import build_response
from tests.support.captures import agent_rollout, record_for
from token_finalizer import FileTokenStore, TokenEntry
from token_finalizer._memory import tune_allocator
from token_finalizer.core.codec import encode_json
from token_finalizer.core.delivery import finalize_record
from token_finalizer.core.entries import Snapshot
from token_finalizer.core.rebuild import rebuild_snapshot

E2E_ROLLOUT = "bench-e2e"
CASES = (("100 calls x 1,000 tokens", 100, 1000), ("200 calls x 600 tokens", 200, 600))


def peak_rss_bytes() -> int:
    """This process's own peak RSS (VmHWM).

    ru_maxrss would not do: Linux carries the parent's high-water mark into a
    child across fork and exec.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _ours(entries: list[TokenEntry]) -> dict:
    snapshot = Snapshot("r", tuple(entries), incomplete=False, snapshot_id="s", version=1)
    build = rebuild_snapshot(snapshot, model="policy")
    assert build.rebuilt_response is not None, build.error
    return build.rebuilt_response


def _best_of(repeats: int, run) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def builder_table(repeats: int) -> None:
    print("builder + projection (best of", repeats, "runs)")
    print(
        f"{'case':<28}{'prompt tokens':>14}{'baseline s':>12}{'ours s':>10}{'ratio':>9}  identical"
    )
    for label, calls, tokens in CASES:
        payloads = agent_rollout("r", calls=calls, new_tokens_per_turn=tokens)
        entries = [TokenEntry.from_dict(p) for p in payloads]
        prompt_tokens = sum(len(p["prompt_token_ids"]) for p in payloads)
        base_s, base_out = _best_of(
            max(1, repeats // 3), lambda payloads=payloads: build_response(payloads, "r", "policy")
        )
        ours_s, ours_out = _best_of(repeats, lambda entries=entries: _ours(entries))
        same = encode_json(ours_out) == orjson.dumps(base_out)
        print(
            f"{label:<28}{prompt_tokens:>14,}{base_s:>12.3f}{ours_s:>10.4f}"
            f"{base_s / ours_s:>8.1f}x  {same}"
        )


async def _write_capture(directory: str) -> int:
    """Write the 5M-token rollout through the store's own put; return its JSON size."""
    store = FileTokenStore(directory)
    payloads = agent_rollout(E2E_ROLLOUT, calls=100, new_tokens_per_turn=1000)
    for payload in payloads:
        await store.put(payload)
    return sum(len(orjson.dumps(p)) + 1 for p in payloads)


async def _finalize_child(directory: str, repeats: int) -> None:
    """Runs in a fresh interpreter that only finalizes, so ru_maxrss is the finalize's own."""
    tune_allocator()  # as `token-finalizer serve` does
    store = FileTokenStore(directory)
    before = peak_rss_bytes()
    times = []
    for _ in range(repeats):  # freeze is idempotent: every repeat reads the same snapshot
        start = time.perf_counter()
        record = record_for(E2E_ROLLOUT)
        build = await finalize_record(record, store)
        body = encode_json(record)
        times.append(time.perf_counter() - start)
        if build is None or build.mask_sample:
            raise RuntimeError(f"benchmark capture did not build cleanly: {build}")
        del body, record, build
    peak = peak_rss_bytes()
    print(orjson.dumps({"times": times, "peak_bytes": peak, "before_bytes": before}).decode())


def end_to_end_table(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        capture_bytes = asyncio.run(_write_capture(directory))
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.builder",
                "--e2e-child",
                directory,
                "--repeats",
                str(repeats),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    figures = orjson.loads(out.strip().splitlines()[-1])
    capture_mb = capture_bytes / 1e6
    peak_mb = figures["peak_bytes"] / 1e6
    before_mb = figures["before_bytes"] / 1e6
    times = figures["times"]
    print("\nend to end, in process: file store freeze -> build -> rebuilt record serialized")
    print(f"  capture JSON      {capture_mb:8.1f} MB")
    print(
        f"  best / median     {min(times):8.3f} s / {statistics.median(times):.3f} s"
        "  (target <= 0.6 s)"
    )
    print(
        f"  peak RSS          {peak_mb:8.1f} MB = {peak_mb / capture_mb:.2f}x the capture JSON"
        f" (target <= 3x); the interpreter with its imports alone: {before_mb:.1f} MB,"
        f" so finalizing added {(peak_mb - before_mb) / capture_mb:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--e2e-child", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.e2e_child:
        asyncio.run(_finalize_child(args.e2e_child, args.repeats))
        return
    builder_table(args.repeats)
    end_to_end_table(args.repeats)


if __name__ == "__main__":
    main()
