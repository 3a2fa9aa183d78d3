"""What the clients and the sink send, and how they read the answers.

Kept apart from the transports so the sync client, the async client and the
sink build byte-identical requests (`WireRequest`) and map answers to results
and errors the same way; the transports only send and sleep. Answers arrive
as `Reply` objects (`_reply`, made by `_exchange`): read whole, decoded, within the limits.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from token_finalizer_client._constants import (
    ACCEPT_ENCODING,
    COMPACT_TOKENS,
    RETRY_STATUSES,
    RUN_ID_HEADER,
    USER_AGENT,
)
from token_finalizer_client._exceptions import InvalidAnswerError, error_for_status
from token_finalizer_client._json import dumps, loads
from token_finalizer_client._reply import Reply
from token_finalizer_client._tracing import trace_headers
from token_finalizer_client._types import Finalized, Readiness
from token_finalizer_client._url_credentials import masked

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
        shown = masked(base_url) if isinstance(base_url, str) else base_url
        raise ValueError(f"base_url {shown!r} must start with http:// or https://")
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


def encode_json(payload: Any) -> bytes:
    """Compact JSON: orjson when installed, the same bytes from the stdlib otherwise (`_json`)."""
    return dumps(payload)


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
    # Headers of this call only (over the pool's own), e.g. another role's Authorization.
    headers: Mapping[str, str] | None = None

    @classmethod
    def json(
        cls, method: str, path: str, payload: Any, *, params: dict[str, str] | None = None
    ) -> WireRequest:
        """A request with `payload` as its compact JSON body."""
        return cls(method, path, encode_json(payload), params)

    def send_options(self) -> dict[str, Any]:
        """Keyword arguments of httpx's `build_request` (either pool)."""
        return {
            "method": self.method,
            "url": self.path,
            "content": self.content,
            "params": self.params,
            "headers": self.own_headers(),
        }

    def own_headers(self) -> dict[str, str] | None:
        """This call's headers over the pool's: content type, its own, the trace context.

        Every pool sends what this returns, on every try: it is the one place
        where a request gets the caller's trace context (`_tracing`).
        """
        traced = trace_headers()
        if self.headers is None and traced is None:
            return None if self.content is None else _JSON_CONTENT
        return {
            **(self.headers or {}),
            **(_JSON_CONTENT if self.content is not None else {}),
            **(traced or {}),
        }


HEALTH_REQUEST = WireRequest("GET", "/health")
# /ready answers 503 to say "not ready": an answer to report, not to repeat.
READY_REQUEST = WireRequest("GET", "/ready", retry_statuses=frozenset())


def decode_body(reply: Reply) -> Any:
    """The parsed JSON body (already decompressed), the text when it is not JSON.

    orjson parses it when installed, the stdlib otherwise (see `_json`).
    """
    content = reply.content
    if not content:
        return None
    try:
        return loads(content)
    except ValueError:
        return reply.text


def parse_answer(reply: Reply) -> Any:
    """The JSON body of a 2xx answer; the matching APIStatusError for any other."""
    return _successful(reply, decode_body(reply))


def _successful(reply: Reply, body: Any) -> Any:
    """`body` of a 2xx answer, when it is JSON; the matching error otherwise."""
    if not reply.is_success:
        raise error_for_status(reply.status_code, body)
    if isinstance(body, str):
        raise InvalidAnswerError(
            f"{reply.request} answered {reply.status_code} "
            f"with a body that is not JSON: {body[:200]!r}"
        )
    return body


def read_object(reply: Reply) -> dict[str, Any]:
    """The JSON object of a 2xx answer; the matching error for any other answer or body."""
    body = parse_answer(reply)
    if not isinstance(body, dict):
        raise InvalidAnswerError(
            f"{reply.request} answered {reply.status_code} "
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


def read_finalized(reply: Reply, *, as_numpy: bool = False) -> Finalized:
    """A `/finalize` answer as a `Finalized`; the matching error for any other answer.

    The compact token form is expanded here (as numpy arrays with `as_numpy`).
    """
    return Finalized.from_answer(parse_answer(reply), as_numpy=as_numpy)


def read_readiness(reply: Reply) -> Readiness:
    """A `/ready` answer: 200 ready, 503 not ready (both with details); others raise."""
    if reply.status_code not in (200, 503):
        parse_answer(reply)  # raises the matching error for any other failure
    body = decode_body(reply)
    if not isinstance(body, dict):
        raise InvalidAnswerError(f"/ready answered {reply.status_code} without a JSON object")
    return Readiness(ready=reply.status_code == 200, status_code=reply.status_code, body=body)


def read_retired(reply: Reply) -> bool:
    """The `retired` flag of a `/retire` answer; the matching error for any other answer.

    A 409 with `"retired": false` is an answer, not an error: the ticket is
    genuine but the store moved on since (a later write), so nothing was
    retired and nothing is lost.
    """
    body = decode_body(reply)
    if reply.status_code == 409 and isinstance(body, dict) and body.get("retired") is False:
        return False
    body = _successful(reply, body)
    retired = body.get("retired") if isinstance(body, dict) else None
    if not isinstance(retired, bool):
        raise InvalidAnswerError(f"the retire answer is not {{'retired': bool}}: {body!r:.200}")
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
