"""What the clients and the sink send, and how they read the answers.

Kept apart from the transports so the sync client, the async client and the
sink build byte-identical requests (`WireRequest`) and map answers to results
and errors the same way; the transports only send and sleep.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from token_finalizer_client._constants import (
    ACCEPT_ENCODING,
    COMPACT_TOKENS,
    RETRY_STATUSES,
    RUN_ID_HEADER,
    USER_AGENT,
)
from token_finalizer_client._exceptions import FinalizerError, error_for_status
from token_finalizer_client._json import loads
from token_finalizer_client._types import Finalized, Readiness

__all__ = [
    "HEALTH_REQUEST",
    "READY_REQUEST",
    "WireRequest",
    "check_base_url",
    "decode_body",
    "default_headers",
    "encode_json",
    "finalize_params",
    "finalize_request",
    "parse_answer",
    "read_finalized",
    "read_object",
    "read_readiness",
    "read_retired",
    "retire_object",
    "retire_request",
]

_JSON_CONTENT = {"Content-Type": "application/json"}


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


@dataclass(frozen=True, slots=True)
class WireRequest:
    """One call as it goes on the wire; a retry sends it again unchanged.

    The body is encoded once, when the request is built, not on every try.
    `retry_statuses` are the answers that mean "repeat the call".
    """

    method: str
    path: str
    content: bytes | None = None
    params: dict[str, str] | None = None
    retry_statuses: Collection[int] = RETRY_STATUSES

    @classmethod
    def json(
        cls, method: str, path: str, payload: Any, *, params: dict[str, str] | None = None
    ) -> WireRequest:
        """A request with `payload` as its compact JSON body."""
        return cls(method, path, encode_json(payload), params)

    def send_options(self) -> dict[str, Any]:
        """Keyword arguments of httpx's `Client.request` and `AsyncClient.request`."""
        return {
            "method": self.method,
            "url": self.path,
            "content": self.content,
            "params": self.params,
            "headers": None if self.content is None else _JSON_CONTENT,
        }


HEALTH_REQUEST = WireRequest("GET", "/health")
# /ready answers 503 to say "not ready": an answer to report, not to repeat.
READY_REQUEST = WireRequest("GET", "/ready", retry_statuses=frozenset())


def decode_body(response: httpx.Response) -> Any:
    """The parsed JSON body (httpx already undid zstd), the text when it is not JSON.

    orjson parses it when installed, the stdlib otherwise (see `_json`).
    """
    content = response.content
    if not content:
        return None
    try:
        return loads(content)
    except ValueError:
        return response.text


def parse_answer(response: httpx.Response) -> Any:
    """The JSON body of a 2xx answer; the matching APIStatusError for any other."""
    return _successful(response, decode_body(response))


def _successful(response: httpx.Response, body: Any) -> Any:
    """`body` of a 2xx answer, when it is JSON; the matching error otherwise."""
    if not response.is_success:
        raise error_for_status(response.status_code, body)
    if isinstance(body, str):
        raise FinalizerError(
            f"{response.request.method} {response.request.url} answered {response.status_code} "
            f"with a body that is not JSON: {body[:200]!r}"
        )
    return body


def read_object(response: httpx.Response) -> dict[str, Any]:
    """The JSON object of a 2xx answer; the matching error for any other answer or body."""
    body = parse_answer(response)
    if not isinstance(body, dict):
        raise FinalizerError(
            f"{response.request.method} {response.request.url} answered {response.status_code} "
            f"with JSON that is not an object: {body!r:.200}"
        )
    return body


def finalize_params(source: str | None) -> dict[str, str]:
    """Query parameters of `POST /finalize`: the source, and always the compact token form."""
    name, value = COMPACT_TOKENS
    params = {} if source is None else {"source": source}
    params[name] = value
    return params


def finalize_request(record: dict[str, Any], source: str | None) -> WireRequest:
    """`POST /finalize` of one record, from `source` (the service's default when None)."""
    return WireRequest.json("POST", "/finalize", record, params=finalize_params(source))


def read_finalized(response: httpx.Response, *, as_numpy: bool = False) -> Finalized:
    """A `/finalize` answer as a `Finalized`; the matching error for any other answer.

    The compact token form is expanded here (as numpy arrays with `as_numpy`).
    """
    return Finalized.from_answer(parse_answer(response), as_numpy=as_numpy)


def read_readiness(response: httpx.Response) -> Readiness:
    """A `/ready` answer: 200 ready, 503 not ready (both with details); others raise."""
    if response.status_code not in (200, 503):
        parse_answer(response)  # raises the matching error for any other failure
    body = decode_body(response)
    if not isinstance(body, dict):
        raise FinalizerError(f"/ready answered {response.status_code} without a JSON object")
    return Readiness(ready=response.status_code == 200, status_code=response.status_code, body=body)


def read_retired(response: httpx.Response) -> bool:
    """The `retired` flag of a `/retire` answer; the matching error for any other answer.

    A 409 with `"retired": false` is an answer, not an error: the ticket is
    genuine but the store moved on since (a later write), so nothing was
    retired and nothing is lost.
    """
    body = decode_body(response)
    if response.status_code == 409 and isinstance(body, dict) and body.get("retired") is False:
        return False
    body = _successful(response, body)
    retired = body.get("retired") if isinstance(body, dict) else None
    if not isinstance(retired, bool):
        raise FinalizerError(f"the retire answer is not {{'retired': bool}}: {body!r:.200}")
    return retired


def retire_object(
    target: Finalized | Mapping[str, Any] | None,
) -> Mapping[str, Any] | None:
    """The `retire` object to post for `target`; None when there is nothing to retire.

    `target` is a `Finalized`, a finalize answer's `retire` object (e.g. read
    back from a JSON line), a whole v2 answer (a mapping with a `retire` key
    and no `ticket`, the service's own rule), or None. Any other mapping is
    sent as it is, and the service judges it.
    """
    if isinstance(target, Finalized):
        return target.retire
    if target is None:
        return None
    if not isinstance(target, Mapping):
        raise TypeError(
            "retire() takes a Finalized or the `retire` object of a finalize answer, "
            f"got {type(target).__name__}"
        )
    if "retire" in target and "ticket" not in target:  # a whole answer: send only its object
        inner = target["retire"]
        if inner is not None and not isinstance(inner, Mapping):
            raise TypeError(f"the answer's `retire` is not an object: {inner!r:.200}")
        return inner
    return target


def retire_request(target: Finalized | Mapping[str, Any] | None) -> WireRequest | None:
    """`POST /retire` with just the `retire` object; None when there is nothing to retire.

    A `Finalized` (or answer) whose `retire` is null (masked, failed, no
    build) is answered False without asking: the service would refuse it.
    """
    retire = retire_object(target)
    return None if retire is None else WireRequest.json("POST", "/retire", dict(retire))
