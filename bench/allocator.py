"""Does pinning glibc's allocator (`token_finalizer._memory`) pay on large finalizes?

    .venv/bin/python -m bench.allocator [--calls 100 400] [--rounds 4]

A/B in fresh processes, interleaved, on the same capture: each process
freezes and builds the rollout (each call adds 500 prompt and 500 generated
tokens) from a file store and encodes the plain and the compact answer,
`--rounds` times, with the allocator tuned (A, as `serve` does) or left at
glibc's defaults (B). Reported: median seconds per finalize+encode and the
process's peak RSS, and the A/B ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.lineage import write_capture

_CHILD = r"""
import asyncio, json, resource, sys, time
from pathlib import Path
from token_finalizer._memory import tune_allocator
from token_finalizer.api.encoding import finalize_answer_pieces
from token_finalizer.core.codec import encode_json, zstd_compress
from token_finalizer.core.compact_tokens import compact_output
from token_finalizer.core.delivery import finalize_record
from token_finalizer.sources.file import FileTokenStore
from tests.support.captures import record_for

directory, rounds, tuned = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
if tuned:
    tune_allocator()

async def once() -> float:
    started = time.perf_counter()
    record = record_for("r")
    build = await finalize_record(record, FileTokenStore(directory))
    answer = {"record": record, "build": build.to_dict(with_response=False)}
    pieces = finalize_answer_pieces(answer) or [encode_json(answer)]
    zstd_compress(pieces)
    context, items = compact_output(record["response"]["output"])
    encode_json({"context_token_ids": context, "output": items})
    return time.perf_counter() - started

times = [asyncio.run(once()) for _ in range(rounds)]
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"times": times, "peak_mb": peak_mb}))
"""


def run_arm(directory: Path, rounds: int, tuned: bool) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(directory), str(rounds), "1" if tuned else "0"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    # The first round pays imports and page faults alike in both arms.
    return {"seconds": statistics.median(result["times"][1:]), "peak_mb": result["peak_mb"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="processes per arm")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-alloc-") as tmp:
        for calls in args.calls:
            directory = Path(tmp) / f"c{calls}"
            directory.mkdir()
            write_capture(directory, "r", calls, delta=False)
            arms: dict[bool, list[dict[str, float]]] = {True: [], False: []}
            for _ in range(args.repeats):
                for tuned in (True, False):
                    arms[tuned].append(run_arm(directory, args.rounds, tuned))
            tuned_s = statistics.median(a["seconds"] for a in arms[True])
            plain_s = statistics.median(a["seconds"] for a in arms[False])
            tuned_mb = statistics.median(a["peak_mb"] for a in arms[True])
            plain_mb = statistics.median(a["peak_mb"] for a in arms[False])
            print(
                f"{calls} calls: tuned {tuned_s:.3f} s / {tuned_mb:.0f} MB peak, "
                f"glibc defaults {plain_s:.3f} s / {plain_mb:.0f} MB peak; "
                f"time tuned/default {tuned_s / plain_s:.2f}x, peak {tuned_mb / plain_mb:.2f}x"
            )


if __name__ == "__main__":
    main()
