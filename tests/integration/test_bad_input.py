"""Hostile and malformed input through a real server: a clear 4xx or a masked record, never 5xx."""

from __future__ import annotations

import asyncio
import resource
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.captures import agent_rollout, record_for
from tests.support.servers import running_app
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FileTokenStore]]:
    """A finalizer over a file source, with the default 64 MiB body limit."""
    directory: Path = tmp_path_factory.mktemp("capture")
    config = {"sources": {"local": {"kind": "file", "dir": str(directory)}}}
    with running_app(create_app(settings_from_mapping(config, env={}))) as url:
        yield url, FileTokenStore(directory)


def _post(url: str, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{url}/finalize", content=body, headers={"content-type": "application/json"}, timeout=60
    )


def _assert_error(answer: httpx.Response, status: int, *words: str) -> None:
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]
    for word in words:
        assert word in message.lower()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"[" * 100_000 + b"]" * 100_000, ("json",)),
        (b'{"reward": NaN}', ("json",)),
        (b'{"reward": Infinity}', ("json",)),
        (b'{"_ng_rollout_id": "\xff\xfe"}', ("json",)),
        (b'{"a": 1', ("json",)),
    ],
    ids=["deep nesting", "NaN", "Infinity", "non-UTF-8", "truncated"],
)
def test_malformed_bodies_are_400(
    service: tuple[str, FileTokenStore], body: bytes, words: tuple[str, ...]
) -> None:
    """Bodies that are not valid JSON objects get a 400 that says so."""
    _assert_error(_post(service[0], body), 400, *words)


def test_duplicate_keys_keep_the_last_value(service: tuple[str, FileTokenStore]) -> None:
    """Duplicate keys are valid JSON: the last one wins, and the answer is a normal 200."""
    answer = _post(service[0], b'{"_ng_rollout_id": "a/b", "_ng_rollout_id": "dup-1"}')
    assert answer.status_code == 200
    assert answer.json()["rollout_id"] == "dup-1"


def test_huge_string_field_is_carried_through(service: tuple[str, FileTokenStore]) -> None:
    """A 20 MB string field is carried untouched; the capture problem is a masked record."""
    record = record_for("huge-1", notes="x" * 20_000_000)
    answer = httpx.post(f"{service[0]}/finalize", json=record, timeout=120)
    assert answer.status_code == 200
    body = answer.json()
    assert body["record"]["notes"] == record["notes"]
    assert body["record"]["_ng_token_capture"]["mask_reason"] == "empty_capture"


@pytest.mark.parametrize(
    "bad_id", ["..", "a/b", "a\\b", "%2e%2e", "a\x00b", "ｒｏｌｌｏｕｔ", "rollout\u2024one", " x"]
)
def test_bad_rollout_ids_mask_before_touching_the_store(
    service: tuple[str, FileTokenStore], bad_id: str
) -> None:
    """Ids outside the safe alphabet become masked records and no file is created for them."""
    url, store = service
    before = sorted(p.name for p in store.directory.iterdir())
    answer = httpx.post(f"{url}/finalize", json=record_for(bad_id), timeout=30)
    assert answer.status_code == 200
    assert answer.json()["record"]["_ng_token_capture"]["error"].startswith("malformed rollout id")
    assert sorted(p.name for p in store.directory.iterdir()) == before


def test_retire_with_bad_id_retires_nothing(service: tuple[str, FileTokenStore]) -> None:
    """A retire naming an unsafe id is refused without touching the store."""
    url, store = service
    build = {
        "rebuilt_response": {"output": []},
        "mask_sample": False,
        "_capture_snapshot": {"snapshot_id": "x", "version": 1},
    }
    answer = httpx.post(f"{url}/retire", json={"rollout_id": "../etc", "build": build}, timeout=30)
    assert answer.status_code < 500
    assert answer.status_code != 200 or answer.json() == {"retired": False}
    assert not any(".." in p.name for p in store.directory.iterdir())


def test_one_gigabyte_content_length_with_short_body_is_413_at_once(
    service: tuple[str, FileTokenStore],
) -> None:
    """A 1 GB Content-Length is refused from the header, without waiting for the body."""
    parts = urlsplit(service[0])
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(
            b"POST /finalize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1073741824\r\n\r\n{}"
        )
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


def test_service_memory_stays_bounded_under_refused_bodies(
    service: tuple[str, FileTokenStore],
) -> None:
    """Fifty 1 GB announcements cost no memory: nothing is read past the limit."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    parts = urlsplit(service[0])
    for _ in range(50):
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
            sock.sendall(
                b"POST /finalize HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n"
                + b"{" * 65536
            )
            assert sock.recv(4096).startswith(b"HTTP/1.1 413")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024


def test_good_request_after_the_abuse_still_works(service: tuple[str, FileTokenStore]) -> None:
    """After all of the above, a real rollout still finalizes cleanly."""
    url, store = service

    async def write() -> None:
        for entry in agent_rollout("after-abuse", calls=3, new_tokens_per_turn=40):
            await store.put(entry)

    asyncio.run(write())
    answer = httpx.post(f"{url}/finalize", json=record_for("after-abuse"), timeout=30)
    assert answer.status_code == 200 and answer.json()["build"]["mask_sample"] is False
