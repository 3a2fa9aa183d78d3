"""The HTTP side both distributions share: retry policy, store connections, ordered concurrency.

The service's `http` capture source and its offline batch commands use these,
as the client's own classes do, so each rule is written once
(docs/architecture.md#token_finalizer_client):

- the one retry policy: `RetryPolicy` (attempts, jittered exponential
  backoff, `Retry-After`), what is retried (`is_retryable_error`,
  `TRANSIENT_ERRORS`, `RETRY_STATUSES`);
- capture-store connections: `StoreEndpoint` (base URL, bearer token,
  compression, timeouts, pool limits) and `StoreConnection` (the sink's and
  the resolver's pooled, retried connection);
- negotiated extensions: `StoreCapabilities` (what a store advertises at
  `GET /capabilities`, asked once and kept, forgotten after a refusal), the
  feature names and `REFUSED_EXTENSION_STATUSES`
  (docs/store-protocol.md#extensions-and-capabilities);
- `ordered_map`: bounded concurrency with results in input order;
- `trace_headers`: the current trace context as W3C headers, which every
  request of the client carries (docs/tracing.md).

It needs httpx and stamina; the pure wire contract is `token_finalizer_client.protocol`.
"""

from __future__ import annotations

from token_finalizer_client._capabilities import (
    CAPABILITIES_PATH,
    COMPACT_FREEZE,
    COMPACT_RESOLVE,
    KNOWN_PREFIX,
    PACKED_FREEZE,
    PACKED_STAGE,
    REFUSED_EXTENSION_STATUSES,
    StoreCapabilities,
)
from token_finalizer_client._constants import RETRY_STATUSES
from token_finalizer_client._ordered import ordered_map
from token_finalizer_client._retry import TRANSIENT_ERRORS, RetryPolicy, is_retryable_error
from token_finalizer_client._store_connection import StoreConnection, StoreEndpoint
from token_finalizer_client._tracing import TRACE_API_MODULE, trace_headers

__all__ = [
    "CAPABILITIES_PATH",
    "COMPACT_FREEZE",
    "COMPACT_RESOLVE",
    "KNOWN_PREFIX",
    "PACKED_FREEZE",
    "PACKED_STAGE",
    "REFUSED_EXTENSION_STATUSES",
    "RETRY_STATUSES",
    "TRACE_API_MODULE",
    "TRANSIENT_ERRORS",
    "RetryPolicy",
    "StoreCapabilities",
    "StoreConnection",
    "StoreEndpoint",
    "is_retryable_error",
    "ordered_map",
    "trace_headers",
]
