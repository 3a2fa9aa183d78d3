"""The FastAPI application factory and its lifespan.

Sources are opened once when the app starts and closed when it stops, so
connection pools and directories are shared by every request. On SIGTERM
the app marks itself draining (/ready answers 503) and keeps serving for
`drain_seconds`; then uvicorn stops accepting connections and lets in-flight
finalizes finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from fastapi import FastAPI

from token_finalizer import __version__
from token_finalizer._memory import tune_allocator
from token_finalizer.api.docs import declare_bearer_auth, install_offline_docs
from token_finalizer.api.errors import install_api_error_handlers
from token_finalizer.api.routes import router
from token_finalizer.core.protocols import TokenSource
from token_finalizer.service.metrics import ServiceMetrics
from token_finalizer.service.state import ServiceState
from token_finalizer.settings import Settings, load_settings
from token_finalizer.web.access_log import AccessLogMiddleware
from token_finalizer.web.paths import ControlCharacterRefusal
from token_finalizer.web.tracing import FASTAPI_TELEMETRY, install_tracing

__all__ = ["DRAIN_ENV_VAR", "app_from_environment", "create_app"]

# How `serve --workers N` hands --drain-seconds to the worker processes.
DRAIN_ENV_VAR = "TOKEN_FINALIZER_DRAIN_SECONDS"

logger = logging.getLogger(__name__)

_DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _chain_drain_signals(state: ServiceState, drain_seconds: float) -> Callable[[], None]:
    """On SIGTERM: answer /ready 503 for `drain_seconds` while still serving, then shut down.

    Load balancers and orchestrators take a probe or two to notice that a
    process is going away; during that window requests keep arriving and are
    served normally. Only then is uvicorn's own handler (installed before the
    lifespan starts) called, which stops accepting and lets in-flight
    requests finish. SIGINT, or a second SIGTERM, hands over at once.
    Returns a function that restores the previous handlers. Signals can only
    be handled in the main thread: elsewhere (an app served from a test
    thread) nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in _DRAIN_SIGNALS}
    loop = asyncio.get_running_loop()

    def hand_over(sig: int, frame: Any) -> None:
        handler = previous[signal.Signals(sig)]
        if callable(handler):
            handler(sig, frame)
        elif handler != signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)

    def on_signal(sig: int, frame: Any) -> None:
        already_draining = state.draining
        state.begin_draining()
        if sig == signal.SIGTERM and drain_seconds > 0 and not already_draining:
            logger.info("SIGTERM: draining for %.1f s before shutting down", drain_seconds)
            # call_soon_threadsafe is the signal-safe way into a running loop.
            loop.call_soon_threadsafe(loop.call_later, drain_seconds, hand_over, sig, frame)
            return
        hand_over(sig, frame)

    for sig in _DRAIN_SIGNALS:
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def create_app(
    settings: Settings,
    *,
    sources: Mapping[str, TokenSource] | None = None,
    drain_seconds: float = 0.0,
) -> FastAPI:
    """The finalizer HTTP service over `settings`.

    `drain_seconds` is how long a SIGTERM keeps the process serving with /ready
    at 503 before it stops accepting connections (see `_chain_drain_signals`).

    `sources` lets an embedding program plug in its own TokenSource objects by
    name (used instead of a configured source of the same name, or added to
    them); the app does not close them. Every other configured source is
    opened at start-up and closed at shutdown.
    """
    metrics = ServiceMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with ServiceState.open(settings, sources=sources, metrics=metrics) as state:
            app.state.service = state
            restore_signals = _chain_drain_signals(state, drain_seconds)
            logger.info("token-finalizer ready; sources: %s", ", ".join(state.sources.names))
            try:
                yield
            finally:
                state.begin_draining()
                restore_signals()

    app = FastAPI(
        title="token-finalizer",
        version=__version__,
        summary="Freeze, rebuild and retire exact token captures of RL agent rollouts.",
        lifespan=lifespan,
        # FastAPI's own pages load Swagger UI and ReDoc from a CDN: these are served
        # with the app's own assets instead (api/docs.py), so /docs works offline.
        docs_url=None,
        redoc_url=None,
        telemetry=FASTAPI_TELEMETRY,
    )
    install_api_error_handlers(app)
    # Before routing: no path decoded with a control character is matched (web/paths.py).
    app.add_middleware(ControlCharacterRefusal)
    app.add_middleware(AccessLogMiddleware, observe=metrics.observe_request)
    app.include_router(router)
    install_offline_docs(app)
    if settings.auth.bearer_tokens:
        declare_bearer_auth(app, router.routes)
    # Last, so the server span covers every middleware (docs/tracing.md).
    install_tracing(app, "token-finalizer")
    return app


def app_from_environment() -> FastAPI:
    """The app over the configuration named by $TOKEN_FINALIZER_CONFIG (defaults without it).

    The import target of `token-finalizer serve --workers N`: every worker
    process builds its own app, with its own sources, from the same file.
    """
    # Each worker is its own process: tune glibc's allocator here too, so
    # freed large answers go back to the OS (see token_finalizer._memory).
    tune_allocator()
    drain = os.environ.get(DRAIN_ENV_VAR)
    return create_app(load_settings(), drain_seconds=float(drain) if drain else 0.0)
