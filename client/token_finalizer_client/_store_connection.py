"""One connection to a remote capture store (protocol v1), shared by the sink and the resolver.

Both are built by a NeMo Gym model server from keyword arguments, open their
connection pool on first use (inside the server's event loop), retry by the
package's one policy, and never show their token.
"""

from __future__ import annotations

import re

import httpx

from token_finalizer_client._constants import DEFAULT_CONNECTION_LIMITS, DEFAULT_MAX_RETRIES
from token_finalizer_client._exceptions import FinalizerError
from token_finalizer_client._retry import RetryPolicy
from token_finalizer_client._wire import check_base_url, default_headers

__all__ = ["StoreConnection", "check_id", "rollout_path"]

# The store's id rule (ASCII letters, digits, '.', '_', '-'; not '.' or '..'):
# checked here so a bad id fails before any request, with the same wording.
_STORE_ID = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)
_CAPTURE_PATH = "training-token-capture"
# A connect that takes long means the store is gone; a put may take a while to fsync.
_CONNECT_TIMEOUT_S = 5.0


def check_id(value: object, what: str) -> str:
    """`value` when it is a store id, else ValueError naming `what`."""
    if not isinstance(value, str) or not _STORE_ID.fullmatch(value) or value in {".", ".."}:
        raise ValueError(
            f"{what} {value!r} must be a non-empty string of ASCII letters, digits, '.', '_' or '-'"
        )
    return value


def rollout_path(rollout_id: str, operation: str) -> str:
    """`/ng-rollout/{id}/training-token-capture/{operation}`, the id checked first."""
    return f"/ng-rollout/{check_id(rollout_id, 'rollout_id')}/{_CAPTURE_PATH}/{operation}"


class StoreConnection:
    """The pooled, retried HTTP connection to one capture store."""

    def __init__(
        self,
        *,
        url: str,
        token: str | None = None,
        timeout: float = 10.0,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._retry = RetryPolicy(max_retries)
        self.max_retries = max_retries
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.url = check_base_url(url)
        self._headers = default_headers(token, None)
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, _CONNECT_TIMEOUT_S))
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._closed = False

    def __repr__(self) -> str:  # never shows the token
        return f"{type(self).__name__}(url={self.url!r})"

    def _http(self) -> httpx.AsyncClient:
        if self._closed:
            raise FinalizerError(f"{self!r} is closed")
        if self._client is None:
            # Created on first use, inside the model server's event loop.
            self._client = httpx.AsyncClient(
                base_url=self.url,
                headers=self._headers,
                timeout=self._timeout,
                limits=DEFAULT_CONNECTION_LIMITS,
                transport=self._transport,
            )
        return self._client

    async def close(self) -> None:
        """Close the connection pool; safe to call twice."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
