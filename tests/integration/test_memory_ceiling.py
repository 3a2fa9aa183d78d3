"""A huge freeze answer under an address-space limit masks the record; the finalizer lives.

A `serve` process runs under RLIMIT_AS = 3 GiB, set by the `prlimit` command as
the issue's reproduction did (or by `setrlimit` before exec), with an `http`
source whose store, a loopback fake, answers every freeze with one 200 MB JSON
body. orjson reserves about 12x a document while it parses it and crashed the
process with SIGSEGV when it could not get it; the parse is now refused first
(core/address_space.py, issue 29 item 7).
"""

from __future__ import annotations

import asyncio
import resource
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.captures import record_for
from tests.support.loopback_http import read_request, serving
from tests.support.servers import free_port, running_process

ADDRESS_SPACE_LIMIT = 3 * 1024**3
BODY_MEBIBYTES = 200


def _huge_freeze_answer(rollout_id: str) -> bytes:
    """A freeze answer of 200 MB: the rollout's id, no entries and one long string."""
    head = f'{{"rollout_id":"{rollout_id}","entries":[],"padding":"'.encode()
    return head + b"a" * (BODY_MEBIBYTES << 20) + b'"}'


@pytest.fixture
def huge_store() -> Iterator[str]:
    """A store answering every POST with the 200 MB freeze answer of rollout `huge-1`."""
    body = _huge_freeze_answer("huge-1")

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            answer = body if request[0] == "POST" else b'{"status":"ok"}'
            head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            writer.write(f"{head}content-length: {len(answer)}\r\n\r\n".encode())
            writer.write(answer)
            await writer.drain()
        writer.close()

    with serving(connection) as url:
        yield url


def _limit_address_space() -> None:  # runs in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def _finalize_huge(huge_store: str, tmp_path: Path, **limit: Any) -> tuple[httpx.Response, bool]:
    """A finalize of `huge-1` through a `serve` limited by `limit`: its answer, and if it lived."""
    config = tmp_path / "finalizer.yaml"
    source = {"kind": "http", "url": huge_store, "timeout_s": 60}
    config.write_text(yaml.safe_dump({"sources": {"default": "huge", "huge": source}}))
    port = free_port()
    serve = ["serve", "--config", str(config), "--port", str(port), "--drain-seconds", "0"]
    with running_process(serve, port=port, **limit) as process:
        answer = httpx.post(
            f"http://127.0.0.1:{port}/finalize",
            params={"source": "huge"},
            json=record_for("huge-1"),
            timeout=120,
        )
        alive = process.poll() is None
    return answer, alive


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="space left is read from /proc")
@pytest.mark.parametrize(
    "limit",
    [
        {"wrapper": ["prlimit", f"--as={ADDRESS_SPACE_LIMIT}"]},
        {"preexec_fn": _limit_address_space},
    ],
    ids=["prlimit", "setrlimit"],
)
def test_a_200_mb_freeze_answer_under_a_3_gib_ceiling_is_a_masked_record(
    huge_store: str, tmp_path: Path, limit: dict[str, Any]
) -> None:
    """The finalize answers 200 with the record masked freeze_failed; the process is still up."""
    if "wrapper" in limit and shutil.which("prlimit") is None:
        pytest.fail("the prlimit command (util-linux) is needed for this test")
    answer, alive = _finalize_huge(huge_store, tmp_path, **limit)
    assert answer.status_code == 200
    capture = answer.json()["record"]["_ng_token_capture"]
    assert capture["mask_reason"] == "freeze_failed"
    assert "does not fit in memory" in capture["error"]
    assert alive
