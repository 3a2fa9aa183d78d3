"""Bearer-token auth: /finalize and /retire need a configured token; probes stay open."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from tests.service.api.conftest import SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import record_for
from token_finalizer.api import create_app

TOKENS = ["first-secret-token", "second-secret-token"]


@pytest.fixture
def secured(make_settings: SettingsFactory) -> Iterator[httpx.Client]:
    """An in-process client of a service with two configured bearer tokens."""
    with in_process(create_app(make_settings(auth={"bearer_tokens": TOKENS}))) as client:
        yield client


@pytest.mark.parametrize("path", ["/finalize", "/retire"])
def test_missing_token_is_401_with_a_bearer_challenge(secured: httpx.Client, path: str) -> None:
    """Without Authorization the call answers 401, WWW-Authenticate: Bearer, and an error body."""
    response = secured.post(path, json=record_for("r-1"))
    assert (response.status_code, response.headers["www-authenticate"]) == (401, "Bearer")
    assert response.json() == {"error": "missing bearer token (Authorization: Bearer <token>)"}


def test_wrong_token_is_401(secured: httpx.Client) -> None:
    """A token that is not configured answers 401 `wrong bearer token`."""
    response = secured.post(
        "/finalize",
        json=record_for("r-1"),
        headers={"Authorization": "Bearer first-secret-tokeN"},
    )
    assert (response.status_code, response.json()) == (401, {"error": "wrong bearer token"})


def test_other_scheme_is_401(secured: httpx.Client) -> None:
    """A Basic (non-bearer) Authorization header answers 401."""
    response = secured.post("/finalize", json=record_for("r-1"), auth=("user", TOKENS[0]))
    assert (response.status_code, response.json()) == (
        401,
        {"error": "Authorization header must be 'Bearer <token>'"},
    )


@pytest.mark.parametrize("token", TOKENS)
def test_any_configured_token_is_accepted(secured: httpx.Client, token: str) -> None:
    """Each configured token authorizes a finalize."""
    response = secured.post(
        "/finalize",
        json=record_for("r-1"),
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200


def test_scheme_is_case_insensitive(secured: httpx.Client) -> None:
    """`bearer` in lower case is accepted like `Bearer`."""
    response = secured.post(
        "/finalize",
        json=record_for("r-1"),
        headers={"Authorization": f"bearer {TOKENS[1]}"},
    )
    assert response.status_code == 200


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
def test_probes_stay_open(secured: httpx.Client, path: str) -> None:
    """Health, readiness and metrics answer 200 without a token."""
    assert secured.get(path).status_code == 200


def test_auth_is_checked_before_the_body_is_read(secured: httpx.Client) -> None:
    """An unauthenticated invalid body answers 401, not 400: nothing is read for strangers."""
    response = secured.post(
        "/finalize", content=b"not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 401


def test_no_tokens_configured_means_no_auth(client: httpx.Client) -> None:
    """Without auth.bearer_tokens a finalize needs no Authorization header."""
    assert client.post("/finalize", json=record_for("r-1")).status_code == 200


def test_tokens_never_reach_the_logs(
    secured: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither accepted nor refused tokens appear in any log record."""
    caplog.set_level(logging.DEBUG)
    for token in [TOKENS[0], "refused-token-value"]:
        secured.post(
            "/finalize",
            json=record_for("r-1"),
            headers={"Authorization": f"Bearer {token}"},
        )
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "/finalize" in logged
    assert TOKENS[0] not in logged
    assert "refused-token-value" not in logged
