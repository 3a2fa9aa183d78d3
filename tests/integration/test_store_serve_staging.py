"""External staging through real `store serve` processes, on a directory and on Redis.

Two store-server processes share one backend (a capture directory, or Redis
under one key prefix), as replicas behind a load balancer do: writers stage
and record through either, concurrently, and the finalizer freezes and
retires through either. Nothing is lost or written twice, every orphan goes
with its rollout, and an abandoned staged rollout is swept
(docs/staging.md#storage).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest

from tests.support.redis import store_backend
from tests.support.servers import free_port, running_process
from tests.support.staging_stores import Conversation, query_of
from token_finalizer.cli import main
from token_finalizer.sources.http import HttpTokenSource

WRITER, FINALIZER, CONTROL = "w-staging", "f-staging", "c-staging"
WRITE = {"Authorization": f"Bearer {WRITER}"}
READ = {"Authorization": f"Bearer {FINALIZER}"}


@dataclass(frozen=True)
class Pair:
    """Two store-server processes over one backend; `backend` are the store CLI's options."""

    bases: tuple[str, str]
    backend: list[str]

    def path(self, server: int, rollout_id: str, operation: str) -> str:
        base = self.bases[server % 2]
        return f"{base}/ng-rollout/{rollout_id}/training-token-capture/{operation}"


@pytest.fixture(scope="module", params=["dir", "redis"])
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    """Two `store serve` processes over one directory, then over one Redis key prefix."""
    with ExitStack() as stack:
        directory = tmp_path_factory.mktemp("staging-pair")
        backend = store_backend(stack, request.param, directory, "staging")
        bases = []
        for _ in range(2):
            port = free_port()
            args = ["store", "serve", *backend, "--port", str(port)]
            args += ["--writer-token", WRITER, "--finalizer-token", FINALIZER]
            stack.enter_context(running_process([*args, "--control-token", CONTROL], port=port))
            bases.append(f"http://127.0.0.1:{port}")
        yield Pair((bases[0], bases[1]), backend)


def _rollout(calls: int = 4) -> Conversation:
    return Conversation.of(f"st-{uuid.uuid4().hex[:12]}", calls)


def _stage(http: httpx.Client, pair: Pair, server: int, chat: Conversation, index: int) -> int:
    record = chat.records[index]
    path = pair.path(server, chat.rollout_id, f"staged/{record.model_call_id}")
    body = {"record": record.to_json(), "attachments": {"n": {"json": index}}}
    return http.put(path, json=body, headers=WRITE).status_code


def _commit(http: httpx.Client, pair: Pair, server: int, chat: Conversation, index: int) -> int:
    path = pair.path(server, chat.rollout_id, "ledger/records")
    return http.post(path, json={"row": chat.rows[index]}, headers=WRITE).status_code


def _write(pair: Pair, chat: Conversation, *, first_server: int = 0, calls: int = 0) -> None:
    """Each call (the first `calls`, or all) staged through one server, committed via the other."""
    with httpx.Client(timeout=30) as http:
        for index in range(calls or len(chat.records)):
            assert _stage(http, pair, first_server + index, chat, index) == 200
            assert _commit(http, pair, first_server + index + 1, chat, index) == 201


async def _freeze(pair: Pair, server: int, rollout_id: str) -> Any:
    async with HttpTokenSource(pair.bases[server], token=FINALIZER) as source:
        return await source.freeze(rollout_id)


async def _drop(pair: Pair, server: int, snapshot: Any) -> bool:
    async with HttpTokenSource(pair.bases[server], token=FINALIZER) as source:
        return await source.drop(
            snapshot.rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version
        )


def test_a_rollout_written_through_both_freezes_whole(pair: Pair) -> None:
    """Calls staged and recorded across both processes freeze into one complete manifest."""
    chat = _rollout()
    _write(pair, chat)
    snapshot = anyio.run(_freeze, pair, 1, chat.rollout_id)
    assert [r.model_call_id for r in snapshot.staged.manifest.records] == ["c1", "c2", "c3", "c4"]
    assert list(snapshot.staged.snapshots) == [record.base_snapshot() for record in chat.records]


def test_a_row_recorded_through_one_resolves_through_the_other(pair: Pair) -> None:
    """Visible to every replica on return: the next resolve through the other process finds it."""
    chat = _rollout(2)
    query = query_of(chat.requests[1])
    body = {"fingerprint_version": 2, "fingerprint": query.fingerprint}
    body["context_digests"] = list(query.context_digests)
    with httpx.Client(timeout=30) as http:
        assert _stage(http, pair, 0, chat, 0) == 200
        assert _commit(http, pair, 0, chat, 0) == 201
        path = pair.path(1, chat.rollout_id, "lineage/resolve")
        answer = http.post(path, json=body, headers=WRITE).json()
    assert (answer["status"], answer["match"]["model_call_id"]) == ("resolved", "c1")


def test_concurrent_writers_through_both_lose_nothing(pair: Pair) -> None:
    """Many rollouts written at once through both processes: each freezes complete, counted once."""
    chats = [_rollout(5) for _ in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda item: _write(pair, item[1], first_server=item[0]), enumerate(chats)))
    for chat in chats:
        snapshot = anyio.run(_freeze, pair, 0, chat.rollout_id)
        assert (len(snapshot.staged.manifest.records), snapshot.staged.missing_call_ids) == (5, ())
        assert snapshot.version == 11


def _both_at_once(send: Callable[[httpx.Client, int], int]) -> list[int]:
    """`send(http, server)` through server 0 and server 1 at the same moment; their statuses."""
    barrier = threading.Barrier(2)

    def one(server: int) -> int:
        with httpx.Client(timeout=30) as http:
            barrier.wait()
            return send(http, server)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(one, [0, 1]))


def test_one_call_staged_through_both_at_once_is_stored_once(pair: Pair) -> None:
    """The same stage sent to both processes at the same moment: both 200, one stored call."""
    chat = _rollout(1)
    statuses = _both_at_once(lambda http, server: _stage(http, pair, server, chat, 0))
    with httpx.Client(timeout=30) as http:
        assert _commit(http, pair, 0, chat, 0) == 201
    assert (statuses, anyio.run(_freeze, pair, 1, chat.rollout_id).version) == ([200, 200], 3)


def test_one_row_recorded_through_both_at_once_is_appended_once(pair: Pair) -> None:
    """The same row sent to both processes at once: one 201, one 200 (a replay)."""
    chat = _rollout(1)
    statuses = _both_at_once(lambda http, server: _commit(http, pair, server, chat, 0))
    assert sorted(statuses) == [200, 201]


def test_retire_through_the_other_removes_everything_orphans_included(pair: Pair) -> None:
    """Frozen through one, dropped through the other: no staged call, no row is left."""
    chat = _rollout(4)
    _write(pair, chat, calls=3)
    with httpx.Client(timeout=30) as http:
        assert _stage(http, pair, 0, chat, 3) == 200  # staged, never committed: an orphan
    snapshot = anyio.run(_freeze, pair, 0, chat.rollout_id)
    assert anyio.run(_drop, pair, 1, snapshot) is True
    with httpx.Client(timeout=30) as http:
        fetched = http.post(
            pair.path(0, chat.rollout_id, "staged/fetch"),
            json={"keys": ["c1", "c2", "c3", "c4"]},
            headers=READ,
        ).json()
        rows = http.get(pair.path(1, chat.rollout_id, "ledger/has-rows"), headers=WRITE).json()
    assert (fetched, rows) == ({"snapshots": [None] * 4}, {"has_rows": False})


def test_an_abandoned_staged_rollout_is_swept(
    pair: Pair, capsys: pytest.CaptureFixture[str]
) -> None:
    """`store sweep --abandoned-older-than` removes a staging rollout nobody froze."""
    chat = _rollout(2)
    _write(pair, chat)
    args = ["store", "sweep", *pair.backend, "--retired-older-than", "7d"]
    assert main([*args, "--abandoned-older-than", "0s"]) == 0
    assert f"removed {chat.rollout_id} (abandoned" in capsys.readouterr().out
    with httpx.Client(timeout=30) as http:
        path = pair.path(0, chat.rollout_id, "ledger/has-rows")
        assert http.get(path, headers=WRITE).json() == {"has_rows": False}


def test_a_custody_refusal_is_a_422_naming_the_check(pair: Pair) -> None:
    """A call whose parent was never staged: 422 with check parent_not_staged."""
    chat = _rollout(2)
    with httpx.Client(timeout=30) as http:
        path = pair.path(1, chat.rollout_id, "staged/c2")
        response = http.put(path, json={"record": chat.records[1].to_json()}, headers=WRITE)
    assert (response.status_code, response.json()["check"]) == (422, "parent_not_staged")


def test_gyms_control_route_answers_the_control_token(pair: Pair) -> None:
    """The manifest route with the control token: 200; lowercase `bearer`: Gym's 401."""
    chat = _rollout(2)
    _write(pair, chat)
    path = f"{pair.bases[1]}/training-token-capture/control/rollouts/{chat.rollout_id}/manifest"
    with httpx.Client(timeout=30) as http:
        good = http.get(path, headers={"Authorization": f"Bearer {CONTROL}"})
        bad = http.get(path, headers={"Authorization": f"bearer {CONTROL}"})
    assert [r["model_call_id"] for r in good.json()["records"]] == ["c1", "c2"]
    assert (bad.status_code, bad.json()) == (
        401,
        {"detail": "missing or invalid control-plane bearer token"},
    )
