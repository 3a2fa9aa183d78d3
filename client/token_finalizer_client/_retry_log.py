"""How a retry of the project's policy is logged: one warning, on the package's logger, with fields.

stamina calls its on-retry hooks for every retry in the process. Its default
hooks count retries for Prometheus (when prometheus-client is installed) and
log each one: with the standard library that is a bare
`stamina.retry_scheduled` line on stderr (no handler takes the record, so
Python's last-resort handler prints its message alone), which says neither
what was retried nor why.

This module installs one hook in their place, once, when the retry policy is
imported. For a retry of `RetryPolicy` (a `retrying` block is open in this
thread or task) it logs a warning on the `token_finalizer_client` logger:
what is retried (method and path; never a header, so never a token), the
attempt that failed, the wait and the error, also as a dict of fields in the
record's `LOG_FIELDS_ATTRIBUTE` for JSON formatters (the service writes them
as keys of its JSON line; docs/configuration.md#logs). stamina's other
default hooks (the Prometheus counter) still see it. Any other retry in the
process goes to stamina's default hooks exactly as before.

The package adds no handler: an application decides where its warnings go.
An application that sets stamina's hooks itself after importing this
package replaces this hook, and its own hooks see the policy's retries too.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from stamina.instrumentation import (
    LoggingOnRetryHook,
    PrometheusOnRetryHook,
    RetryDetails,
    RetryHook,
    RetryHookFactory,
    StructlogOnRetryHook,
    set_on_retry_hooks,
)

from token_finalizer_client._constants import LOG_FIELDS_ATTRIBUTE, LOGGER_NAME
from token_finalizer_client._exceptions import shorten

__all__ = ["RetriedCall", "install", "retrying"]

logger = logging.getLogger(LOGGER_NAME)


@dataclass(frozen=True, slots=True)
class RetriedCall:
    """What a policy's call repeats, as its log line names it."""

    method: str
    path: str
    attempts: int


_CURRENT: contextvars.ContextVar[RetriedCall | None] = contextvars.ContextVar(
    "token_finalizer_client_retried_call", default=None
)


@contextlib.contextmanager
def retrying(call: RetriedCall) -> Iterator[None]:
    """Retries scheduled in this block (this thread or task) are the policy's, logged as `call`."""
    token = _CURRENT.set(call)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def describe_failure(exc: BaseException) -> str:
    """What went wrong in a try, in one short line."""
    text = str(exc)
    if text.startswith("HTTP "):  # a retryable answer: its status says it all
        return text
    return shorten(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def log_retry(call: RetriedCall, details: RetryDetails) -> None:
    """The warning for one scheduled retry of `call`."""
    error = describe_failure(details.caused_by)
    wait_s = round(details.wait_for, 3)
    fields = {
        "event": "retry",
        "method": call.method,
        "path": call.path,
        "attempt": details.retry_num,
        "attempts": call.attempts,
        "wait_s": wait_s,
        "error": error,
    }
    logger.warning(
        "%s %s failed (attempt %d of %d: %s); retrying in %.2fs",
        call.method,
        call.path,
        details.retry_num,
        call.attempts,
        error,
        wait_s,
        extra={LOG_FIELDS_ATTRIBUTE: fields},
    )


def _stamina_defaults() -> tuple[tuple[RetryHookFactory, ...], tuple[RetryHookFactory, ...]]:
    """stamina's documented default hooks: (the ones that count, the one that logs)."""
    counting = (PrometheusOnRetryHook,) if importlib.util.find_spec("prometheus_client") else ()
    logging_hook = (
        StructlogOnRetryHook if importlib.util.find_spec("structlog") else LoggingOnRetryHook
    )
    return counting, (logging_hook,)


class _RetryRouter:
    """The process's one on-retry hook: the policy's retries logged here, others as before."""

    def __init__(self) -> None:
        counting, logging_hooks = _stamina_defaults()
        self._factories = (counting, logging_hooks)
        self._hooks: tuple[tuple[RetryHook, ...], tuple[RetryHook, ...]] | None = None

    def _defaults(self) -> tuple[tuple[RetryHook, ...], tuple[RetryHook, ...]]:
        # Built on the first retry, as stamina builds its own (a Prometheus
        # counter is registered only once something is counted).
        if self._hooks is None:
            counting, logging_hooks = self._factories
            self._hooks = (
                tuple(factory.hook_factory() for factory in counting),
                tuple(factory.hook_factory() for factory in logging_hooks),
            )
        return self._hooks

    def __call__(self, details: RetryDetails) -> AbstractContextManager[None] | None:
        counting, logging_hooks = self._defaults()
        call = _CURRENT.get()
        if call is not None:
            log_retry(call, details)
            hooks = counting
        else:
            hooks = counting + logging_hooks
        scopes = [scope for hook in hooks if (scope := hook(details)) is not None]
        return _all_of(scopes) if scopes else None


@contextlib.contextmanager
def _all_of(scopes: list[AbstractContextManager[None]]) -> Iterator[None]:
    """The hooks' scopes, entered and left together (stamina enters it at once)."""
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            stack.enter_context(scope)
        yield


_installed = False


def install() -> None:
    """Put the router in place of stamina's default hooks (once per process)."""
    global _installed
    if not _installed:
        set_on_retry_hooks([_RetryRouter()])
        _installed = True
