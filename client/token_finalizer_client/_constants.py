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
