"""The lineage index across real processes: two `store serve` over one directory or key prefix.

A model server's workers may reach different store-server processes, so a
call committed through one must be found by a resolve through the other (the
file store's index reads the other process's appends from its last offset;
the redis index is shared through Redis), the answer's ids must be exact in
both token forms, and a capture deleted and recreated behind a server's back
must never be answered from what it remembered.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.gym_calls import Conversation
from tests.support.redis import redis_url, unique_prefix
from tests.support.servers import free_port, running_process
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    context_digests,
)

BACKENDS = ("dir", "redis")


@contextlib.contextmanager
def _two_servers(backend: str) -> Iterator[tuple[str, str, list[str]]]:
    """Two `store serve` processes over one directory (or one redis key prefix), and the
    store options naming it."""
    with contextlib.ExitStack() as stack:
        if backend == "dir":
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="index-procs-"))
            where = ["--dir", directory]
        else:
            url = redis_url()
            where = ["--redis", url, "--key-prefix", stack.enter_context(unique_prefix(url))]
        urls = []
        for _ in range(2):
            port = free_port()
            stack.enter_context(
                running_process(["store", "serve", "--port", str(port), *where], port=port)
            )
            urls.append(f"http://127.0.0.1:{port}")
        yield urls[0], urls[1], where


def _path(base: str, rollout_id: str, operation: str) -> str:
    return f"{base}/ng-rollout/{rollout_id}/training-token-capture/{operation}"


def _resolve(http: httpx.Client, base: str, talk: Conversation, *, compact: bool) -> Any:
    body = {
        "fingerprint_version": FINGERPRINT_VERSION,
        "fingerprint": assistant_fingerprint(talk.items),
        "context_digests": context_digests(talk.items),
    }
    suffix = "?tokens=compact" if compact else ""
    answer = http.post(_path(base, talk.rollout_id, "lineage/resolve") + suffix, json=body)
    assert answer.status_code == 200
    return answer.json()


def _ids(match: dict[str, Any]) -> list[int]:
    if "cumulative_token_ids" in match:
        return list(match["cumulative_token_ids"])
    tokens = match["cumulative_tokens"]
    dtype = {"u32le": "<u4", "u64le": "<u8"}[tokens["encoding"]]
    return np.frombuffer(base64.b64decode(tokens["data"]), dtype=dtype).tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_calls_put_through_one_server_resolve_through_the_other(backend: str) -> None:
    """Turn by turn, writes alternate between the servers; each resolve finds the last call."""
    talk = Conversation("procs-1")
    with _two_servers(backend) as (*servers, _), httpx.Client(timeout=30) as http:
        parent = None
        for turn in range(8):
            writer, reader = servers[turn % 2], servers[(turn + 1) % 2]
            call_id = f"call-{turn}"
            entry = talk.call(
                call_id,
                f"turn {turn}",
                new_prompt=[turn, turn + 1],
                generation=[100 + turn],
                parent_call_id=parent,
                delta=parent is not None and turn % 3 != 0,
            )
            assert http.put(
                _path(writer, talk.rollout_id, f"calls/{call_id}"), json=entry
            ).is_success
            answer = _resolve(http, reader, talk, compact=turn % 2 == 0)
            assert answer["status"] == "resolved" and answer["match"]["model_call_id"] == call_id
            assert _ids(answer["match"]) == talk.cumulative[call_id]
            parent = call_id


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_capture_recreated_behind_a_servers_back_is_answered_afresh(backend: str) -> None:
    """Deleted by the operator and written again through the other server, a rollout
    resolves its new tokens, never what the first server remembered."""
    with _two_servers(backend) as (first, second, where), httpx.Client(timeout=30) as http:
        old = Conversation("procs-2")
        entry = old.call("call-0", "hello", new_prompt=[1, 2], generation=[3])
        assert http.put(_path(first, old.rollout_id, "calls/call-0"), json=entry).is_success
        assert _ids(_resolve(http, first, old, compact=False)["match"]) == [1, 2, 3]
        delete = [sys.executable, "-m", "token_finalizer.cli", "store", "delete", old.rollout_id]
        subprocess.run([*delete, *where, "--yes"], check=True, capture_output=True)
        new = Conversation("procs-2")
        entry = new.call("call-0", "hello", new_prompt=[7, 8, 9], generation=[3])
        assert http.put(_path(second, new.rollout_id, "calls/call-0"), json=entry).is_success
        assert _ids(_resolve(http, first, new, compact=True)["match"]) == [7, 8, 9, 3]
