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

Two public modules hold what the service shares with this package:
`token_finalizer_client.protocol` (fingerprints, the id rule, protocol paths;
pure, no httpx) and `token_finalizer_client.transport` (retry policy, store
connections). The names above are imported on first use (PEP 562), so
importing `protocol` loads neither httpx nor zstandard: the service's core
imports it and stays pure.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from token_finalizer_client._client import AsyncFinalizerClient, FinalizerClient
    from token_finalizer_client._exceptions import (
        APIConnectionError,
        APIStatusError,
        APITimeoutError,
        AuthenticationError,
        BadRequestError,
        ConflictError,
        FinalizerError,
        MalformedAnswerError,
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

# Public name -> the private module defining it, imported when the name is first read.
_LAZY = {
    "AsyncFinalizerClient": "_client",
    "FinalizerClient": "_client",
    "APIConnectionError": "_exceptions",
    "APIStatusError": "_exceptions",
    "APITimeoutError": "_exceptions",
    "AuthenticationError": "_exceptions",
    "BadRequestError": "_exceptions",
    "ConflictError": "_exceptions",
    "FinalizerError": "_exceptions",
    "MalformedAnswerError": "_exceptions",
    "MaskFractionExceeded": "_exceptions",
    "NotFoundError": "_exceptions",
    "PayloadTooLargeError": "_exceptions",
    "PermissionDeniedError": "_exceptions",
    "ServerError": "_exceptions",
    "SourceUnavailableError": "_exceptions",
    "HttpLineageResolver": "_resolver",
    "LineageMatch": "_resolver",
    "LineageResolution": "_resolver",
    "ResolutionStatus": "_resolver",
    "HttpTokenSink": "_sink",
    "Finalized": "_types",
    "Readiness": "_types",
}

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
    "MalformedAnswerError",
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


def __getattr__(name: str) -> object:
    """A public name, imported from its module on first use and kept (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later reads find it without this hook
    return value


def __dir__() -> list[str]:
    """Every name of the package, the ones not imported yet included."""
    return sorted({*globals(), *_LAZY})
