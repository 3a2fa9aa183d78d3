"""Tunables of the client package."""

from __future__ import annotations

import httpx

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
DEFAULT_MAX_RETRIES = 2
DEFAULT_CONNECTION_LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=32)
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
