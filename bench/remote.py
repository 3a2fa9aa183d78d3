"""Finalizing through a remote capture store (http source) vs a local file source.

    .venv/bin/python -m bench.remote [--repeats 5]

Part 1: the 5M-token rollout (100 calls x 1,000 new tokens per turn) is
written into two capture directories; one is served by `token-finalizer store
serve` (uvicorn, a separate process, loopback), the other is read directly.
The same in-process `finalize_record` runs against an http source and a file
source, interleaved, in the same run (freeze is idempotent, so each repeat
reads the same frozen snapshot); both times and the ratio are printed
(target: http <= 1.5x file).

Part 2: the freeze answer's bytes on the wire with and without zstd (target:
<= 2% of the raw JSON), and zstd level 3 vs gzip on that same JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import zstandard

from tests.support.captures import agent_rollout, record_for
from tests.support.servers import free_port, running_process
from token_finalizer import FileTokenStore
from token_finalizer._constants import ZSTD_LEVEL
from token_finalizer.core.delivery import finalize_record
from token_finalizer.sources.http import HttpTokenSource

ROLLOUT = "bench-remote"
FREEZE_PATH = f"/ng-rollout/{ROLLOUT}/training-token-capture/freeze"


async def _write(directory: Path, payloads: list[dict]) -> None:
    store = FileTokenStore(directory)
    for payload in payloads:
        await store.put(payload)


def _signature(build: dict) -> bytes:
    """What must agree between both sources: the whole build but the snapshot ids."""
    return orjson.dumps(
        {k: v for k, v in build.items() if k != "_capture_snapshot"},
        option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS,
    )


async def _finalize_times(
    file_dir: Path, base_url: str, repeats: int
) -> tuple[list[float], list[float]]:
    file_source = FileTokenStore(file_dir)
    http_source = HttpTokenSource(base_url)
    times: dict[str, list[float]] = {"file": [], "http": []}
    signatures: dict[str, bytes] = {}
    try:
        for repeat in range(repeats + 1):  # the first round warms both paths up, uncounted
            order = [("file", file_source), ("http", http_source)]
            if repeat % 2:
                order.reverse()  # neither side always runs right after the other
            for name, source in order:
                record = record_for(ROLLOUT)
                start = time.perf_counter()
                build = await finalize_record(record, source)
                elapsed = time.perf_counter() - start
                if build is None or build.mask_sample:
                    raise RuntimeError(f"the {name} source did not build the rollout: {build}")
                signatures.setdefault(name, _signature(build.to_dict()))
                if repeat:
                    times[name].append(elapsed)
                del build, record
    finally:
        await http_source.close()
    if signatures["file"] != signatures["http"]:
        raise RuntimeError("the file and http sources built different records")
    return times["file"], times["http"]


def _wire_bytes(base_url: str, accept_encoding: str) -> tuple[int, int, float]:
    """(bytes on the wire, decoded bytes, seconds) of one freeze answer."""
    with httpx.Client(base_url=base_url, timeout=60.0) as client:
        start = time.perf_counter()
        response = client.post(FREEZE_PATH, headers={"Accept-Encoding": accept_encoding})
        elapsed = time.perf_counter() - start
        response.raise_for_status()
        return response.num_bytes_downloaded, len(response.content), elapsed


def _timed(run: Callable[[], bytes], repeats: int) -> tuple[float, int]:
    best, size = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        size = len(run())
        best = min(best, time.perf_counter() - start)
    return best, size


def _finalize_table(file_times: list[float], http_times: list[float]) -> None:
    file_median, http_median = statistics.median(file_times), statistics.median(http_times)
    print(f"finalize of the 5M-token rollout, in process ({len(file_times)} interleaved runs)")
    print(f"  {'source':<8}{'best s':>9}{'median s':>11}")
    print(f"  {'file':<8}{min(file_times):>9.3f}{file_median:>11.3f}")
    print(f"  {'http':<8}{min(http_times):>9.3f}{http_median:>11.3f}")
    print(
        f"  ratio http/file: median {http_median / file_median:.2f}x, "
        f"best {min(http_times) / min(file_times):.2f}x  (target <= 1.5x)"
    )


def _wire_table(base_url: str) -> None:
    raw_wire, raw_size, raw_s = _wire_bytes(base_url, "identity")
    zstd_wire, zstd_size, zstd_s = _wire_bytes(base_url, "zstd")
    if raw_size != zstd_size:
        raise RuntimeError("the zstd answer decodes to a different size than the plain one")
    print("\nfreeze answer on the wire (loopback)")
    print(f"  {'encoding':<10}{'bytes':>14}{'of raw':>9}{'request s':>11}")
    print(f"  {'identity':<10}{raw_wire:>14,}{1:>9.1%}{raw_s:>11.3f}")
    print(
        f"  {'zstd':<10}{zstd_wire:>14,}{zstd_wire / raw_wire:>9.2%}{zstd_s:>11.3f}  (target <= 2%)"
    )


def _codec_table(base_url: str, repeats: int) -> None:
    with httpx.Client(base_url=base_url, timeout=60.0) as client:
        body = client.post(FREEZE_PATH, headers={"Accept-Encoding": "identity"}).content
    rows = [
        (
            f"zstd level {ZSTD_LEVEL}",
            lambda: zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(body),
        ),
        ("gzip level 1", lambda: gzip.compress(body, compresslevel=1)),
        ("gzip level 6", lambda: gzip.compress(body, compresslevel=6)),
    ]
    print(f"\ncompressing the {len(body) / 1e6:.1f} MB freeze JSON (best of {repeats})")
    print(f"  {'codec':<14}{'seconds':>9}{'bytes':>13}{'of raw':>9}")
    for label, run in rows:
        seconds, size = _timed(run, repeats)
        print(f"  {label:<14}{seconds:>9.3f}{size:>13,}{size / len(body):>9.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per side")
    args = parser.parse_args()
    payloads = agent_rollout(ROLLOUT, calls=100, new_tokens_per_turn=1000)
    with tempfile.TemporaryDirectory() as scratch:
        file_dir, served_dir = Path(scratch, "file"), Path(scratch, "served")
        asyncio.run(_write(file_dir, payloads))
        asyncio.run(_write(served_dir, payloads))
        del payloads
        port = free_port()
        command = ["store", "serve", "--dir", str(served_dir), "--port", str(port)]
        with running_process(command, port=port):
            base_url = f"http://127.0.0.1:{port}"
            file_times, http_times = asyncio.run(_finalize_times(file_dir, base_url, args.repeats))
            _finalize_table(file_times, http_times)
            _wire_table(base_url)
            _codec_table(base_url, max(1, args.repeats // 2))


if __name__ == "__main__":
    main()
