"""Does pinning glibc's allocator (`token_finalizer._memory`) pay on large finalizes?

    .venv/bin/python -m bench.allocator [--calls 100 400] [--rounds 4]

Three arms in fresh processes, interleaved, on the same capture: each process
freezes and builds the rollout (each call adds 500 prompt and 500 generated
tokens) from a file store and encodes the plain and the compact answer,
`--rounds` times, with glibc's mmap threshold pinned and its arenas capped
(`both`), only the arenas capped (`arenas`), or glibc's defaults (`none`).
Reported: median seconds per finalize+encode and the process's peak RSS,
as ratios to the defaults.
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
import asyncio, json, re, sys, time
from pathlib import Path
from token_finalizer._memory import tune_allocator
from token_finalizer.api.encoding import finalize_answer_pieces
from token_finalizer.core.codec import encode_json, zstd_compress
from token_finalizer.core.compact_tokens import compact_output
from token_finalizer.core.delivery import finalize_record
from token_finalizer.sources.file import FileTokenStore
from tests.support.captures import record_for

directory, rounds, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if mode != "none":
    tune_allocator(pin_mmap_threshold=mode == "both")

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
# VmHWM is this process's own peak (ru_maxrss would inherit the parent's across exec).
status = open("/proc/self/status").read()
peak_mb = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024
print(json.dumps({"times": times, "peak_mb": peak_mb}))
"""


MODES = ("both", "arenas", "none")  # pinned threshold + capped arenas, arenas only, defaults


def run_arm(directory: Path, rounds: int, mode: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(directory), str(rounds), mode],
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
            arms: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
            for _ in range(args.repeats):
                for mode in MODES:
                    arms[mode].append(run_arm(directory, args.rounds, mode))
            base_s = statistics.median(a["seconds"] for a in arms["none"])
            base_mb = statistics.median(a["peak_mb"] for a in arms["none"])
            for mode in MODES:
                seconds = statistics.median(a["seconds"] for a in arms[mode])
                peak = statistics.median(a["peak_mb"] for a in arms[mode])
                print(
                    f"{calls} calls, {mode:7s}: {seconds:.3f} s ({seconds / base_s:.2f}x), "
                    f"peak {peak:.0f} MB ({peak / base_mb:.2f}x) vs glibc defaults"
                )


if __name__ == "__main__":
    main()
