"""Hostile records and entries against real `serve` and `store serve` processes.

Deep nesting is refused before anything is frozen or stored; over-long ids
are refused without naming a file; integers beyond 64 bits come back digit
for digit; NaN is not JSON.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.captures import agent_rollout, make_entry, record_for
from tests.support.servers import free_port, running_process
from token_finalizer import CaptureFrozen, FileTokenStore
from token_finalizer._constants import MAX_JSON_DEPTH
from token_finalizer_client.protocol import MAX_ID_LENGTH

JSON = {"content-type": "application/json"}
HUGE = 18446744073709551617  # 2**64 + 1


@dataclass(frozen=True)
class Served:
    url: str
    directory: Path

    @property
    def store(self) -> FileTokenStore:
        return FileTokenStore(self.directory)


@pytest.fixture(scope="module")
def finalizer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`token-finalizer serve` over one file source."""
    root = tmp_path_factory.mktemp("records")
    directory = root / "capture"
    config = root / "finalizer.yaml"
    config.write_text(
        yaml.safe_dump({"sources": {"local": {"kind": "file", "dir": str(directory)}}})
    )
    port = free_port()
    args = ["serve", "--config", str(config), "--port", str(port), "--drain-seconds", "0"]
    with running_process(args, port=port):
        yield Served(f"http://127.0.0.1:{port}", directory)


@pytest.fixture(scope="module")
def store_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`token-finalizer store serve` over a directory."""
    directory = tmp_path_factory.mktemp("store") / "served"
    port = free_port()
    with running_process(
        ["store", "serve", "--dir", str(directory), "--port", str(port)], port=port
    ):
        yield Served(f"http://127.0.0.1:{port}", directory)


def _nested(depth: int) -> bytes:
    """A JSON array nested `depth` deep."""
    return b"[" * depth + b"]" * depth


def _write(store: FileTokenStore, rollout_id: str) -> None:
    async def write() -> None:
        for entry in agent_rollout(rollout_id, calls=2, new_tokens_per_turn=20):
            await store.put(entry)

    asyncio.run(write())


def _frozen(served: Served, rollout_id: str) -> bool:
    """Whether the capture refuses a new call now (it does once frozen)."""
    try:
        asyncio.run(served.store.put(make_entry(rollout_id, "probe", [1], [2])))
    except CaptureFrozen:
        return True
    return False


# -- deep nesting -----------------------------------------------------------------------------


def test_record_nested_300_deep_is_400_and_freezes_nothing(finalizer: Served) -> None:
    """The depth is checked before the record is read for its id: the capture stays open."""
    _write(finalizer.store, "deep-300")
    body = b'{"_ng_rollout_id": "deep-300", "reward": 1.0, "trace": ' + _nested(298) + b"}"
    answer = httpx.post(f"{finalizer.url}/finalize", content=body, headers=JSON, timeout=30)
    assert answer.status_code == 400
    assert f"at most {MAX_JSON_DEPTH}" in answer.json()["error"]
    assert not _frozen(finalizer, "deep-300")


def test_record_at_the_depth_limit_is_finalized(finalizer: Served) -> None:
    """Exactly MAX_JSON_DEPTH levels is accepted and answered (the answer wraps it deeper)."""
    _write(finalizer.store, "deep-max")
    body = (
        b'{"_ng_rollout_id": "deep-max", "reward": 1.0, "trace": '
        + _nested(MAX_JSON_DEPTH - 1)
        + b"}"
    )
    answer = httpx.post(f"{finalizer.url}/finalize", content=body, headers=JSON, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["build"]["mask_sample"] is False
    assert _frozen(finalizer, "deep-max")


def test_store_put_of_a_2000_deep_body_is_4xx(store_server: Served) -> None:
    """A 2,000-deep PUT body is a client error, not a 500."""
    body = b'{"rollout_id": "r-deep", "model_call_id": "c1", "x": ' + _nested(2000) + b"}"
    answer = httpx.put(
        f"{store_server.url}/ng-rollout/r-deep/training-token-capture/calls/c1",
        content=body,
        headers=JSON,
        timeout=30,
    )
    assert 400 <= answer.status_code < 500, answer.text
    assert "nests" in answer.json()["error"]


def test_entry_with_output_items_nested_300_deep_is_refused_at_put(store_server: Served) -> None:
    """Output items nesting 300 deep are refused at the PUT, so no snapshot ever holds them."""
    content: dict = {}
    inner = content
    for _ in range(300):
        inner["more"] = {}
        inner = inner["more"]
    entry = make_entry("r-items", "c1", [1, 2], [3], output_items=[{"type": "x", "c": content}])
    base = f"{store_server.url}/ng-rollout/r-items/training-token-capture"
    answer = httpx.put(f"{base}/calls/c1", json=entry, timeout=30)
    assert 400 <= answer.status_code < 500, answer.text
    snapshot = httpx.post(f"{base}/freeze", timeout=30).json()
    assert snapshot["entries"] == []


# -- over-long ids ----------------------------------------------------------------------------


@pytest.mark.parametrize("operation", ["freeze", "drop", "incomplete", "intents", "calls/c1"])
def test_300_character_rollout_id_is_422_without_a_path(
    store_server: Served, operation: str
) -> None:
    """Refused from its length, before any file name is made of it: no path in the message."""
    rollout_id = "r" * 300
    method = "PUT" if operation.startswith("calls") else "POST"
    body = make_entry(rollout_id, "c1", [1], [2]) if method == "PUT" else {}
    answer = httpx.request(
        method,
        f"{store_server.url}/ng-rollout/{rollout_id}/training-token-capture/{operation}",
        json=body,
        timeout=30,
    )
    assert answer.status_code == 422
    message = answer.json()["error"]
    assert f"at most {MAX_ID_LENGTH}" in message
    assert str(store_server.directory) not in message and ".tokens" not in message
    assert not re.search(r"(^|\s|')/\w", message), message
    assert not [path for path in store_server.directory.rglob("*") if "r" * 100 in path.name]


def test_300_character_rollout_id_in_a_record_is_masked_without_a_path(finalizer: Served) -> None:
    """The finalizer masks such a record (malformed rollout id) and names no file either."""
    answer = httpx.post(f"{finalizer.url}/finalize", json=record_for("r" * 300), timeout=30)
    assert answer.status_code == 200
    error = answer.json()["record"]["_ng_token_capture"]["error"]
    assert error.startswith("malformed rollout id")
    assert str(finalizer.directory) not in error and ".tokens" not in error


# -- numbers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("with_capture", [False, True], ids=["no-capture", "rebuilt"])
def test_integers_beyond_64_bits_come_back_digit_for_digit(
    finalizer: Served, with_capture: bool
) -> None:
    """2**64 + 1 (and -2**70) in a record survive a real finalize exactly, as written."""
    rollout_id = f"huge-{with_capture}"
    if with_capture:
        _write(finalizer.store, rollout_id)
    body = (
        b'{"_ng_rollout_id": "%s", "reward": 18446744073709551617, '
        b'"stats": {"seed": -1180591620717411303424, "ids": [18446744073709551617, 1]}}'
        % rollout_id.encode()
    )
    answer = httpx.post(f"{finalizer.url}/finalize", content=body, headers=JSON, timeout=30)
    assert answer.status_code == 200, answer.text
    assert b"18446744073709551617" in answer.content
    assert b"-1180591620717411303424" in answer.content
    record = json.loads(answer.content)["record"]
    assert record["reward"] == HUGE and isinstance(record["reward"], int)
    assert record["stats"] == {"seed": -(2**70), "ids": [HUGE, 1]}
    # Rebuilt from its capture, or masked for having none: either way the numbers stand.
    assert record.get("mask_sample", False) is not with_capture


@pytest.mark.parametrize("value", [b"NaN", b"-Infinity", b"Infinity"])
def test_non_finite_reward_is_400(finalizer: Served, value: bytes) -> None:
    """NaN and the infinities are not JSON: a 400, and the capture is not frozen."""
    _write(finalizer.store, f"nan-{value.decode()}")
    body = b'{"_ng_rollout_id": "nan-%s", "reward": %s}' % (value, value)
    answer = httpx.post(f"{finalizer.url}/finalize", content=body, headers=JSON, timeout=30)
    assert answer.status_code == 400
    assert "json" in answer.json()["error"].lower()
    assert not _frozen(finalizer, f"nan-{value.decode()}")
