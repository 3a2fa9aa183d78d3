"""`token-finalizer store serve` and `token-finalizer store sweep`: a capture directory's admin.

`store serve` runs protocol v1 (docs/store-protocol.md) over a file store (`--dir`)
or a redis store (`--redis URL`) so that model servers on other machines can
write into it and a remote finalizer can freeze and retire from it. `store
sweep` removes retired tombstones (and, only when asked, captures that were
never frozen and went quiet); a frozen capture that was not retired is
evidence and is never removed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

from token_finalizer._constants import DEFAULT_HOST, DEFAULT_STORE_PORT

__all__ = [
    "SERVE_HELP",
    "STORE_TOKEN_ENV_VAR",
    "SWEEP_HELP",
    "add_serve_arguments",
    "add_sweep_arguments",
    "format_age",
    "parse_duration",
    "store_serve",
    "store_sweep",
]

SERVE_HELP = "serve a capture directory or a redis store over HTTP (capture store protocol v1)"
SWEEP_HELP = "remove retired tombstones (and, if asked, abandoned captures) from a directory"

STORE_TOKEN_ENV_VAR = "TOKEN_FINALIZER_STORE_TOKEN"

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])", re.ASCII)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def parse_duration(text: str) -> float:
    """Seconds in `30s`, `15m`, `12h` or `7d`; ArgumentTypeError for anything else."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration; use a number and a unit: 30s, 15m, 12h or 7d"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def parse_ttl(text: str) -> float | None:
    """`parse_duration`, or None for `never`; a zero duration is refused."""
    if text.strip() == "never":
        return None
    seconds = parse_duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a TTL must be longer than 0s (or 'never')")
    return seconds


def format_age(seconds: float) -> str:
    """A short human age: 45s, 12m, 5h, 3d."""
    for unit in ("d", "h", "m"):
        if seconds >= _UNIT_SECONDS[unit]:
            return f"{seconds / _UNIT_SECONDS[unit]:.0f}{unit}"
    return f"{seconds:.0f}s"


# -- store serve --------------------------------------------------------------


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer store serve`."""
    backend = parser.add_mutually_exclusive_group(required=True)
    backend.add_argument("--dir", type=Path, help="the capture directory to serve")
    backend.add_argument(
        "--redis",
        metavar="URL",
        help="serve a redis store instead: redis://[:password@]host:port/db or rediss://...",
    )
    parser.add_argument(
        "--key-prefix",
        metavar="PREFIX",
        help="with --redis: prefix of every key (letters, digits, '.', '_', ':', '/', '-')",
    )
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


def _redis_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """RedisTokenStore options from the command line; None (after a message) when invalid."""
    from token_finalizer.sources.redis import (
        DEFAULT_RETIRED_TTL_S,
        check_key_prefix,
        check_redis_url,
    )

    try:
        check_redis_url(args.redis)
        check_key_prefix(args.key_prefix or "")
    except ValueError as exc:
        print(f"error: --redis: {exc}", file=sys.stderr)
        return None
    return {
        "url": args.redis,
        "key_prefix": args.key_prefix,
        "retired_ttl_s": getattr(args, "retired_ttl", DEFAULT_RETIRED_TTL_S),
        "abandoned_ttl_s": getattr(args, "abandoned_ttl", None),
    }


def _redis_only_flags(args: argparse.Namespace) -> list[str]:
    given = (
        ("--key-prefix", args.key_prefix is not None),
        ("--retired-ttl", hasattr(args, "retired_ttl")),
        ("--abandoned-ttl", hasattr(args, "abandoned_ttl")),
    )
    return [flag for flag, present in given if present]


async def _serve_redis(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Serve a redis store until interrupted: checked reachable first, closed at the end."""
    import uvicorn

    from token_finalizer.core.errors import SourceUnavailable
    from token_finalizer.sources.redis import RedisTokenStore
    from token_finalizer.store_server import create_store_app

    store = RedisTokenStore(**options)
    try:
        try:
            await store.ping()
        except SourceUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        app = create_store_app(store, token=args.token)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info")
        await uvicorn.Server(config).serve()
    finally:
        # Shielded: the interrupt that stopped the server cancels this task next.
        await asyncio.shield(store.close())
    return 0


def store_serve(args: argparse.Namespace) -> int:
    """Serve the directory or the redis store until interrupted."""
    if args.token == "":
        print("error: --token is empty; leave it out for no auth", file=sys.stderr)
        return 2
    options = None
    if args.redis is None:
        misplaced = _redis_only_flags(args)
        if misplaced:
            print(f"error: {', '.join(misplaced)} only go with --redis", file=sys.stderr)
            return 2
        served = str(args.dir)
    else:
        from token_finalizer.sources.redis import redacted_url

        options = _redis_options(args)
        if options is None:
            return 2
        served = redacted_url(args.redis)
    if args.host not in _LOOPBACK and args.token is None:
        print(
            f"warning: serving {served} on {args.host} without a token: anyone who can "
            "reach this port can write and retire captures",
            file=sys.stderr,
        )
    if options is not None:
        try:
            return asyncio.run(_serve_redis(args, options))
        except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it stopped on
            return 0

    import uvicorn

    from token_finalizer.sources import FileTokenStore
    from token_finalizer.store_server import create_store_app

    app = create_store_app(FileTokenStore(args.dir), token=args.token)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


# -- store sweep --------------------------------------------------------------


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer store sweep`."""
    parser.add_argument("--dir", required=True, type=Path, help="the capture directory")
    parser.add_argument(
        "--retired-older-than",
        required=True,
        type=parse_duration,
        metavar="DURATION",
        help="remove retired tombstones unchanged for this long (30s, 15m, 12h, 7d)",
    )
    parser.add_argument(
        "--abandoned-older-than",
        type=parse_duration,
        metavar="DURATION",
        help="also remove captures never frozen and unchanged for this long "
        "(default: never; a frozen capture that was not retired is always kept)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list what would be removed, remove nothing"
    )


def store_sweep(args: argparse.Namespace) -> int:
    """Sweep the directory; print one line per capture and a summary."""
    from token_finalizer.sources import FileTokenStore

    if not args.dir.is_dir():
        # FileTokenStore would create it: a typo must not look like an empty store.
        print(f"error: {args.dir} is not a directory", file=sys.stderr)
        return 2
    swept = FileTokenStore(args.dir).sweep(
        retired_older_than=args.retired_older_than,
        abandoned_older_than=args.abandoned_older_than,
        dry_run=args.dry_run,
    )
    verb = "would remove" if args.dry_run else "removed"
    for capture in swept:
        print(
            f"{verb} {capture.rollout_id} ({capture.reason}, {format_age(capture.age_seconds)} old)"
        )
    counts = {reason: sum(c.reason == reason for c in swept) for reason in ("retired", "abandoned")}
    print(
        f"{verb} {len(swept)} capture(s): {counts['retired']} retired, "
        f"{counts['abandoned']} abandoned" + (" (dry run)" if args.dry_run else "")
    )
    return 0
