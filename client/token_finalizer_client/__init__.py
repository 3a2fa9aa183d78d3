"""Thin client of the token-finalizer service (httpx, stamina and the standard library only).

    from token_finalizer_client import FinalizerClient

    with FinalizerClient("http://finalizer:8000", token=..., run_id="run-42") as client:
        finalized = client.finalize(record)
        store_durably(finalized.record)
        client.retire(finalized)

`AsyncFinalizerClient` has the same surface plus `finalize_many`. Errors are
`FinalizerError` subclasses (see `_exceptions` for the tree). `HttpTokenSink`
is the writer side of a remote capture store, for model servers, and
`HttpLineageResolver` its request-time lineage lookup (NeMo Gym 0.7's
`LineageResolver`). This package never imports the service, so harnesses and
trainers stay light.

Optional, with the `fast` extra (`token-finalizer-client[fast]`): orjson
parses answers faster when it is installed, and `FinalizerClient(url,
as_numpy=True)` hands out token arrays (numpy) instead of lists.
"""

from __future__ import annotations

from token_finalizer_client._client import AsyncFinalizerClient, FinalizerClient
from token_finalizer_client._exceptions import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    FinalizerError,
    MaskFractionExceeded,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ServerError,
    SourceUnavailableError,
)
from token_finalizer_client._resolver import (
    HttpLineageResolver,
    LineageMatch,
    LineageResolution,
    ResolutionStatus,
)
from token_finalizer_client._sink import HttpTokenSink
from token_finalizer_client._types import Finalized, Readiness

__version__ = "0.2.0"

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncFinalizerClient",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "Finalized",
    "FinalizerClient",
    "FinalizerError",
    "HttpLineageResolver",
    "HttpTokenSink",
    "LineageMatch",
    "LineageResolution",
    "MaskFractionExceeded",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Readiness",
    "ResolutionStatus",
    "ServerError",
    "SourceUnavailableError",
    "__version__",
]
