"""How long a client may take to send a request, and how many connections a server holds.

The numbers live in `_constants.py`; the two deadlines can be overridden per
process through the environment (a test runs a server with short ones, an
operator behind a slow link with longer ones). See web/protocol.py for the
request head and the connection cap, web/body.py for the body.
"""

from __future__ import annotations

import math
import os

from token_finalizer._constants import (
    BODY_TIMEOUT_ENV_VAR,
    CONNECTION_FD_RESERVE,
    HEAD_TIMEOUT_ENV_VAR,
    MAX_ACCEPT_BACKLOG,
    MAX_CONNECTIONS,
    MIN_CONNECTIONS,
    REQUEST_BODY_TIMEOUT_S,
    REQUEST_HEAD_TIMEOUT_S,
)

__all__ = [
    "check_deadlines",
    "connection_limits",
    "request_body_timeout_s",
    "request_head_timeout_s",
]


def _seconds(env_var: str, default: float) -> float:
    """`$env_var` as a positive number of seconds, else `default`; ValueError when invalid."""
    text = os.environ.get(env_var, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"${env_var} must be a positive number of seconds, got {text!r}")
    return seconds


def request_head_timeout_s() -> float:
    """Seconds a connection has to deliver a whole request head."""
    return _seconds(HEAD_TIMEOUT_ENV_VAR, REQUEST_HEAD_TIMEOUT_S)


def request_body_timeout_s() -> float:
    """Seconds a request body may take, before the allowance it earns per byte received."""
    return _seconds(BODY_TIMEOUT_ENV_VAR, REQUEST_BODY_TIMEOUT_S)


def check_deadlines() -> None:
    """Raise ValueError (naming the variable) when either override is invalid."""
    request_head_timeout_s()
    request_body_timeout_s()


def connection_limits() -> tuple[int, int]:
    """(connection cap, accept backlog) for this process's open-file limit.

    A server that runs out of file descriptors cannot accept anything, not even
    a health probe. asyncio accepts up to a backlog of connections before any
    of them reaches the protocol (which enforces the cap), so the cap and the
    backlog together, plus CONNECTION_FD_RESERVE, must fit the limit.
    """
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # no such limit on this platform
        return MAX_CONNECTIONS, MAX_ACCEPT_BACKLOG
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS, MAX_ACCEPT_BACKLOG
    share = (soft - CONNECTION_FD_RESERVE) // 2
    return (
        max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, share)),
        max(MIN_CONNECTIONS, min(MAX_ACCEPT_BACKLOG, share)),
    )
