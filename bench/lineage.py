"""NeMo Gym 0.7 captures: full prompts against delta prompts, side by side.

    .venv/bin/python -m bench.lineage [--calls 100 400] [--rounds 3]

The same agent rollout (each call adds 500 prompt tokens and generates 500)
is captured twice, as a 0.7 model server writes it: once with every prompt
in full, once with `delta_records` (each resolved call stores only the suffix
after its parent). For each size the bench reports the capture's bytes on
disk, the in-process finalize time (file store freeze -> build), and the
finalize time through HTTP (`token-finalizer serve`, compact zstd answer
received in full), as medians of interleaved rounds, and the full/delta ratios. Both
builds must agree byte for byte.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench._common import running_service
from tests.support.captures import agent_rollout, record_for
from tests.support.lineage import stamp_lineage
from token_finalizer import FileTokenStore
from token_finalizer.core.codec import dumps_entry_line, encode_json
from token_finalizer.core.delivery import finalize_record

NEW_TOKENS_PER_TURN = 1000  # 500 prompt tokens (tool output) + 500 generated
GENERATION_SHARE = 0.5


def lineage_entries(rollout_id: str, calls: int, *, delta: bool) -> list[dict[str, Any]]:
    """One agent rollout of `calls` calls, stamped as a NeMo Gym 0.7 writer stamps it."""
    entries = agent_rollout(
        rollout_id,
        calls=calls,
        new_tokens_per_turn=NEW_TOKENS_PER_TURN,
        generation_share=GENERATION_SHARE,
    )
    ids = [entry["model_call_id"] for entry in entries]
    parents = {call: (ids[i - 1] if i else None) for i, call in enumerate(ids)}
    return stamp_lineage(entries, parents, delta=delta)


def write_capture(
    directory: Path, rollout_id: str, calls: int, *, delta: bool, lineage: bool = True
) -> int:
    """Write one capture as JSONL lines (as model servers append them); its size in bytes.

    `lineage`: as a NeMo Gym 0.7 writer stamps it (parents, digests); else as
    the August 2026 writers did (a seed capture, parents found by prefix).
    """
    if lineage:
        written = lineage_entries(rollout_id, calls, delta=delta)
    else:
        written = agent_rollout(
            rollout_id,
            calls=calls,
            new_tokens_per_turn=NEW_TOKENS_PER_TURN,
            generation_share=GENERATION_SHARE,
        )
    path = directory / f"{rollout_id}.tokens.jsonl"
    with path.open("wb") as handle:
        for entry in written:
            handle.write(dumps_entry_line(entry) + b"\n")
    return path.stat().st_size


async def in_process(directory: Path, rollout_id: str) -> tuple[float, bytes]:
    """Seconds to freeze and build in this process, and the build's bytes."""
    store = FileTokenStore(directory)
    started = time.perf_counter()
    build = await finalize_record(record_for(rollout_id), store)
    elapsed = time.perf_counter() - started
    assert build is not None, "no build"
    assert not build.mask_sample, build
    signature = build.to_dict()
    signature.pop("_capture_snapshot")
    return elapsed, encode_json(signature)


def over_http(base: str, rollout_id: str) -> float:
    """Seconds from POST /finalize to the whole zstd answer received."""
    body = orjson.dumps(record_for(rollout_id))
    headers = {"Content-Type": "application/json", "Accept-Encoding": "zstd"}
    with httpx.Client(base_url=base, timeout=600.0) as client:
        started = time.perf_counter()
        # The compact token form, as the client package asks for it.
        response = client.post(
            "/finalize", content=body, headers=headers, params={"tokens": "compact"}
        )
        raw = response.read()
        elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.status_code
    assert raw, "empty answer"
    return elapsed


def measure(calls: int, rounds: int, root: Path) -> dict[str, Any]:
    sizes, local, remote, signatures = {}, {}, {}, {}
    dirs = {kind: root / f"{kind}-{calls}" for kind in ("full", "delta")}
    for kind, directory in dirs.items():
        directory.mkdir()
        sizes[kind] = write_capture(directory, "r", calls, delta=kind == "delta")
        local[kind], remote[kind] = [], []
    for _ in range(rounds):
        for kind, directory in dirs.items():
            elapsed, signatures[kind] = asyncio.run(in_process(directory, "r"))
            local[kind].append(elapsed)
    assert signatures["full"] == signatures["delta"], "full and delta captures built differently"
    for kind, directory in dirs.items():
        with running_service(directory, workers=1) as service:
            remote[kind] = [over_http(service.base, "r") for _ in range(rounds)]
    return {
        "calls": calls,
        "bytes": sizes,
        "in_process_s": {k: statistics.median(v) for k, v in local.items()},
        "http_s": {k: statistics.median(v) for k, v in remote.items()},
    }


def report(row: dict[str, Any]) -> None:
    full, delta = row["bytes"]["full"], row["bytes"]["delta"]
    print(f"{row['calls']} calls (final context {row['calls'] * NEW_TOKENS_PER_TURN:,} tokens)")
    print(
        f"  capture bytes   full {full / 1e6:9.1f} MB  delta {delta / 1e6:7.2f} MB"
        f"  ratio {full / delta:6.1f}x"
    )
    for name, key in (("in process", "in_process_s"), ("through HTTP", "http_s")):
        f, d = row[key]["full"], row[key]["delta"]
        print(f"  {name:14s}  full {f:9.3f} s   delta {d:7.3f} s   ratio {f / d:6.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[100, 400])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-lineage-") as tmp:
        for calls in args.calls:
            report(measure(calls, args.rounds, Path(tmp)))


if __name__ == "__main__":
    main()
