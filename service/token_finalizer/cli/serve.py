"""`token-finalizer serve`: run the finalizer HTTP service under uvicorn.

The configuration is loaded and validated before any server starts: an
invalid file exits with status 2 and a message naming the key. With several
workers uvicorn imports the app in each worker process (factory mode), and
the configuration path reaches them through $TOKEN_FINALIZER_CONFIG; their
Prometheus metrics are summed through a fresh PROMETHEUS_MULTIPROC_DIR that
lives as long as the server (service/metrics.py). A PROMETHEUS_MULTIPROC_DIR
set by the operator is used instead, created if missing and emptied of an
earlier run's values first, whatever the worker count.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
from pathlib import Path
from typing import Any

from token_finalizer._constants import (
    DEFAULT_DRAIN_S,
    DEFAULT_HOST,
    DEFAULT_PORT,
    GRACEFUL_SHUTDOWN_S,
)
from token_finalizer._logging import say
from token_finalizer.cli.args import positive_int
from token_finalizer.settings import (
    CONFIG_ENV_VAR,
    OVERRIDE_DELIMITER,
    OVERRIDE_PREFIX,
    ConfigError,
    load_settings,
)

# The `retire.key` override every worker reads (docs/configuration.md#environment).
RETIRE_KEY_OVERRIDE = f"{OVERRIDE_PREFIX}RETIRE{OVERRIDE_DELIMITER}KEY"

__all__ = ["HELP", "add_arguments", "serve"]

HELP = "run the finalizer HTTP service (POST /finalize, POST /retire, health, metrics)"

# uvicorn imports this in each worker when --workers > 1.
_APP_FACTORY = "token_finalizer.api:app_from_environment"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer serve`."""
    parser.add_argument(
        "--config",
        metavar="PATH",
        help=f"YAML configuration (default: ${CONFIG_ENV_VAR}, else one file source in ./capture)",
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"bind address (default {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=DEFAULT_DRAIN_S,
        metavar="S",
        help="after SIGTERM keep serving this long with /ready at 503, so load balancers "
        f"stop sending before the port closes (default {DEFAULT_DRAIN_S:g}; SIGINT skips it)",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="worker processes (default 1); each opens its own sources, /metrics sums "
        "every worker's, and mask-fraction counts are per worker unless guard.redis is set",
    )


def _start_refusals(settings: Any) -> list[str]:
    """The Redis servers refused at start, one line each (service/store_policy.py)."""
    from token_finalizer.service.store_policy import needs_start_check, start_refusals

    if not needs_start_check(settings):
        return []
    import asyncio

    return asyncio.run(start_refusals(settings))


def _warn_shared_key(log_config: dict[str, Any], workers: int) -> None:
    """The retire.key warning, logged once by the parent: its workers never see a missing key."""
    import logging.config

    from token_finalizer.service.tickets import warn_key_not_configured

    # uvicorn applies the same configuration again when it starts.
    logging.config.dictConfig(log_config)
    warn_key_not_configured(f"made for this run and shared by its {workers} workers, so a replica")


def serve(args: argparse.Namespace) -> int:
    """Validate the configuration, then serve until SIGTERM/SIGINT."""
    config_path = args.config or os.environ.get(CONFIG_ENV_VAR) or None
    try:
        settings = load_settings(config_path)
    except ConfigError as exc:
        say(logging.ERROR, f"token-finalizer serve: {exc}")
        return 2

    refused = _start_refusals(settings)
    if refused:
        for line in refused:
            say(logging.ERROR, f"token-finalizer serve: {line}")
        return 2

    import uvicorn

    from token_finalizer._logging import logging_config
    from token_finalizer._memory import tune_allocator
    from token_finalizer.api.app import DRAIN_ENV_VAR
    from token_finalizer.web.access_log import ACCESS_LOGGER
    from token_finalizer.web.protocol import server_options

    try:
        # h11 with a request-head deadline, and a connection cap (web/protocol.py).
        protocol = server_options()
    except ValueError as exc:
        say(logging.ERROR, f"token-finalizer serve: {exc}")
        return 2

    from token_finalizer.service.metrics import multiprocess_directory, prepare_operator_directory

    try:
        prepare_operator_directory()
    except OSError as exc:
        say(logging.ERROR, f"token-finalizer serve: {exc}")
        return 2

    # A long-running server: large answers must give their memory back when freed.
    tune_allocator()
    common: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "log_config": logging_config(access_logger=ACCESS_LOGGER),
        # Our middleware logs one structured line per request instead.
        "access_log": False,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S,
        **protocol,
    }
    if args.workers > 1:
        if config_path is not None:
            # Workers load the very file the parent just validated.
            os.environ[CONFIG_ENV_VAR] = str(Path(config_path).resolve())
        os.environ[DRAIN_ENV_VAR] = str(args.drain_seconds)
        if settings.retire.key is None:
            # Without a configured key each process would sign retire tickets with
            # its own, and a retire landing on another worker would be refused:
            # one key for this run, handed to every worker (a restart still
            # invalidates open tickets; configure retire.key to keep them).
            os.environ[RETIRE_KEY_OVERRIDE] = secrets.token_hex(32)
            _warn_shared_key(common["log_config"], args.workers)
        # Set before the workers start (and import prometheus-client): every
        # worker's metrics go to files there, and /metrics sums them all.
        with multiprocess_directory():
            uvicorn.run(_APP_FACTORY, factory=True, workers=args.workers, **common)
    else:
        from token_finalizer.api import create_app

        uvicorn.run(create_app(settings, drain_seconds=args.drain_seconds), **common)
    return 0
