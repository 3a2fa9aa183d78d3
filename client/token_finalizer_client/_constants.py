"""Tunables of the client package.

Plain values only, no httpx: `token_finalizer_client.protocol` reads the id
limit from here and must stay importable without any HTTP library.
"""

from __future__ import annotations

# Finalizer clients: seconds a call may take, and seconds to connect (a
# connect that takes long means the server is gone).
DEFAULT_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0
# Capture-store connections (sink, resolver): seconds a call may take; a put
# may wait for the store's fsync.
DEFAULT_STORE_TIMEOUT_S = 10.0
DEFAULT_MAX_RETRIES = 2
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_MAX_KEEPALIVE = 32
RETRY_BASE_DELAY_S = 0.25
RETRY_MAX_DELAY_S = 4.0
# Only these statuses mean "the server is momentarily unable": repeat the call.
RETRY_STATUSES = frozenset({502, 503, 504})
RUN_ID_HEADER = "X-Run-Id"
# Asked for on every call: large finalize answers shrink ~100x under zstd.
ACCEPT_ENCODING = "zstd, gzip"
# Query parameter of every finalize: each prompt as a prefix length of one
# `context_token_ids`, so the answer grows with the context, not calls x context.
COMPACT_TOKENS = ("tokens", "compact")
# finalize_many: calls in flight by default, and how far past the oldest
# unfinished record it may start (a multiple of the concurrency), which bounds
# the answers held back waiting for a slow one.
DEFAULT_CONCURRENCY = 8
REORDER_WINDOW_FACTOR = 4
USER_AGENT = "token-finalizer-client"
# Longest rollout or model call id a store accepts: ids become file names
# (plus a suffix of at most 25 characters) and Redis keys (docs/records-and-builds.md).
MAX_ID_LENGTH = 200
