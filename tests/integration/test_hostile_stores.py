"""Hostile capture stores behind the http source, against a real `serve` process.

The store is a fake built here (a threaded HTTP server on loopback) that
answers each freeze according to the rollout id's prefix:

- `bomb-`: a ~96 KB zstd answer that announces no size and expands to 3 GiB;
- `gzip-`: a ~250 KB gzip answer (`Content-Encoding: gzip`, never asked for)
  expanding to 256 MiB;
- `trickle-`: a 200 whose body arrives one byte a second, forever;
- `forge-`: a 500 whose error text holds a newline and a fake JSON log line;
- `huge-version-`: a well-formed freeze answer whose version is 2**70.

The finalizer runs in a subprocess so that its peak memory (VmHWM) and its
log streams are its own. Its source URLs carry credentials, which must never
show anywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
import zstandard

from tests.support.captures import make_entry, record_for
from tests.support.servers import free_port, wait_for_health
from token_finalizer._constants import FINALIZE_CONCURRENCY, HTTP_DEADLINE_TIMEOUTS

# The finalizer under test decodes at most this much of a store's answer (the
# real bound, HTTP_MAX_ANSWER_BYTES, is 1 GiB; a smaller one keeps the test light).
ANSWER_LIMIT = 64 * 1024 * 1024
HOSTILE_TIMEOUT_S = 2.0
SLACK_S = 3.0
SECRETS = ("hostile-user", "s3cret-pass", "dead-user", "dead-s3cret")
FORGED = "FORGED-LOG-LINE"


def zstd_bomb(blocks: int) -> bytes:
    """One zstd frame of `blocks` RLE blocks of 128 KiB each, announcing no content size."""
    magic = b"\x28\xb5\x2f\xfd"
    descriptor = bytes([0x00, 0x38])  # no size, no checksum, no dictionary; a 128 KiB window

    def rle_block(last: int) -> bytes:
        return ((131072 << 3) | (1 << 1) | last).to_bytes(3, "little") + b" "

    return magic + descriptor + rle_block(0) * (blocks - 1) + rle_block(1)


BOMB = zstd_bomb(24_576)  # 3 GiB of spaces in 96 KiB


def gzip_bomb(mebibytes: int) -> bytes:
    """One gzip member of `mebibytes` MiB of spaces (about 1/1000 of that on the wire)."""
    stream = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    spaces = b" " * (1 << 20)
    return b"".join([*(stream.compress(spaces) for _ in range(mebibytes)), stream.flush()])


GZIP_BOMB = gzip_bomb(256)
FORGED_ERROR = "boom\n" + json.dumps(
    {
        "ts": "2030-01-01T00:00:00.000+00:00",
        "level": "critical",
        "logger": "token_finalizer",
        "message": FORGED,
    }
)


class _FakeStore(BaseHTTPRequestHandler):
    """Protocol v1 paths, answered by the rollout id's prefix (see the module docstring)."""

    stopping = threading.Event()

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _answer(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(200, b'{"status": "ok"}')

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        rollout_id = self.path.split("/")[2]
        if rollout_id.startswith("bomb-"):
            self._answer(200, BOMB, Content_Encoding="zstd")
        elif rollout_id.startswith("gzip-"):
            self._answer(200, GZIP_BOMB, Content_Encoding="gzip")
        elif rollout_id.startswith("trickle-"):
            self._trickle()
        elif rollout_id.startswith("forge-"):
            self._answer(500, orjson.dumps({"error": FORGED_ERROR}))
        elif rollout_id.startswith("huge-version-"):
            self._answer(200, _freeze_answer(rollout_id, version=2**70))
        else:
            self._answer(404, b'{"error": "no such path"}')

    def _trickle(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        self.wfile.flush()
        with contextlib.suppress(OSError):
            while not self.stopping.wait(1.0):
                self.wfile.write(b" ")
                self.wfile.flush()


def _freeze_answer(rollout_id: str, **fields: Any) -> bytes:
    """A protocol v1 freeze answer of one call, with `fields` in place of its own."""
    entry = make_entry(rollout_id, "c1", [1, 2, 3], [4, 5])
    answer = {"rollout_id": rollout_id, "entries": [entry], "incomplete": False}
    # json, not orjson: a version of 2**70 is past what orjson writes.
    return json.dumps({**answer, "snapshot_id": "snap-1", "version": 3, **fields}).encode()


@contextlib.contextmanager
def _fake_store() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeStore)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        _FakeStore.stopping.set()
        server.shutdown()
        server.server_close()


@dataclass(frozen=True)
class Finalizer:
    """A `serve` process, its sources and its two log streams."""

    url: str
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def post(self, record: dict[str, Any], source: str, timeout: float = 60) -> httpx.Response:
        return httpx.post(
            f"{self.url}/finalize", params={"source": source}, json=record, timeout=timeout
        )

    def peak_rss_bytes(self) -> int:
        """The process's peak resident memory so far (VmHWM)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc/<pid>/status")

    def log_lines(self) -> list[str]:
        return self.stderr.read_text().splitlines() + self.stdout.read_text().splitlines()


_LAUNCH = (
    "import sys\n"
    "import token_finalizer.sources.http as http_source\n"
    "http_source.HTTP_MAX_ANSWER_BYTES = int(sys.argv[1])\n"
    "from token_finalizer.cli.main import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


@pytest.fixture(scope="module")
def finalizer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finalizer]:
    """A finalizer with a file source and two credentialed http sources (one dead)."""
    if not Path("/proc/self/status").exists():
        pytest.skip("peak memory is read from /proc")
    directory = tmp_path_factory.mktemp("hostile")
    port, dead_port = free_port(), free_port()
    with _fake_store() as store_port:
        config = directory / "finalizer.yaml"
        sources = {
            "default": "local",
            "local": {"kind": "file", "dir": str(directory / "capture")},
            "hostile": {
                "kind": "http",
                "url": f"http://hostile-user:s3cret-pass@127.0.0.1:{store_port}",
                "timeout_s": HOSTILE_TIMEOUT_S,
                "on_unreachable": "retry",
            },
            "dead": {
                "kind": "http",
                "url": f"http://dead-user:dead-s3cret@127.0.0.1:{dead_port}/",
                "timeout_s": 1,
            },
        }
        config.write_text(yaml.safe_dump({"sources": sources}))
        serve = ["serve", "--config", str(config), "--port", str(port), "--drain-seconds", "0"]
        stdout, stderr = directory / "stdout.log", directory / "stderr.log"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-c", _LAUNCH, str(ANSWER_LIMIT), *serve],
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=err,
            )
        try:
            try:
                wait_for_health(f"http://127.0.0.1:{port}/health", process=process)
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"{exc}; stderr:\n{stderr.read_text()[-4000:]}") from None
            yield Finalizer(f"http://127.0.0.1:{port}", process, stdout, stderr)
        finally:
            process.kill()
            process.wait()


# -- (1) a zstd bomb --------------------------------------------------------------------------


def test_the_bomb_is_what_it_claims() -> None:
    """The fake's answer is a valid zstd frame, announces no size, and is ~1/32768 of its output."""
    assert zstandard.frame_content_size(BOMB) == -1
    assert len(BOMB) < 100_000 and 24_576 * 131_072 == 3 * 1024**3
    head = zstandard.ZstdDecompressor().decompressobj().decompress(BOMB[:1024])
    assert len(head) > ANSWER_LIMIT // 8 and set(head) == {ord(" ")}


def test_zstd_bomb_is_a_masked_record_and_memory_stays_bounded(finalizer: Finalizer) -> None:
    """A 96 KB answer expanding to 3 GiB: masked (freeze_failed, naming the limit), RSS bounded."""
    before = finalizer.peak_rss_bytes()
    answer = finalizer.post(record_for("bomb-1"), "hostile")
    assert answer.status_code == 200
    body = answer.json()
    capture = body["record"]["_ng_token_capture"]
    assert body["record"]["mask_sample"] is True and body["retirable"] is False
    assert capture["mask_reason"] == "freeze_failed"
    assert f"decodes to more than {ANSWER_LIMIT} bytes" in capture["error"]
    peak = finalizer.peak_rss_bytes()
    assert peak < 1_500_000_000
    assert peak - before < 4 * ANSWER_LIMIT, (before, peak)
    # And the process is still there and well.
    assert httpx.get(f"{finalizer.url}/health", timeout=10).status_code == 200


def test_gzip_bomb_is_masked_like_a_zstd_bomb(finalizer: Finalizer) -> None:
    """A gzip answer expanding past the limit: the store's fault, masked with the same reason
    and words as a zstd bomb (not a 503 the harness would retry forever), RSS bounded."""
    assert len(GZIP_BOMB) < 300_000
    before = finalizer.peak_rss_bytes()
    answer = finalizer.post(record_for("gzip-1"), "hostile")
    assert answer.status_code == 200
    body = answer.json()
    capture = body["record"]["_ng_token_capture"]
    assert (body["record"]["mask_sample"], body["retirable"]) == (True, False)
    assert capture["mask_reason"] == "freeze_failed"
    assert f"the gzip body decodes to more than {ANSWER_LIMIT} bytes" in capture["error"]
    assert finalizer.peak_rss_bytes() - before < 4 * ANSWER_LIMIT


def test_a_version_past_2_53_is_a_masked_record_not_a_500(finalizer: Finalizer) -> None:
    """A freeze answer whose version is 2**70 (issue 29, item 8): /finalize answers 200 with the
    record masked, naming the version, and the process stays well."""
    answer = finalizer.post(record_for("huge-version-1"), "hostile")
    assert answer.status_code == 200
    body = answer.json()
    assert (body["record"]["mask_sample"], body["retirable"]) == (True, False)
    assert "version" in body["record"]["_ng_token_capture"]["error"]
    assert httpx.get(f"{finalizer.url}/health", timeout=10).status_code == 200


# -- (3) a store trickling its answer ---------------------------------------------------------


def test_trickling_store_is_cut_at_the_freeze_deadline_and_other_sources_stay_fast(
    finalizer: Finalizer,
) -> None:
    """Every finalize slot of the hostile source held by a store sending a byte a second:
    each answers 503 at the whole-freeze deadline, while the file source answers at once."""
    deadline_s = HTTP_DEADLINE_TIMEOUTS * HOSTILE_TIMEOUT_S

    def finalize(rollout_id: str) -> tuple[float, httpx.Response]:
        started = time.monotonic()
        answer = finalizer.post(record_for(rollout_id), "hostile")
        return time.monotonic() - started, answer

    with ThreadPoolExecutor(FINALIZE_CONCURRENCY) as pool:
        stuck = [pool.submit(finalize, f"trickle-{i}") for i in range(FINALIZE_CONCURRENCY)]
        time.sleep(0.5)
        latencies = []
        for i in range(5):
            started = time.monotonic()
            answer = finalizer.post(record_for(f"local-{i}"), "local", timeout=10)
            latencies.append(time.monotonic() - started)
            assert answer.status_code == 200
        assert max(latencies) < 1.0, latencies
        results = [future.result() for future in stuck]
    for elapsed, answer in results:
        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"]
        assert f"within {deadline_s}s" in answer.json()["error"]
        assert deadline_s - 0.5 < elapsed < deadline_s + SLACK_S


# -- (9) a store error text forging a log line ------------------------------------------------


def test_store_error_text_cannot_forge_a_log_line(finalizer: Finalizer) -> None:
    """An error text holding a newline and a JSON log line stays inside one escaped message."""
    answer = finalizer.post(record_for("forge-1"), "hostile")
    assert answer.status_code == 200
    assert FORGED in answer.json()["record"]["_ng_token_capture"]["error"]
    time.sleep(0.2)  # the log line is written after the answer
    lines = finalizer.stderr.read_text().splitlines()
    objects = [json.loads(line) for line in lines]  # every line is JSON ...
    assert all(isinstance(item, dict) for item in objects)  # ... and one object
    assert not [item for item in objects if item.get("message") == FORGED]
    quoting = [item for item in objects if FORGED in str(item.get("message"))]
    assert quoting and all(item["logger"].startswith("token_finalizer") for item in quoting)
    assert all(json.loads(line) for line in finalizer.stdout.read_text().splitlines())


# -- (8) credentials in a source URL ----------------------------------------------------------


def test_credentials_in_source_urls_show_nowhere(finalizer: Finalizer) -> None:
    """Not in /ready, not in error answers, not in masked records, not in any log line."""
    ready = httpx.get(f"{finalizer.url}/ready", timeout=30)
    assert ready.status_code == 503
    dead = ready.json()["sources"]["dead"]
    assert dead["reachable"] is False and "http://***@127.0.0.1" in dead["error"]
    unreachable = finalizer.post(record_for("creds-1"), "dead")
    assert unreachable.status_code == 503 and "***@127.0.0.1" in unreachable.text
    masked = finalizer.post(record_for("forge-creds"), "hostile")
    assert "***@127.0.0.1" in masked.json()["record"]["_ng_token_capture"]["error"]
    metrics = httpx.get(f"{finalizer.url}/metrics", timeout=10)
    time.sleep(0.2)
    shown = [ready.text, unreachable.text, masked.text, metrics.text, *finalizer.log_lines()]
    for secret in SECRETS:
        assert not [text for text in shown if secret in text], secret
