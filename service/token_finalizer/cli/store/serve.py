"""`token-finalizer store serve`: protocol v1 (docs/store-protocol.md) over a directory or Redis.

Model servers on other machines write into it (HttpTokenSink,
HttpLineageResolver) and a remote finalizer freezes and retires from it (the
`http` source). The store is opened and checked reachable before the port
opens, and closed when the server stops. Each role has its own tokens
(docs/store-protocol.md#roles); a single `--token` still works for every role.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any

from token_finalizer._constants import (
    DEFAULT_HOST,
    DEFAULT_MEMORY_HIGH_WATER,
    DEFAULT_STORE_PORT,
)
from token_finalizer._logging import say
from token_finalizer.cli.args import positive_int
from token_finalizer.cli.store.backend import (
    Backend,
    add_backend_arguments,
    backend_of,
    exits_on_usage_error,
    opened,
)
from token_finalizer.cli.store.durations import parse_ttl
from token_finalizer.store_server.roles import StoreRole, StoreTokens

__all__ = [
    "ROLE_TOKENS_ENV_VARS",
    "SERVE_HELP",
    "STORE_TOKEN_ENV_VAR",
    "add_serve_arguments",
    "store_serve",
]

SERVE_HELP = "serve a capture directory or a redis store over HTTP (capture store protocol v1)"
STORE_TOKEN_ENV_VAR = "TOKEN_FINALIZER_STORE_TOKEN"
# Comma-separated tokens of one role, read when its option is not given.
ROLE_TOKENS_ENV_VARS = {role: f"TOKEN_FINALIZER_STORE_{role.upper()}_TOKENS" for role in StoreRole}
_ROLE_DOES = {
    StoreRole.WRITER: "begin, put, incomplete, lineage resolve",
    StoreRole.FINALIZER: "freeze, drop",
    StoreRole.CONTROL: "read-only control routes",
}

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
        "--memory-high-water",
        type=_high_water,
        default=argparse.SUPPRESS,
        metavar="FRACTION",
        help="with --redis: above this share of Redis's maxmemory, writes that add capture "
        f"data are refused at once with 507 (default {DEFAULT_MEMORY_HIGH_WATER:g}; 'off': "
        "never; no effect without maxmemory); freeze and retire go on (docs/capacity.md)",
    )
    parser.add_argument(
        "--allow-eviction",
        action="store_true",
        default=argparse.SUPPRESS,
        help="with --redis: start even when Redis's maxmemory-policy may evict keys (any but "
        "noeviction): evicted captures mask their rollouts, an evicted tombstone lets a late "
        "writer refill a retired rollout; /health still turns 503 on evictions",
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
        help=f"one bearer token valid for every role (default: ${STORE_TOKEN_ENV_VAR}, which "
        "keeps it out of the process list); prefer a token per role; /health stays open",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="worker processes (default 1); each opens its own connection to the store, "
        "/metrics sums every worker's",
    )
    for role in StoreRole:
        parser.add_argument(
            f"--{role}-token",
            dest=f"{role}_tokens",
            action="append",
            default=None,
            metavar="TOKEN",
            help=f"a {role} token ({_ROLE_DOES[role]}); may repeat (default: the comma list "
            f"in ${ROLE_TOKENS_ENV_VARS[role]})",
        )


def _high_water(text: str) -> float | None:
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction (or 'off')") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the mark must be in (0, 1]")
    return value


def _role_tokens(args: argparse.Namespace, role: StoreRole) -> tuple[str, ...]:
    given: list[str] | None = getattr(args, f"{role}_tokens", None)
    if given is not None:
        return tuple(given)
    variable = ROLE_TOKENS_ENV_VARS[role]
    listed = os.environ.get(variable, "")
    tokens = tuple(token.strip() for token in listed.split(",") if token.strip())
    if listed and not tokens:
        # `,` or spaces alone would otherwise serve with no auth at all, without a
        # word; an empty value (`VAR=`) counts as unset.
        raise ValueError(f"${variable} is set but holds no token; unset it instead")
    return tokens


def _store_tokens(args: argparse.Namespace) -> StoreTokens:
    """The tokens of the options (else their variables); ValueError for an empty one.

    A token of spaces only is empty too: HTTP strips a header's whitespace, so
    no request could ever bear it.
    """
    if args.token is not None and not args.token.strip():
        raise ValueError("--token is empty; leave it out for no auth")
    roles = {role: _role_tokens(args, role) for role in StoreRole}
    for role, tokens in roles.items():
        if any(not token.strip() for token in tokens):
            raise ValueError(f"--{role}-token is empty; leave it out instead")
    return StoreTokens(
        writer=roles[StoreRole.WRITER],
        finalizer=roles[StoreRole.FINALIZER],
        control=roles[StoreRole.CONTROL],
        shared=() if args.token is None else (args.token,),
    )


def _token_warnings(tokens: StoreTokens) -> list[str]:
    """What an operator must know about these tokens before the port opens."""
    warnings = []
    if tokens.shared:
        warnings.append(
            "--token is valid for every role: whoever holds it (every model server) can also "
            "freeze any live rollout and drop a capture; give each role its own token "
            "(--writer-token, --finalizer-token, --control-token)"
        )
    elif tokens.enabled:
        for role in tokens.roles_without_token():
            warnings.append(f"no {role} token is configured: {role} routes are refused to all")
    for roles in tokens.tokens_in_several_roles():
        warnings.append(f"one token is given for several roles ({roles}): it holds all of them")
    return warnings


def _server_logging() -> dict[str, Any]:
    """JSON log lines: our request lines (no probe lines) instead of uvicorn's access log."""
    from token_finalizer._logging import logging_config
    from token_finalizer.web.access_log import ACCESS_LOGGER

    return {"log_config": logging_config(access_logger=ACCESS_LOGGER), "access_log": False}


async def _refuses_eviction(store: Any) -> str | None:
    """Why a redis store may not be served (its policy may evict keys); None when it may."""
    from token_finalizer.core.errors import CaptureError
    from token_finalizer.sources.redis import RedisTokenStore

    if not isinstance(store, RedisTokenStore):
        return None
    try:
        await store.refuse_eviction()
    except CaptureError as exc:  # EvictionPolicyRefused, or INFO refused or out of reach
        return str(exc)
    return None


async def _refusal(store: Any, backend: Backend) -> str | None:
    """Why this store may not be served (its error line), None when it may.

    Checked before the port opens, by `store serve` and by the parent of
    `--workers N`: the store answers; a cluster node is served in cluster
    mode; a redis store's eviction policy evicts nothing (or --allow-eviction).
    """
    from token_finalizer.core.errors import CaptureError

    try:
        await store.ping()
    except CaptureError as exc:
        return f"error: the store {backend.where} cannot be reached: {exc}"
    check_cluster_mode = getattr(store, "check_cluster_mode", None)
    if check_cluster_mode is not None:
        try:
            await check_cluster_mode()
        except CaptureError as exc:
            return f"error: {exc}"
    refusal = await _refuses_eviction(store)
    return None if refusal is None else f"error: {refusal}"


def _serving_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's options of every `store serve`: address, JSON logs, h11 with its deadlines."""
    from token_finalizer.web.protocol import server_options

    # h11 with a request-head deadline, and a connection cap (web/protocol.py).
    return {"host": args.host, "port": args.port, **_server_logging(), **server_options()}


async def _servable(backend: Backend) -> bool:
    """Whether the backend's store may be served (its refusal said as a JSON line when not)."""
    async with opened(backend) as store:
        refusal = await _refusal(store, backend)
    if refusal is not None:
        say(logging.ERROR, refusal)
        return False
    return True


async def _serve(args: argparse.Namespace, backend: Backend) -> int:
    """Serve the backend's store until interrupted: checked reachable first, closed at the end."""
    import uvicorn

    from token_finalizer.store_server import create_store_app

    async with opened(backend) as store:
        refusal = await _refusal(store, backend)
        if refusal is not None:
            say(logging.ERROR, refusal)
            return 2
        app = create_store_app(store, tokens=_store_tokens(args))
        config = uvicorn.Config(app, **_serving_options(args))
        await uvicorn.Server(config).serve()
    return 0


def _serve_workers(args: argparse.Namespace, backend: Backend, tokens: StoreTokens) -> int:
    """`--workers N`: the store checked here (as `_serve` does), then N processes serving it."""
    import uvicorn

    from token_finalizer._prometheus import multiprocess_directory
    from token_finalizer.cli.store.workers import WORKER_SPEC_ENV_VAR, worker_spec

    if not asyncio.run(_servable(backend)):
        return 2
    os.environ[WORKER_SPEC_ENV_VAR] = worker_spec(backend, tokens)
    # Set before the workers start (and import prometheus-client): every
    # worker's metrics go to files there, and /metrics sums them all.
    with multiprocess_directory():
        uvicorn.run(
            "token_finalizer.cli.store.workers:worker_app",
            factory=True,
            workers=args.workers,
            **_serving_options(args),
        )
    return 0


@exits_on_usage_error
def store_serve(args: argparse.Namespace) -> int:
    """Serve the directory or the redis store until interrupted."""
    try:
        tokens = _store_tokens(args)
    except ValueError as exc:
        say(logging.ERROR, f"error: {exc}")
        return 2
    backend = backend_of(args, existing_dir=False)
    for warning in _token_warnings(tokens):
        say(logging.WARNING, f"warning: {warning}")
    if args.host not in _LOOPBACK and not tokens.enabled:
        say(
            logging.WARNING,
            f"warning: serving {backend.where} on {args.host} without a token: anyone who can "
            "reach this port can write and retire captures",
        )
    from token_finalizer._prometheus import prepare_operator_directory
    from token_finalizer.web.protocol import event_loop_factory

    try:
        prepare_operator_directory()
    except OSError as exc:
        say(logging.ERROR, f"error: {exc}")
        return 2
    if args.workers > 1:
        try:
            return _serve_workers(args, backend, tokens)
        except KeyboardInterrupt:
            return 0
    try:
        # On uvloop when installed, as `serve` is (web/protocol.py).
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(_serve(args, backend))
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it stopped on
        return 0
