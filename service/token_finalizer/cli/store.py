"""`token-finalizer store serve` and `token-finalizer store sweep`: a capture directory's admin.

`store serve` runs protocol v1 (DESIGN §10) over a file store so that model
servers on other machines can write into it and a remote finalizer can
freeze and retire from it. `store sweep` removes retired tombstones (and,
only when asked, captures that were never frozen and went quiet); a frozen
capture that was not retired is evidence and is never removed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

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

SERVE_HELP = "serve a capture directory over HTTP (remote capture store protocol v1)"
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


def format_age(seconds: float) -> str:
    """A short human age: 45s, 12m, 5h, 3d."""
    for unit in ("d", "h", "m"):
        if seconds >= _UNIT_SECONDS[unit]:
            return f"{seconds / _UNIT_SECONDS[unit]:.0f}{unit}"
    return f"{seconds:.0f}s"


# -- store serve --------------------------------------------------------------


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer store serve`."""
    parser.add_argument("--dir", required=True, type=Path, help="the capture directory to serve")
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


def store_serve(args: argparse.Namespace) -> int:
    """Serve the directory until interrupted."""
    import uvicorn

    from token_finalizer.sources import FileTokenStore
    from token_finalizer.store_server import create_store_app

    if args.token == "":
        print("error: --token is empty; leave it out for no auth", file=sys.stderr)
        return 2
    if args.host not in _LOOPBACK and args.token is None:
        print(
            f"warning: serving {args.dir} on {args.host} without a token: anyone who can "
            "reach this port can write and retire captures",
            file=sys.stderr,
        )
    store = FileTokenStore(args.dir)
    app = create_store_app(store, token=args.token)
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
