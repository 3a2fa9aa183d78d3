"""Finalize answer v2 as a harness experiences it: POST to a parsed record in hand.

    .venv/bin/python -m bench.answers [--calls 100 400] [--rounds 3]

The rollout: every call adds 500 prompt tokens and generates 500, so the
100-call rollout ends at a 100k-token context and the 400-call one at 400k.
Side by side, in one run, on the same capture:

- baseline: the per-token-trie finalizer in process (`bench/_trie_baseline.py`):
  read the capture's JSONL, build, project (what a plain in-process finalizer
  does);
- ours: `FinalizerClient` (compact answer, zstd) against `token-finalizer serve`
  on loopback, until the standard record is in hand: plain lists, and
  `as_numpy=True` views.

Each client case runs in a fresh process so its peak RSS is its own; times are
medians of `--rounds`. Also reported: the compact answer's uncompressed bytes
per context token, against the plain answer's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench._common import running_service
from bench._trie_baseline import build_response
from bench.lineage import write_capture
from tests.support.captures import record_for

_CLIENT = r"""
import json, re, sys, time
from token_finalizer_client import FinalizerClient
from tests.support.captures import record_for

base, rounds, as_numpy = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
times = []
with FinalizerClient(base, as_numpy=as_numpy, timeout=600.0) as client:
    for _ in range(rounds):
        started = time.perf_counter()
        finalized = client.finalize(record_for("r"))
        output = finalized.record["response"]["output"]
        assert not finalized.masked and len(output[-1]["prompt_token_ids"]) > 0
        times.append(time.perf_counter() - started)
        del finalized, output
# VmHWM is this process's own peak (ru_maxrss would inherit the parent's across exec).
status = open("/proc/self/status").read()
peak_mb = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024
print(json.dumps({"times": times, "peak_mb": peak_mb}))
"""


def baseline(directory: Path) -> float:
    """Seconds for the trie finalizer in process: read the JSONL, build, project."""
    started = time.perf_counter()
    lines = (directory / "r.tokens.jsonl").read_bytes().splitlines()
    entries = [json.loads(line) for line in lines]
    response = build_response(entries, "r", "policy")
    assert response["output"], "baseline built nothing"
    return time.perf_counter() - started


def client_case(base: str, rounds: int, as_numpy: bool) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CLIENT, base, str(rounds), "1" if as_numpy else "0"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return {"seconds": statistics.median(result["times"]), "peak_mb": result["peak_mb"]}


def answer_bytes(base: str, compact: bool) -> tuple[int, int]:
    """Uncompressed bytes of one finalize answer, and of its `context_token_ids` alone."""
    params = {"tokens": "compact"} if compact else None
    with httpx.Client(base_url=base, timeout=600.0) as client:
        response = client.post(
            "/finalize",
            content=orjson.dumps(record_for("r")),
            params=params,
            headers={"Content-Type": "application/json", "Accept-Encoding": "identity"},
        )
        context = orjson.loads(response.content).get("context_token_ids")
        return len(response.content), len(orjson.dumps(context)) if context else 0


def measure(calls: int, rounds: int, root: Path, *, lineage: bool) -> None:
    directory = root / f"c{calls}-{'lineage' if lineage else 'seed'}"
    directory.mkdir()
    write_capture(directory, "r", calls, delta=False, lineage=lineage)
    context = calls * 1000
    base_s = statistics.median(baseline(directory) for _ in range(rounds))
    with running_service(directory, workers=1) as service:
        lists = client_case(service.base, rounds, as_numpy=False)
        views = client_case(service.base, rounds, as_numpy=True)
        compact, context_bytes = answer_bytes(service.base, compact=True)
        plain = answer_bytes(service.base, compact=False)[0] if calls <= 100 else None
    kind = "0.7 lineage capture (digests verified)" if lineage else "seed capture"
    print(f"{calls} calls, final context {context:,} tokens, full prompts, {kind}")
    print(f"  baseline (trie, in process)  {base_s:8.3f} s")
    for name, case in (("client, lists", lists), ("client, numpy views", views)):
        print(
            f"  {name:27s}  {case['seconds']:8.3f} s  ({base_s / case['seconds']:5.1f}x faster)"
            f"  client peak RSS {case['peak_mb']:7.0f} MB"
        )
    line = (
        f"  compact answer {compact / 1e6:7.2f} MB = {compact / context:5.2f} bytes/context token"
        f" (context ids {context_bytes / context:4.2f}; the rest is per item: generation ids"
        " and log probs)"
    )
    if plain is not None:
        line += f"; plain answer {plain / 1e6:7.1f} MB ({plain / compact:4.0f}x the compact one)"
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lineage", action="store_true", help="0.7 captures (digests checked)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-answers-") as tmp:
        for calls in args.calls:
            measure(calls, args.rounds, Path(tmp), lineage=args.lineage)


if __name__ == "__main__":
    main()
