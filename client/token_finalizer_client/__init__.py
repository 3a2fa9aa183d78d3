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
`LineageResolver`); `HttpTokenSource` is Gym's `TokenSource` over the same
store, for a Gym process that finalizes itself (its snapshots are Gym's own
types when Gym is importable, else `SourceSnapshot` of `SourceEntry`). For
NeMo Gym 0.7's external staging, `HttpCaptureLedger` is the model server's
capture ledger (Gym's `CaptureLedger`), `HttpStagingSink` the inference
worker's staging sink and
`HttpStagingSource` the trainer's staging source; `StageResult` and
`StagedCallBaseSnapshot` are what they hand out when Gym itself is not
loaded. A finalize of a staged rollout answers `Finalized.staged`, a
`StagedOutcome`: the verified `StagedRow` or the `StagedFailure`. This
package never imports the service (nor Gym), so harnesses and trainers stay
light.

Optional, with the `fast` extra (`token-finalizer-client[fast]`): orjson
encodes requests and parses answers faster when it is installed, and
`FinalizerClient(url, as_numpy=True)` hands out token arrays (numpy) instead
of lists.

Every client bounds what a server can do to it: each try's whole exchange
ends within `timeout`, an answer is read up to a size limit once decoded
(a zstd or gzip bomb is refused while decoding), and a server's message is
kept short. Retries are logged as warnings on the logger named
`LOGGER_NAME` ("token_finalizer_client"), with their fields in the record
attribute `LOG_FIELDS_ATTRIBUTE`; the package adds no handler.

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
    from token_finalizer_client._constants import LOG_FIELDS_ATTRIBUTE, LOGGER_NAME
    from token_finalizer_client._exceptions import (
        AnswerTooLargeError,
        APIConnectionError,
        APIStatusError,
        APITimeoutError,
        AuthenticationError,
        BadRequestError,
        ConflictError,
        FinalizerError,
        InvalidAnswerError,
        InvalidLedgerRequestError,
        LedgerConflictError,
        MalformedAnswerError,
        MaskFractionExceeded,
        NotFoundError,
        PayloadTooLargeError,
        PermissionDeniedError,
        ServerError,
        SourceUnavailableError,
        StoreFullError,
        UnsupportedFeatureError,
    )
    from token_finalizer_client._ledger import HttpCaptureLedger
    from token_finalizer_client._resolver import (
        HttpLineageResolver,
        LineageMatch,
        LineageResolution,
        ResolutionStatus,
    )
    from token_finalizer_client._sink import HttpTokenSink
    from token_finalizer_client._source_types import SourceEntry, SourceSnapshot
    from token_finalizer_client._staged_row import (
        ExtrasCommitment,
        StagedFailure,
        StagedOutcome,
        StagedRow,
        WeightVersionSpan,
    )
    from token_finalizer_client._staged_types import StagedCallBaseSnapshot, StageResult
    from token_finalizer_client._staging_sink import HttpStagingSink
    from token_finalizer_client._staging_source import HttpStagingSource
    from token_finalizer_client._token_source import HttpTokenSource
    from token_finalizer_client._types import Finalized, Readiness

__version__ = "0.4.0"

# Public name -> the private module defining it, imported when the name is first read.
_LAZY = {
    "AsyncFinalizerClient": "_client",
    "FinalizerClient": "_client",
    "LOG_FIELDS_ATTRIBUTE": "_constants",
    "LOGGER_NAME": "_constants",
    "AnswerTooLargeError": "_exceptions",
    "APIConnectionError": "_exceptions",
    "APIStatusError": "_exceptions",
    "APITimeoutError": "_exceptions",
    "AuthenticationError": "_exceptions",
    "BadRequestError": "_exceptions",
    "ConflictError": "_exceptions",
    "FinalizerError": "_exceptions",
    "InvalidAnswerError": "_exceptions",
    "InvalidLedgerRequestError": "_exceptions",
    "LedgerConflictError": "_exceptions",
    "MalformedAnswerError": "_exceptions",
    "MaskFractionExceeded": "_exceptions",
    "NotFoundError": "_exceptions",
    "PayloadTooLargeError": "_exceptions",
    "PermissionDeniedError": "_exceptions",
    "ServerError": "_exceptions",
    "SourceUnavailableError": "_exceptions",
    "StoreFullError": "_exceptions",
    "UnsupportedFeatureError": "_exceptions",
    "HttpLineageResolver": "_resolver",
    "LineageMatch": "_resolver",
    "LineageResolution": "_resolver",
    "ResolutionStatus": "_resolver",
    "HttpTokenSink": "_sink",
    "HttpTokenSource": "_token_source",
    "SourceEntry": "_source_types",
    "SourceSnapshot": "_source_types",
    "HttpCaptureLedger": "_ledger",
    "HttpStagingSink": "_staging_sink",
    "HttpStagingSource": "_staging_source",
    "ExtrasCommitment": "_staged_row",
    "StagedFailure": "_staged_row",
    "StagedOutcome": "_staged_row",
    "StagedRow": "_staged_row",
    "WeightVersionSpan": "_staged_row",
    "StageResult": "_staged_types",
    "StagedCallBaseSnapshot": "_staged_types",
    "Finalized": "_types",
    "Readiness": "_types",
}

__all__ = [
    "LOGGER_NAME",
    "LOG_FIELDS_ATTRIBUTE",
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AnswerTooLargeError",
    "AsyncFinalizerClient",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "ExtrasCommitment",
    "Finalized",
    "FinalizerClient",
    "FinalizerError",
    "HttpCaptureLedger",
    "HttpLineageResolver",
    "HttpStagingSink",
    "HttpStagingSource",
    "HttpTokenSink",
    "HttpTokenSource",
    "InvalidAnswerError",
    "InvalidLedgerRequestError",
    "LedgerConflictError",
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
    "SourceEntry",
    "SourceSnapshot",
    "SourceUnavailableError",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedFailure",
    "StagedOutcome",
    "StagedRow",
    "StoreFullError",
    "UnsupportedFeatureError",
    "WeightVersionSpan",
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
