"""Which store a `store` command works on: `--dir DIR` or `--redis URL [--key-prefix P]`.

A Redis Cluster is `--redis-cluster` with `--redis` naming any node, or
repeated for several seeds (docs/store-protocol.md#redis-cluster);
`--redis-timeout` bounds each operation, retries included, and
`--min-replicas-acked N` makes every state change wait for N replicas.

The backend is chosen once, from the options (`backend_of`), and opened as a
CaptureStore (`opened`); every command then has one code path over the store
interface, whatever the backend.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from token_finalizer._constants import DEFAULT_STORE_REDIS_TIMEOUT_S
from token_finalizer._logging import say
from token_finalizer.sources.base import CaptureStore

__all__ = [
    "Backend",
    "UsageError",
    "add_backend_arguments",
    "backend_of",
    "exits_on_usage_error",
    "opened",
]

# Options that only a redis store takes (attribute name, flag). The TTL options
# default to argparse.SUPPRESS (absent unless given), since `never` gives None.
_REDIS_ONLY = (
    ("key_prefix", "--key-prefix"),
    ("retired_ttl", "--retired-ttl"),
    ("abandoned_ttl", "--abandoned-ttl"),
    ("redis_cluster", "--redis-cluster"),
    ("redis_timeout", "--redis-timeout"),
    ("min_replicas_acked", "--min-replicas-acked"),
    ("memory_high_water", "--memory-high-water"),
    ("allow_eviction", "--allow-eviction"),
)
# Options whose "not given" is a default value rather than absence.
_UNSET = {
    "key_prefix": None,
    "redis_cluster": False,
    "redis_timeout": None,
    "min_replicas_acked": 0,
}


def _given(args: argparse.Namespace, name: str) -> bool:
    if name not in vars(args):
        return False
    return name not in _UNSET or getattr(args, name) != _UNSET[name]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be > 0")
    return value


def _replicas(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: replicas must be >= 0")
    return value


class UsageError(Exception):
    """Arguments that cannot work: the message goes to stderr and the command exits 2."""


def exits_on_usage_error(
    command: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """`command`, a UsageError it raises printed as `error: ...` and answered with exit code 2."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except UsageError as exc:
            say(logging.ERROR, f"error: {exc}")
            return 2

    return run


@dataclass(frozen=True, slots=True)
class Backend:
    """One store the command works on: its kind, `open_store` options, and where it is."""

    kind: str
    where: str
    options: dict[str, Any] = field(default_factory=dict)


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """`--dir DIR` or `--redis URL [--key-prefix P]`: which store a command works on."""
    backend = parser.add_mutually_exclusive_group(required=True)
    backend.add_argument("--dir", type=Path, help="the capture directory")
    backend.add_argument(
        "--redis",
        metavar="URL",
        action="append",
        help="a redis store instead: redis://[:password@]host:port/db or rediss://...; "
        "with --redis-cluster any node of the cluster, repeated for several seed nodes",
    )
    parser.add_argument(
        "--key-prefix",
        metavar="PREFIX",
        help="with --redis: prefix of every key, used as it is, so end it with a separator "
        "(`ng:` gives `ng:{ng:R}:state`; letters, digits, '.', '_', ':', '/', '-')",
    )
    parser.add_argument(
        "--redis-cluster",
        action="store_true",
        help="with --redis: the URL(s) are seed nodes of a Redis Cluster",
    )
    parser.add_argument(
        "--redis-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="with --redis: each store operation's deadline, retries included (slot moves, "
        f"a failover) (default {DEFAULT_STORE_REDIS_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--min-replicas-acked",
        type=_replicas,
        default=0,
        metavar="N",
        help="with --redis: acknowledge a state change only once N replicas have it "
        "(WAIT); fewer in time is an error, never an acknowledgement (default 0)",
    )


def backend_of(args: argparse.Namespace, *, existing_dir: bool = True) -> Backend:
    """The backend the options name; UsageError when they cannot work.

    With `existing_dir`, a `--dir` that is not a directory is refused (the
    file store would create it, and a typo must not look like an empty store).
    """
    if args.redis is None:
        given = [flag for name, flag in _REDIS_ONLY if _given(args, name)]
        if given:
            verb = "goes" if len(given) == 1 else "go"
            raise UsageError(f"{', '.join(given)} only {verb} with --redis")
        if existing_dir and not args.dir.is_dir():
            raise UsageError(f"{args.dir} is not a directory")
        return Backend("file", str(args.dir), {"dir": args.dir})
    from token_finalizer._constants import DEFAULT_RETIRED_TTL_S
    from token_finalizer.core.redaction import redacted_url
    from token_finalizer.core.store_urls import check_key_prefix, check_redis_seeds

    try:
        seeds = check_redis_seeds(args.redis, cluster=args.redis_cluster)
        check_key_prefix(args.key_prefix or "")
    except ValueError as exc:
        raise UsageError(f"--redis: {exc}") from None
    where = redacted_url(seeds[0])
    if args.redis_cluster:
        where = f"redis cluster {where}" + (f" (+{len(seeds) - 1} seeds)" if len(seeds) > 1 else "")
    if args.key_prefix:
        where += f" (key prefix {args.key_prefix!r})"
    options: dict[str, Any] = {
        "urls": list(seeds),
        "cluster": args.redis_cluster,
        "timeout_s": args.redis_timeout or DEFAULT_STORE_REDIS_TIMEOUT_S,
        "min_replicas_acked": args.min_replicas_acked,
        "key_prefix": args.key_prefix,
        "retired_ttl_s": getattr(args, "retired_ttl", DEFAULT_RETIRED_TTL_S),
        "abandoned_ttl_s": getattr(args, "abandoned_ttl", None),
    }
    # `store serve` only (docs/capacity.md): absent from the other commands' options.
    if "memory_high_water" in vars(args):
        options["memory_high_water"] = args.memory_high_water
    if "allow_eviction" in vars(args):
        options["allow_eviction"] = args.allow_eviction
    return Backend("redis", where, options)


@contextlib.asynccontextmanager
async def opened(backend: Backend) -> AsyncIterator[CaptureStore]:
    """The backend's store, closed when the block ends (whatever ends it)."""
    from token_finalizer.sources import open_store

    store = open_store(backend.kind, **backend.options)
    try:
        yield store
    finally:
        # Shielded: the interrupt that stopped a server cancels this task next.
        await asyncio.shield(store.close())
