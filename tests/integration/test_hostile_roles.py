"""Issue 29, item 1: paths the role table and the router read differently, on real servers.

Starlette's route patterns end in `$`, which matches before a final newline:
`/freeze%0A` used to reach the freeze route while the role table found no
role, so any known token froze, dropped or read manifests. Each request is
sent byte for byte (http.client) to a real `store serve` with a token per
role, and to a real finalizer under uvicorn.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.servers import free_port, running_app, running_process
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping

WRITER, FINALIZER, CONTROL = "w-hostile", "f-hostile", "c-hostile"
ROLLOUT = "/ng-rollout/R/training-token-capture"
# (method, path, body) of every finalizer-only route, each with an encoded newline.
FINALIZER_ONLY = [
    ("POST", f"{ROLLOUT}/freeze%0A", {}),
    ("POST", f"{ROLLOUT}/drop%0A", {"snapshot_id": "s", "version": 1}),
    ("GET", f"{ROLLOUT}/ledger/manifest%0A", None),
    ("POST", f"{ROLLOUT}/staged/fetch%0A", {"model_call_ids": ["c1"]}),
    ("POST", f"{ROLLOUT}/staged/extras%0A", {"model_call_ids": ["c1"]}),
]


def send(
    base: str, method: str, path: str, token: str | None, body: Any = None
) -> tuple[int, dict[str, Any]]:
    """Send `path` unchanged to `base`; the status and the JSON answer."""
    parts = urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else {}
    finally:
        connection.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`store serve` over a staging directory, with a writer, finalizer and control token."""
    directory: Path = tmp_path_factory.mktemp("hostile-roles")
    port = free_port()
    args = ["store", "serve", "--dir", str(directory), "--port", str(port)]
    args += ["--writer-token", WRITER, "--finalizer-token", FINALIZER]
    args += ["--control-token", CONTROL]
    with running_process(args, port=port):
        yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("token", [WRITER, CONTROL])
@pytest.mark.parametrize(("method", "path", "body"), FINALIZER_ONLY)
def test_an_encoded_newline_never_reaches_a_finalizer_route(
    store: str, token: str, method: str, path: str, body: Any
) -> None:
    """A writer or control token sending a finalizer route plus `%0A` is refused 400."""
    status, answer = send(store, method, path, token, body)
    assert (status, "control character" in answer["error"]) == (400, True)


@pytest.mark.parametrize("escape", ["%0D", "%00", "%09", "%7F"])
def test_every_control_character_in_a_path_is_400(store: str, escape: str) -> None:
    """CR, NUL, TAB and DEL are refused like a newline, even to a finalizer token."""
    status, _ = send(store, "POST", f"{ROLLOUT}/freeze{escape}", FINALIZER, {})
    assert status == 400


@pytest.mark.parametrize("token", [WRITER, FINALIZER, CONTROL])
def test_a_path_no_route_serves_is_refused_to_every_token(store: str, token: str) -> None:
    """An unknown path answers 404 whichever role the token holds."""
    status, _ = send(store, "POST", f"{ROLLOUT}/freeze/more", token, {})
    assert status == 404


def test_the_finalizer_refuses_a_control_character_before_routing(tmp_path: Path) -> None:
    """`POST /finalize%0A` is a 400 on the finalizer too, before its token is checked."""
    settings = settings_from_mapping(
        {"sources": {"default": "local", "local": {"kind": "file", "dir": str(tmp_path)}}},
        env={},
    )
    with running_app(create_app(settings)) as base:
        status, answer = send(base, "POST", "/finalize%0A", None, {"rollout_id": "R"})
    assert (status, "control character" in answer["error"]) == (400, True)
