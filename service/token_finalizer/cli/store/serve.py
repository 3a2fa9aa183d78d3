"""`token-finalizer store serve`: protocol v1 (docs/store-protocol.md) over a directory or Redis.

Model servers on other machines write into it (HttpTokenSink,
HttpLineageResolver) and a remote finalizer freezes and retires from it (the
`http` source). The store is opened and checked reachable before the port
opens, and closed when the server stops.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from token_finalizer._constants import DEFAULT_HOST, DEFAULT_STORE_PORT
from token_finalizer.cli.store.backend import (
    Backend,
    UsageError,
    add_backend_arguments,
    backend_of,
    opened,
)
from token_finalizer.cli.store.durations import parse_ttl

__all__ = ["SERVE_HELP", "STORE_TOKEN_ENV_VAR", "add_serve_arguments", "store_serve"]

SERVE_HELP = "serve a capture directory or a redis store over HTTP (capture store protocol v1)"
STORE_TOKEN_ENV_VAR = "TOKEN_FINALIZER_STORE_TOKEN"

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer store serve`."""
    add_backend_arguments(parser)
    parser.add_argument(
        "--retired-ttl",
        type=parse_ttl,
        default=argparse.SUPPRESS,  # absent unless given ('never' gives None)
        metavar="DURATION",
        help="with --redis: how long a retired tombstone is kept (default 7d; 'never')",
    )
    parser.add_argument(
        "--abandoned-ttl",
        type=parse_ttl,
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="with --redis: remove a never-frozen capture nobody wrote to for this long "
        "(default: never)",
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"bind address (default {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_STORE_PORT,
        help=f"TCP port (default {DEFAULT_STORE_PORT})",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get(STORE_TOKEN_ENV_VAR) or None,
        help=f"bearer token every client must send (default: ${STORE_TOKEN_ENV_VAR}, which "
        "keeps it out of the process list); /health stays open",
    )


def _server_logging() -> dict[str, Any]:
    """JSON log lines: our request lines (no probe lines) instead of uvicorn's access log."""
    from token_finalizer._logging import logging_config
    from token_finalizer.web.access_log import ACCESS_LOGGER

    return {"log_config": logging_config(access_logger=ACCESS_LOGGER), "access_log": False}


async def _serve(args: argparse.Namespace, backend: Backend) -> int:
    """Serve the backend's store until interrupted: checked reachable first, closed at the end."""
    import uvicorn

    from token_finalizer.core.errors import CaptureError
    from token_finalizer.store_server import create_store_app
    from token_finalizer.web.protocol import server_options

    async with opened(backend) as store:
        try:
            await store.ping()
        except CaptureError as exc:
            print(f"error: the store {backend.where} cannot be reached: {exc}", file=sys.stderr)
            return 2
        app = create_store_app(store, token=args.token)
        # h11 with a request-head deadline, and a connection cap (web/protocol.py).
        config = uvicorn.Config(
            app, host=args.host, port=args.port, **_server_logging(), **server_options()
        )
        await uvicorn.Server(config).serve()
    return 0


def store_serve(args: argparse.Namespace) -> int:
    """Serve the directory or the redis store until interrupted."""
    if args.token == "":
        print("error: --token is empty; leave it out for no auth", file=sys.stderr)
        return 2
    try:
        backend = backend_of(args, existing_dir=False)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.host not in _LOOPBACK and args.token is None:
        print(
            f"warning: serving {backend.where} on {args.host} without a token: anyone who can "
            "reach this port can write and retire captures",
            file=sys.stderr,
        )
    try:
        return asyncio.run(_serve(args, backend))
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it stopped on
        return 0
