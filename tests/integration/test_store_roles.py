"""Store credentials by role, against real `store serve` processes.

A writer token (every model server holds one) may write and resolve, never
freeze or drop; a finalizer token may freeze and drop, never write; a control
token reaches no route served today. A token of the wrong role is a 403, an
unknown one a 401, and /health needs none. A single `--token` keeps working for
every role. The clients a deployment uses send their own tokens.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.captures import make_entry
from tests.support.servers import free_port, running_process
from token_finalizer.core.errors import SourceUnavailable
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer_client import HttpTokenSink, PermissionDeniedError
from token_finalizer_client.protocol import context_digests

pytestmark = pytest.mark.anyio

WRITER, SECOND_WRITER, FINALIZER, CONTROL = "w-token-1", "w-token-2", "f-token", "c-token"
RESOLVE_BODY = {"fingerprint_version": 2, "fingerprint": "", "context_digests": context_digests([])}


def _path(rollout_id: str, operation: str) -> str:
    return f"/ng-rollout/{rollout_id}/training-token-capture/{operation}"


def _requests(rollout_id: str) -> dict[str, tuple[str, str, dict[str, object]]]:
    """One request per protocol route, by name: method, path, JSON body."""
    return {
        "put": ("PUT", _path(rollout_id, "calls/c1"), make_entry(rollout_id, "c1", [1], [2])),
        "intents": ("POST", _path(rollout_id, "intents"), {"model_call_id": "c2"}),
        "incomplete": ("POST", _path(rollout_id, "incomplete"), {"model_call_id": "c3"}),
        "resolve": ("POST", _path(rollout_id, "lineage/resolve"), RESOLVE_BODY),
        "freeze": ("POST", _path(rollout_id, "freeze"), {}),
        "drop": ("POST", _path(rollout_id, "drop"), {"snapshot_id": "s", "version": 1}),
    }


WRITER_ROUTES = {"put", "intents", "incomplete", "resolve"}
FINALIZER_ROUTES = {"freeze", "drop"}


def _statuses(base: str, token: str | None) -> dict[str, int]:
    """The status of every route called with `token`, on a fresh rollout."""
    rollout_id = f"roles-{uuid.uuid4().hex[:10]}"
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return {
        name: httpx.request(method, base + path, json=body, headers=headers).status_code
        for name, (method, path, body) in _requests(rollout_id).items()
    }


@pytest.fixture(scope="module")
def by_role(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`store serve` with two writer tokens, a finalizer and a control token (options)."""
    directory: Path = tmp_path_factory.mktemp("roles")
    port = free_port()
    args = ["store", "serve", "--dir", str(directory), "--port", str(port)]
    args += ["--writer-token", WRITER, "--writer-token", SECOND_WRITER]
    args += ["--finalizer-token", FINALIZER, "--control-token", CONTROL]
    with running_process(args, port=port):
        yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("token", [WRITER, SECOND_WRITER])
def test_a_writer_token_writes_and_resolves_but_never_freezes_or_drops(
    by_role: str, token: str
) -> None:
    """Begin, put, incomplete and resolve answer 200; freeze and drop 403."""
    statuses = _statuses(by_role, token)
    assert statuses == {**dict.fromkeys(WRITER_ROUTES, 200), **dict.fromkeys(FINALIZER_ROUTES, 403)}


def test_a_finalizer_token_freezes_and_drops_but_never_writes(by_role: str) -> None:
    """Freeze and drop answer 200; every writer route 403."""
    statuses = _statuses(by_role, FINALIZER)
    assert statuses == {**dict.fromkeys(WRITER_ROUTES, 403), **dict.fromkeys(FINALIZER_ROUTES, 200)}


def test_a_control_token_reaches_no_capture_route(by_role: str) -> None:
    """Control is for read-only control routes: every capture route answers 403."""
    assert set(_statuses(by_role, CONTROL).values()) == {403}


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_no_token_or_an_unknown_one_is_401(by_role: str, token: str | None) -> None:
    """Without a token, or with one of no role, every route answers 401."""
    assert set(_statuses(by_role, token).values()) == {401}


def test_health_needs_no_token(by_role: str) -> None:
    """Probes stay open."""
    assert httpx.get(f"{by_role}/health").status_code == 200


def test_a_wrong_role_is_told_which_role_the_route_needs(by_role: str) -> None:
    """The 403 says the route needs a finalizer token."""
    answer = httpx.post(
        by_role + _path("r1", "freeze"), headers={"Authorization": f"Bearer {WRITER}"}
    )
    assert (answer.status_code, "needs a finalizer token" in answer.json()["error"]) == (403, True)


async def test_the_clients_send_their_own_tokens(by_role: str) -> None:
    """The sink writes with a writer token, the http source freezes with a finalizer token;
    each refused with the other's."""
    rollout_id = f"roles-{uuid.uuid4().hex[:10]}"
    entry = make_entry(rollout_id, "c1", [1], [2])
    async with HttpTokenSink(url=by_role, token=WRITER) as sink:
        await sink.put(entry)
    async with HttpTokenSink(url=by_role, token=FINALIZER) as sink:
        with pytest.raises(PermissionDeniedError):
            await sink.put(entry)
    async with HttpTokenSource(by_role, token=WRITER) as source:
        with pytest.raises(SourceUnavailable, match="HTTP 403"):
            await source.freeze(rollout_id)
    async with HttpTokenSource(by_role, token=FINALIZER) as source:
        snapshot = await source.freeze(rollout_id)
    assert [e.model_call_id for e in snapshot.entries] == ["c1"]


def test_role_tokens_come_from_comma_lists_in_the_environment(tmp_path: Path) -> None:
    """`TOKEN_FINALIZER_STORE_{WRITER,FINALIZER}_TOKENS` give each role its tokens."""
    port = free_port()
    env = {
        "TOKEN_FINALIZER_STORE_WRITER_TOKENS": f"{WRITER}, {SECOND_WRITER}",
        "TOKEN_FINALIZER_STORE_FINALIZER_TOKENS": FINALIZER,
    }
    args = ["store", "serve", "--dir", str(tmp_path), "--port", str(port)]
    with running_process(args, port=port, env=env):
        base = f"http://127.0.0.1:{port}"
        statuses = [_statuses(base, token) for token in (WRITER, SECOND_WRITER, FINALIZER)]
    writer = {**dict.fromkeys(WRITER_ROUTES, 200), **dict.fromkeys(FINALIZER_ROUTES, 403)}
    finalizer = {**dict.fromkeys(WRITER_ROUTES, 403), **dict.fromkeys(FINALIZER_ROUTES, 200)}
    assert statuses == [writer, writer, finalizer]


def test_a_single_token_still_works_for_every_role(tmp_path: Path) -> None:
    """`--token T` alone: every route answers 200 with T (the setup of earlier versions)."""
    port = free_port()
    args = ["store", "serve", "--dir", str(tmp_path), "--port", str(port), "--token", "all-roles"]
    with running_process(args, port=port):
        statuses = _statuses(f"http://127.0.0.1:{port}", "all-roles")
    assert set(statuses.values()) == {200}
