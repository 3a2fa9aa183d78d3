"""Errors raised by the client package.

    FinalizerError
    ├── MalformedAnswerError        a 2xx answer that breaks the protocol (e.g. a token id that
    │                                  is not an integer in [0, 2**64)): never coerced
    ├── APIConnectionError          the request did not get an HTTP answer
    │   └── APITimeoutError         ... because it timed out (a try's whole exchange, or the call)
    ├── InvalidAnswerError          an answer the client refuses to read: it does not decode,
    │   │                           or it is not what the call answers
    │   └── AnswerTooLargeError     ... because it is (or decodes to) more than the client's limit
    ├── UnsupportedFeatureError     the store does not advertise the extension a call needs
    │                                  (`feature`; nothing was sent but the capabilities probe)
    └── APIStatusError              an HTTP answer with an error status (status_code, message, body)
        ├── BadRequestError         400, 422: the request itself is wrong
        │   └── InvalidLedgerRequestError  ... a capture-ledger call (also a ValueError)
        ├── AuthenticationError     401: missing or wrong bearer token
        ├── PermissionDeniedError   403: refused although authenticated (a retire
        │                              ticket that does not verify)
        ├── NotFoundError           404: unknown source (or path)
        ├── ConflictError           409: a capture store refused a write (conflict, frozen, retired)
        │   ├── LedgerConflictError    ... a ledger row or failure (also a ValueError, as
        │   │                          NeMo Gym's CaptureLedger protocol asks)
        │   └── MaskFractionExceeded   409 from /finalize: the run masks too much
        │                              (finalized, masked, reasons)
        ├── PayloadTooLargeError    413: the body is over the server's limit
        └── ServerError             5xx
            ├── SourceUnavailableError  503 naming a `source`: the capture store could not
            │                           be reached; retried, then raised (`.source`)
            └── StoreFullError      507: the capture store is out of memory or space; never
                                        retried (`.memory`: used, max, fraction, high_water)

`error_for_status` is the one place that maps an HTTP answer to a class. A
server's message is kept to `MAX_MESSAGE_CHARS` (`shorten`): a hostile server
cannot hand a caller a gigabyte-long exception.
"""

from __future__ import annotations

from typing import Any

from token_finalizer_client._constants import MAX_MESSAGE_CHARS

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AnswerTooLargeError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "FinalizerError",
    "InvalidAnswerError",
    "InvalidLedgerRequestError",
    "LedgerConflictError",
    "MalformedAnswerError",
    "MaskFractionExceeded",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ServerError",
    "SourceUnavailableError",
    "StoreFullError",
    "UnsupportedFeatureError",
    "error_for_status",
    "shorten",
]


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` itself when it has at most `limit` characters, else its start and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


class FinalizerError(Exception):
    """Base class of every error this package raises."""


class ClientClosedError(FinalizerError, RuntimeError):
    """A call on a client object after its `close()` (a RuntimeError, as httpx's own was)."""


class MalformedAnswerError(FinalizerError):
    """The service answered something the protocol does not allow; nothing of it is used.

    Raised instead of repairing the answer: a token id given as 1.7, "12" or
    true is never turned into 1, 12 or 1 on its way to a trainer.
    """


class APIConnectionError(FinalizerError):
    """No HTTP answer: refused, reset, DNS, TLS, or a broken stream."""


class APITimeoutError(APIConnectionError):
    """No HTTP answer in time."""


class InvalidAnswerError(FinalizerError):
    """An answer the client will not use: a body that does not decode, or not the call's answer."""


class AnswerTooLargeError(InvalidAnswerError):
    """An answer over the client's size limit, on the wire or once decoded; it was not kept."""


class UnsupportedFeatureError(FinalizerError):
    """The store does not advertise the protocol extension a call needs (`feature`).

    Raised before the call's request is sent (docs/store-protocol.md#extensions-and-capabilities):
    a store that predates the extension has no plain-v1 way to do it.
    """

    def __init__(self, feature: str, message: str) -> None:
        super().__init__(message)
        self.feature = feature


class APIStatusError(FinalizerError):
    """An HTTP answer with an error status; `message` is the server's `error` text."""

    def __init__(self, status_code: int, message: str, body: Any = None) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.body = body


class BadRequestError(APIStatusError):
    """400 or 422: the request was refused as malformed."""


class AuthenticationError(APIStatusError):
    """401: the bearer token is missing or wrong."""


class PermissionDeniedError(APIStatusError):
    """403: refused whoever asks, e.g. a retire ticket that was forged or edited."""


class NotFoundError(APIStatusError):
    """404: an unknown source name or path."""


class ConflictError(APIStatusError):
    """409: the server refused because of the state it holds."""


class LedgerConflictError(ConflictError, ValueError):
    """409 from a capture ledger: the call id already has a different row, or the rollout is
    frozen or retired (the message says which). A ValueError too: NeMo Gym's
    `CaptureLedger.record` must fail that way for a reused call id."""


class InvalidLedgerRequestError(BadRequestError, ValueError):
    """400 or 422 from a capture ledger: the store refused the rollout id or the row.

    A ValueError too: NeMo Gym's `CaptureLedger.manifest` raises one for an id the store refuses.
    """


class MaskFractionExceeded(ConflictError):
    """409 from /finalize: this run's masked fraction crossed the configured guard."""

    def __init__(self, status_code: int, message: str, body: Any = None) -> None:
        super().__init__(status_code, message, body)
        details = body if isinstance(body, dict) else {}
        self.finalized: int = int(details.get("finalized", 0))
        self.masked: int = int(details.get("masked", 0))
        self.reasons: dict[str, int] = dict(details.get("reasons") or {})


class PayloadTooLargeError(APIStatusError):
    """413: the body is larger than the server accepts."""


class ServerError(APIStatusError):
    """5xx: the server failed."""


class SourceUnavailableError(ServerError):
    """503 from /finalize or /retire: the capture store is out of reach; nothing was lost.

    The call was repeated with backoff first; try again later (the record's
    capture is intact). `source` names the configured source.
    """

    @property
    def source(self) -> str | None:
        body = self.body
        source = body.get("source") if isinstance(body, dict) else None
        return source if isinstance(source, str) else None


class StoreFullError(ServerError):
    """507 from a capture store: it is above its memory high-water mark (or out of disk).

    Not retried: memory comes back when rollouts are finalized and retired, not
    within a model call; the write did not take effect (the call's capture is
    lost, and its rollout masks). `memory` is what the store reported (`used`,
    `max`, `fraction`, `high_water`), empty when it said nothing.
    """

    @property
    def memory(self) -> dict[str, Any]:
        body = self.body
        memory = body.get("memory") if isinstance(body, dict) else None
        return dict(memory) if isinstance(memory, dict) else {}


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: BadRequestError,
    507: StoreFullError,
}


def error_for_status(status_code: int, body: Any) -> APIStatusError:
    """The exception for an error answer; `body` is its parsed JSON (or text)."""
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        message = body["error"]
    else:
        message = str(body) if body not in (None, "") else f"HTTP status {status_code}"
    message = shorten(message)
    if status_code == 409 and isinstance(body, dict) and "masked" in body:
        return MaskFractionExceeded(status_code, message, body)
    if status_code == 503 and isinstance(body, dict) and "source" in body:
        return SourceUnavailableError(status_code, message, body)
    cls = _BY_STATUS.get(status_code)
    if cls is None:
        cls = ServerError if status_code >= 500 else APIStatusError
    return cls(status_code, message, body)
