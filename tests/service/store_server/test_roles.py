"""The role table of the store server: every route has exactly one decided role."""

from __future__ import annotations

import re

import pytest

from token_finalizer import MemoryTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server._route_access import route_access
from token_finalizer.store_server.roles import (
    ANY_TOKEN_ROUTES,
    OPEN_ROUTES,
    ROUTE_ROLES,
    StoreRole,
    StoreTokens,
    unassigned_routes,
)
from token_finalizer.web.auth import Unguarded


def test_every_served_route_has_a_role_or_is_open() -> None:
    """The app's routes are exactly the table's, the open ones and /metrics: none undecided.

    A token is configured, so NeMo Gym's control route (mounted only then) is served too.
    """
    app = create_store_app(MemoryTokenStore(), token="t")
    served = {
        (method, getattr(route, "path", None))
        for route in app.routes
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
    }
    assert served == set(ROUTE_ROLES) | OPEN_ROUTES | ANY_TOKEN_ROUTES


def test_a_route_missing_from_the_table_is_named() -> None:
    """A new route without its line in ROUTE_ROLES is reported (create_store_app refuses it)."""
    routes = [("POST", "/ng-rollout/{rollout_id}/training-token-capture/ledger/manifest")]
    assert unassigned_routes([*routes, ("GET", "/health")]) == [
        "POST /ng-rollout/{rollout_id}/training-token-capture/ledger/manifest"
    ]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/ng-rollout/{rollout_id}/training-token-capture/lineage/resolve"),
        ("POST", "/ng-rollout/{rollout_id}/training-token-capture/intents"),
        ("PUT", "/ng-rollout/{rollout_id}/training-token-capture/calls/{model_call_id:path}"),
    ],
)
def test_a_hot_route_without_a_role_is_refused(
    monkeypatch: pytest.MonkeyPatch, method: str, path: str
) -> None:
    """The hot path's plain Starlette routes are checked for a role like FastAPI's routes."""
    monkeypatch.delitem(ROUTE_ROLES, (method, path))
    with pytest.raises(RuntimeError, match=re.escape(f"{method} {path}")):
        create_store_app(MemoryTokenStore(), token="t")


@pytest.mark.parametrize(
    ("method", "path", "role"),
    [
        ("PUT", "/ng-rollout/r1/training-token-capture/calls/agent:3/call-7", "writer"),
        ("POST", "/ng-rollout/r1/training-token-capture/lineage/resolve", "writer"),
        ("POST", "/ng-rollout/r1/training-token-capture/freeze", "finalizer"),
        ("POST", "/ng-rollout/r1/training-token-capture/drop", "finalizer"),
        ("HEAD", "/ng-rollout/r1/training-token-capture/ledger/manifest", None),
        ("GET", "/ng-rollout/r1/training-token-capture/freeze", None),
        ("POST", "/ng-rollout/r1/training-token-capture/freeze/more", None),
        ("POST", "/ng-rollout/r1/training-token-capture/freeze\n", "finalizer"),
        ("GET", "/health", Unguarded.OPEN),
        ("GET", "/training-token-capture/control/rollouts/r1/manifest", Unguarded.SELF_CHECKED),
    ],
)
def test_role_of_a_request_follows_the_route_it_reaches(
    method: str, path: str, role: str | Unguarded | None
) -> None:
    """The role is the one of the route the router serves it with (a final newline included)."""
    app = create_store_app(MemoryTokenStore(), token="t")
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    assert route_access(app.router.routes)(scope) == role


def test_a_shared_token_holds_every_role() -> None:
    """`--token` (shared) is listed under every role, after each role's own tokens."""
    tokens = StoreTokens(writer=("w",), shared=("s",))
    assert tokens.by_role() == {
        StoreRole.WRITER: ("w", "s"),
        StoreRole.FINALIZER: ("s",),
        StoreRole.CONTROL: ("s",),
    }


def test_an_empty_store_token_is_refused() -> None:
    """An empty token would be a token nobody needs to know."""
    with pytest.raises(ValueError, match="empty"):
        StoreTokens(finalizer=("",))
