"""What the sync and async clients send and how they read the answers.

Kept apart from the clients so both build byte-identical requests and map
answers to results and errors the same way.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from token_finalizer_client._constants import ACCEPT_ENCODING, RUN_ID_HEADER, USER_AGENT
from token_finalizer_client._exceptions import FinalizerError, error_for_status
from token_finalizer_client._types import Finalized, Readiness

__all__ = [
    "check_base_url",
    "decode_body",
    "default_headers",
    "encode_json",
    "finalize_params",
    "parse_answer",
    "read_readiness",
    "read_retired",
    "retire_payload",
    "retire_target",
]


def check_base_url(base_url: str) -> str:
    """The service URL without a trailing slash; ValueError for anything but http(s)."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url {base_url!r} must start with http:// or https://")
    return base_url.rstrip("/")


def default_headers(token: str | None, run_id: str | None) -> dict[str, str]:
    """Headers of every request: compression, optional bearer token and run id."""
    headers = {
        "Accept": "application/json",
        "Accept-Encoding": ACCEPT_ENCODING,
        "User-Agent": USER_AGENT,
    }
    if token is not None:
        if not token:
            raise ValueError("token is empty; pass None for no token")
        headers["Authorization"] = f"Bearer {token}"
    if run_id is not None:
        if not run_id:
            raise ValueError("run_id is empty; pass None for the server's default run")
        headers[RUN_ID_HEADER] = run_id
    return headers


def _plain(value: Any) -> Any:
    # Arrays from numpy (or anything with the same method) become lists, without
    # this package having to import numpy.
    to_list = getattr(value, "tolist", None)
    if callable(to_list):
        return to_list()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode_json(payload: Any) -> bytes:
    """Compact JSON (the stdlib's C encoder; no spaces to send)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=_plain).encode()


def decode_body(response: httpx.Response) -> Any:
    """The parsed JSON body (httpx already undid zstd), the text when it is not JSON."""
    content = response.content
    if not content:
        return None
    try:
        return json.loads(content)
    except ValueError:
        return response.text


def parse_answer(response: httpx.Response) -> Any:
    """The JSON body of a 2xx answer; the matching APIStatusError for any other."""
    body = decode_body(response)
    if not response.is_success:
        raise error_for_status(response.status_code, body)
    if isinstance(body, str):
        raise FinalizerError(
            f"{response.request.method} {response.request.url} answered {response.status_code} "
            f"with a body that is not JSON: {body[:200]!r}"
        )
    return body


def finalize_params(source: str | None) -> dict[str, str] | None:
    """Query parameters of `POST /finalize`."""
    return None if source is None else {"source": source}


def retire_payload(
    rollout_id: str | None, build: dict[str, Any] | None, source: str | None
) -> dict[str, Any]:
    """The `POST /retire` body, without the rebuilt tokens.

    The service decides from the build's flags and `_capture_snapshot` alone;
    sending tens of megabytes of rebuilt tokens back would cost more than the
    retire itself. The rebuilt response is kept as a stub so that "has a
    rebuilt response" still holds.
    """
    payload: dict[str, Any] = {}
    if rollout_id is not None:
        payload["rollout_id"] = rollout_id
    if isinstance(build, dict):
        slim = dict(build)
        rebuilt = slim.get("rebuilt_response")
        if isinstance(rebuilt, dict):
            slim["rebuilt_response"] = {"id": rebuilt.get("id")}
        payload["build"] = slim
    elif build is not None:
        payload["build"] = build
    if source is not None:
        payload["source"] = source
    return payload


def read_readiness(response: httpx.Response) -> Readiness:
    """A `/ready` answer: 200 ready, 503 not ready (both with details); others raise."""
    if response.status_code not in (200, 503):
        parse_answer(response)  # raises the matching error for any other failure
    body = decode_body(response)
    if not isinstance(body, dict):
        raise FinalizerError(f"/ready answered {response.status_code} without a JSON object")
    return Readiness(ready=response.status_code == 200, status_code=response.status_code, body=body)


def read_retired(body: Any) -> bool:
    """The `retired` flag of a `/retire` answer."""
    if not isinstance(body, dict) or not isinstance(body.get("retired"), bool):
        raise FinalizerError(f"the retire answer is not {{'retired': bool}}: {body!r:.200}")
    return body["retired"]


def retire_target(
    finalized: Finalized | None,
    rollout_id: str | None,
    build: dict[str, Any] | None,
    source: str | None,
) -> dict[str, Any] | None:
    """The retire body for either calling form; None when there is nothing to retire.

    A `Finalized` that is not retirable (masked, failed, no build) is answered
    False without asking: the service would refuse it anyway.
    """
    if finalized is not None:
        if rollout_id is not None or build is not None:
            raise TypeError("retire() takes a Finalized or rollout_id= and build=, not both")
        if not isinstance(finalized, Finalized):
            raise TypeError(f"retire() expects a Finalized, got {type(finalized).__name__}")
        if not finalized.retirable:
            return None
        return retire_payload(
            finalized.rollout_id, finalized.build, finalized.source if source is None else source
        )
    return retire_payload(rollout_id, build, source)
