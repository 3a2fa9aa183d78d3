"""Finalize answer v2 as a harness experiences it: POST to a parsed record in hand.

    .venv/bin/python -m bench.answers [--calls 100 400] [--rounds 3] [--lineage] [--delta]
        [--against DIR] [--reference-python PY --reference-wheel DIR/nemo_gym]

The rollout: every call adds 500 prompt tokens and generates 500, so the
100-call rollout ends at a 100k-token context and the 400-call one at 400k.
`--lineage` writes it as a NeMo Gym 0.7 model server does (recorded parents,
digests the build verifies), `--delta` also stores each resolved prompt as
its suffix (`delta_records`). Side by side, in one run, on the same capture:

- baseline: NeMo Gym 0.7.0's own in-process finalize (`--reference-python`
  and `--reference-wheel`, see `bench/_gym_reference.py`; lineage captures
  only), else the per-token-trie finalizer in process
  (`bench/_trie_baseline.py`: read the JSONL, build, project; full prompts
  only);
- ours: `FinalizerClient` (compact answer, zstd) against `token-finalizer
  serve` on loopback, until the standard record is in hand: plain lists, and
  `as_numpy=True` views;
- with `--against DIR`: the same two cases with the service and client of
  another checkout (e.g. `git archive REV | tar -x -C DIR`), rounds
  interleaved with ours so that both see the same load.

Each client case runs in a fresh process so its peak RSS is its own; times are
medians of `--rounds` (each service answers one untimed finalize first). The
load average is printed: other work on the machine slows every side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson

from bench._common import running_service
from bench._gym_reference import reference_times
from bench._trie_baseline import build_response
from bench.lineage import write_capture
from tests.support.captures import record_for

_CLIENT = r"""
import json, re, sys, time
from token_finalizer_client import FinalizerClient
from tests.support.captures import record_for

base, as_numpy = sys.argv[1], sys.argv[2] == "1"
with FinalizerClient(base, as_numpy=as_numpy, timeout=600.0) as client:
    started = time.perf_counter()
    finalized = client.finalize(record_for("r"))
    output = finalized.record["response"]["output"]
    assert not finalized.masked and len(output[-1]["prompt_token_ids"]) > 0
    seconds = time.perf_counter() - started
# VmHWM is this process's own peak (ru_maxrss would inherit the parent's across exec).
status = open("/proc/self/status").read()
peak_mb = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024
print(json.dumps({"seconds": seconds, "peak_mb": peak_mb}))
"""
_CASES = (("client, lists", False), ("client, numpy views", True))


def _environment(tree: Path | None) -> dict[str, str]:
    """The environment that runs `tree`'s service and client (this checkout's when None)."""
    env = dict(os.environ)
    if tree is not None:
        paths = [tree / "service", tree / "client", tree]
        env["PYTHONPATH"] = os.pathsep.join(str(path) for path in paths)
    return env


@contextlib.contextmanager
def _service(capture_dir: Path, tree: Path | None) -> Iterator[str]:
    """`token-finalizer serve` of `tree` over a file source in `capture_dir`; its base URL."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(_environment(tree))  # inherited by the service process
    try:
        with running_service(capture_dir, workers=1) as service:
            os.environ.clear()
            os.environ.update(saved)
            yield service.base
    finally:
        os.environ.clear()
        os.environ.update(saved)


def trie_baseline(directory: Path) -> float:
    """Seconds for the trie finalizer in process: read the JSONL, build, project."""
    started = time.perf_counter()
    lines = (directory / "r.tokens.jsonl").read_bytes().splitlines()
    entries = [json.loads(line) for line in lines]
    response = build_response(entries, "r", "policy")
    assert response["output"], "baseline built nothing"
    return time.perf_counter() - started


def client_case(base: str, as_numpy: bool, tree: Path | None) -> dict[str, float]:
    """One finalize by a fresh client process: its seconds and peak RSS."""
    out = subprocess.run(
        [sys.executable, "-c", _CLIENT, base, "1" if as_numpy else "0"],
        check=True,
        capture_output=True,
        text=True,
        env=_environment(tree),
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


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


def _baseline(directory: Path, args: argparse.Namespace) -> tuple[str, float] | None:
    if args.reference_python:
        times = reference_times(
            args.reference_python, args.reference_wheel, directory, "r", args.rounds
        )
        return "NeMo Gym 0.7.0, in process", statistics.median(times)
    if args.delta:
        return None  # the trie reads full prompts only
    times = [trie_baseline(directory) for _ in range(args.rounds)]
    return "trie, in process", statistics.median(times)


def _client_rounds(
    directory: Path, root: Path, trees: dict[str, Path | None], rounds: int
) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Per tree and case, the results of `rounds` interleaved finalizes."""
    results: dict[str, dict[str, list[dict[str, float]]]] = {t: {} for t in trees}
    with contextlib.ExitStack() as stack:
        bases = {}
        for name, tree in trees.items():
            copy = root / f"{directory.name}-{name}"  # each service freezes its own copy
            shutil.copytree(directory, copy)
            bases[name] = stack.enter_context(_service(copy, tree))
            client_case(bases[name], False, tree)  # warm-up, untimed
        for _ in range(rounds):
            for name, tree in trees.items():
                for case, as_numpy in _CASES:
                    result = client_case(bases[name], as_numpy, tree)
                    results[name].setdefault(case, []).append(result)
    return results


def measure(calls: int, root: Path, args: argparse.Namespace) -> None:
    kind = "delta" if args.delta else "lineage" if args.lineage else "seed"
    directory = root / f"c{calls}-{kind}"
    directory.mkdir()
    write_capture(directory, "r", calls, delta=args.delta, lineage=args.lineage or args.delta)
    context = calls * 1000
    load = os.getloadavg()[0]
    baseline = _baseline(directory, args)
    trees: dict[str, Path | None] = {"ours": None}
    if args.against:
        trees["against"] = args.against
    results = _client_rounds(directory, root, trees, args.rounds)
    with _service(directory, None) as base:
        compact, context_bytes = answer_bytes(base, compact=True)
        plain = answer_bytes(base, compact=False)[0] if calls <= 100 else None
    prompts = "delta prompts" if args.delta else "full prompts"
    what = "0.7 lineage capture (digests verified)" if kind != "seed" else "seed capture"
    print(f"{calls} calls, final context {context:,} tokens, {prompts}, {what}")
    print(f"  load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    if baseline is not None:
        print(f"  baseline ({baseline[0]})  {baseline[1]:8.3f} s")
    for name, by_case in results.items():
        for case, rows in by_case.items():
            seconds = statistics.median(row["seconds"] for row in rows)
            peak = statistics.median(row["peak_mb"] for row in rows)
            ratio = f"  ({baseline[1] / seconds:5.1f}x faster)" if baseline else ""
            print(
                f"  {name + ', ' + case:34s}  {seconds:8.3f} s{ratio}"
                f"  client peak RSS {peak:7.0f} MB"
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
    parser.add_argument("--delta", action="store_true", help="0.7 captures with delta prompts")
    parser.add_argument("--against", type=Path, help="another checkout to compare with")
    parser.add_argument("--reference-python", help="interpreter for NeMo Gym 0.7.0 (>= 3.12)")
    parser.add_argument("--reference-wheel", type=Path, help="the unpacked wheel's nemo_gym dir")
    args = parser.parse_args()
    if bool(args.reference_python) != bool(args.reference_wheel):
        parser.error("--reference-python and --reference-wheel go together")
    if args.reference_python and not (args.lineage or args.delta):
        parser.error("NeMo Gym 0.7.0 masks seed captures: add --lineage or --delta")
    with tempfile.TemporaryDirectory(prefix="bench-answers-") as tmp:
        for calls in args.calls:
            measure(calls, Path(tmp), args)


if __name__ == "__main__":
    main()
