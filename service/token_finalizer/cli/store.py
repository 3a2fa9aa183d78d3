"""`token-finalizer store serve|sweep|inspect|delete`: a capture store's admin.

`store serve` runs protocol v1 (docs/store-protocol.md) over a file store (`--dir`)
or a redis store (`--redis URL`) so that model servers on other machines can
write into it and a remote finalizer can freeze and retire from it. `store
sweep` removes retired tombstones (and, only when asked, captures that were
never frozen and went quiet, or frozen with nothing in them) and files left by
killed writers; a frozen capture that was not retired is evidence and is never
removed. `store inspect` prints one capture's state as JSON, and `store
delete` removes one capture for good, after asking (or with --yes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from token_finalizer._constants import DEFAULT_HOST, DEFAULT_STORE_PORT

__all__ = [
    "DELETE_HELP",
    "INSPECT_HELP",
    "SERVE_HELP",
    "STORE_TOKEN_ENV_VAR",
    "SWEEP_HELP",
    "add_delete_arguments",
    "add_inspect_arguments",
    "add_serve_arguments",
    "add_sweep_arguments",
    "format_age",
    "parse_duration",
    "store_delete",
    "store_inspect",
    "store_serve",
    "store_sweep",
]

SERVE_HELP = "serve a capture directory or a redis store over HTTP (capture store protocol v1)"
SWEEP_HELP = "remove retired tombstones (and, if asked, abandoned captures) from a directory"
INSPECT_HELP = "print one capture's state as JSON (a directory or a redis store)"
DELETE_HELP = "delete one capture for good, tombstone included (asks first unless --yes)"

STORE_TOKEN_ENV_VAR = "TOKEN_FINALIZER_STORE_TOKEN"

_T = TypeVar("_T")

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


def _add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """`--dir DIR` or `--redis URL [--key-prefix P]`: which store a command works on."""
    backend = parser.add_mutually_exclusive_group(required=True)
    backend.add_argument("--dir", type=Path, help="the capture directory")
    backend.add_argument(
        "--redis",
        metavar="URL",
        help="a redis store instead: redis://[:password@]host:port/db or rediss://...",
    )
    parser.add_argument(
        "--key-prefix",
        metavar="PREFIX",
        help="with --redis: prefix of every key (letters, digits, '.', '_', ':', '/', '-')",
    )


# -- store serve --------------------------------------------------------------


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer store serve`."""
    _add_backend_arguments(parser)
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
    from token_finalizer.web.protocol import server_options

    store = RedisTokenStore(**options)
    try:
        try:
            await store.ping()
        except SourceUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        app = create_store_app(store, token=args.token)
        # h11 with a request-head deadline, and a connection cap (web/protocol.py).
        config = uvicorn.Config(
            app, host=args.host, port=args.port, **_server_logging(), **server_options()
        )
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
    from token_finalizer.web.protocol import server_options

    app = create_store_app(FileTokenStore(args.dir), token=args.token)
    uvicorn.run(app, host=args.host, port=args.port, **_server_logging(), **server_options())
    return 0


# -- store sweep --------------------------------------------------------------


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer store sweep`."""
    _add_backend_arguments(parser)
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
        "--empty-older-than",
        type=parse_duration,
        metavar="DURATION",
        help="also remove frozen captures with nothing in them (no entry, no failed or "
        "announced call: what finalizing a never-captured id leaves) unchanged for this long "
        "(default: never)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list what would be removed, remove nothing"
    )


_LEFTOVER = {
    "temp": "temp file of a killed state write",
    "orphan": "data file of a retired capture",
    "lock": "lock file of nothing",
}


def store_sweep(args: argparse.Namespace) -> int:
    """Sweep the directory; print one line per removal and a summary; skipped files to stderr.

    Exit 0, or 1 when something was skipped (a stray file name, a capture whose
    files cannot be trusted): the rest is swept all the same.
    """
    from token_finalizer.sources import FileTokenStore

    if args.redis is not None:
        return _sweep_redis(args)
    if not args.dir.is_dir():
        # FileTokenStore would create it: a typo must not look like an empty store.
        print(f"error: {args.dir} is not a directory", file=sys.stderr)
        return 2
    report = FileTokenStore(args.dir).sweep_report(
        retired_older_than=args.retired_older_than,
        abandoned_older_than=args.abandoned_older_than,
        empty_older_than=args.empty_older_than,
        dry_run=args.dry_run,
    )
    verb = "would remove" if args.dry_run else "removed"
    for capture in report.captures:
        print(
            f"{verb} {capture.rollout_id} ({capture.reason}, {format_age(capture.age_seconds)} old)"
        )
    for leftover in report.files:
        what = _LEFTOVER.get(leftover.reason, leftover.reason)
        print(f"{verb} {leftover.name} ({what}, {format_age(leftover.age_seconds)} old)")
    for skipped in report.skipped:
        print(f"skipped {skipped.name!r}: {skipped.reason}", file=sys.stderr)
    reasons = ("retired", "abandoned", "empty")
    counts = {reason: sum(c.reason == reason for c in report.captures) for reason in reasons}
    summary = (
        f"{verb} {len(report.captures)} capture(s): {counts['retired']} retired, "
        f"{counts['abandoned']} abandoned"
    )
    if args.empty_older_than is not None:
        summary += f", {counts['empty']} empty"
    if report.files:
        summary += f"; {len(report.files)} leftover file(s)"
    if report.skipped:
        summary += f"; skipped {len(report.skipped)} (listed on stderr)"
    print(summary + (" (dry run)" if args.dry_run else ""))
    return 1 if report.skipped else 0


def _sweep_redis(args: argparse.Namespace) -> int:
    """`store sweep --redis`: the same rules, one atomic script per capture."""

    async def sweep(store: Any) -> list[Any]:
        swept: list[Any] = await store.sweep(
            retired_older_than=args.retired_older_than,
            abandoned_older_than=args.abandoned_older_than,
            empty_older_than=args.empty_older_than,
            dry_run=args.dry_run,
        )
        return swept

    try:
        captures = asyncio.run(_with_redis(args, sweep))
    except _Usage:
        return 2
    verb = "would remove" if args.dry_run else "removed"
    for capture in captures:
        age = format_age(capture.age_seconds)
        print(f"{verb} {capture.rollout_id} ({capture.reason}, {age} old)")
    counts = {r: sum(c.reason == r for c in captures) for r in ("retired", "abandoned", "empty")}
    print(
        f"{verb} {len(captures)} capture(s): {counts['retired']} retired, "
        f"{counts['abandoned']} abandoned, {counts['empty']} empty"
        + (" (dry run)" if args.dry_run else "")
    )
    return 0


# -- store inspect and store delete -------------------------------------------


def _add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rollout_id", metavar="ROLLOUT_ID", help="the capture's rollout id")
    _add_backend_arguments(parser)


def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer store inspect`."""
    _add_admin_arguments(parser)


def add_delete_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer store delete`."""
    _add_admin_arguments(parser)
    parser.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="delete without asking (required when stdin is not a terminal)",
    )


def _admin_problem(args: argparse.Namespace) -> str | None:
    """What makes the arguments of inspect or delete unusable, or None."""
    from token_finalizer.core.errors import InvalidRolloutId
    from token_finalizer.core.identity import check_store_id

    try:
        check_store_id(args.rollout_id)
    except InvalidRolloutId as exc:
        return str(exc)
    if args.redis is None:
        if args.key_prefix is not None:
            return "--key-prefix only goes with --redis"
        if not args.dir.is_dir():
            # FileTokenStore would create it: a typo must not look like an empty store.
            return f"{args.dir} is not a directory"
    return None


def _where(args: argparse.Namespace) -> str:
    if args.redis is None:
        return str(args.dir)
    from token_finalizer.sources.redis import redacted_url

    return redacted_url(args.redis) + (
        f" (key prefix {args.key_prefix!r})" if args.key_prefix else ""
    )


def _redis_report(status: dict[str, Any], rollout_id: str, keys: list[str]) -> dict[str, Any]:
    """The file store's inspect report, from what RedisTokenStore.status() tells."""
    retired, frozen = bool(status["retired"]), bool(status["frozen"])
    report: dict[str, Any] = {
        "rollout_id": rollout_id,
        "store": "redis",
        "state": "retired" if retired else "frozen" if frozen else "open",
        "frozen": frozen,
        "retired": retired,
        "snapshot_id": status.get("snapshot_id"),
        "version": status.get("version", 0),
        "entries": len(status.get("entry_digests") or {}),
        "incomplete": bool(status["incomplete"]),
        "incomplete_reasons": ["the capture was marked incomplete"] if status["incomplete"] else [],
        # Not exposed by RedisTokenStore.status(): the failed and announced call ids.
        "incomplete_call_ids": None,
        "missing_call_ids": None,
        "keys": keys,
    }
    for key in ("created_at", "updated_at", "frozen_at", "retired_at"):
        if key in status:
            report[key] = status[key]
    return report


class _Usage(Exception):
    """Arguments already reported on stderr: exit 2."""


async def _with_redis(args: argparse.Namespace, use: Callable[[Any], Awaitable[_T]]) -> _T:
    """`use` a RedisTokenStore opened from the arguments, closed afterwards."""
    from token_finalizer.sources.redis import RedisTokenStore

    options = _redis_options(args)
    if options is None:
        raise _Usage
    store = RedisTokenStore(**options)
    try:
        return await use(store)
    finally:
        await store.close()


def _inspect(args: argparse.Namespace) -> dict[str, Any] | None:
    """The capture's report, or None when nothing is stored; CaptureError when unreadable."""
    if args.redis is None:
        from token_finalizer.sources import FileTokenStore

        return FileTokenStore(args.dir).inspect(args.rollout_id)

    async def look(store: Any) -> dict[str, Any] | None:
        status = await store.status(args.rollout_id)
        if status is None:
            return None
        return _redis_report(status, args.rollout_id, store.keys(args.rollout_id))

    return asyncio.run(_with_redis(args, look))


def _delete(args: argparse.Namespace) -> list[str]:
    """Delete the capture; the file names (redis: the key names) removed."""
    if args.redis is None:
        from token_finalizer.sources import FileTokenStore

        return FileTokenStore(args.dir).delete(args.rollout_id)

    async def delete(store: Any) -> list[str]:
        await store.delete(args.rollout_id)
        return list(store.keys(args.rollout_id))

    return asyncio.run(_with_redis(args, delete))


def store_inspect(args: argparse.Namespace) -> int:
    """Print the capture's state as JSON; exit 1 when nothing is stored or it cannot be read."""
    from token_finalizer.core.errors import CaptureError, describe_exception

    problem = _admin_problem(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        report = _inspect(args)
    except _Usage:
        return 2
    except CaptureError as exc:
        print(f"error: rollout {args.rollout_id}: {describe_exception(exc)}", file=sys.stderr)
        return 1
    if report is None:
        print(json.dumps({"rollout_id": args.rollout_id, "found": False}))
        print(f"nothing stored for rollout {args.rollout_id} in {_where(args)}", file=sys.stderr)
        return 1
    print(json.dumps({"found": True, **report}, indent=2))
    return 0


def _confirmed(question: str) -> bool:
    """Ask on the terminal (the prompt on stderr, so stdout stays clean); yes only for y/yes."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in {"y", "yes"}


def _summary(report: dict[str, Any]) -> str:
    entries = report["entries"]
    text = f"{report['state']}, {entries} entr{'y' if entries == 1 else 'ies'}"
    if report["incomplete"]:
        text += ", incomplete"
    return f"{text}, version {report['version']}"


def store_delete(args: argparse.Namespace) -> int:
    """Delete one capture after confirmation (or --yes); say on stderr what was deleted.

    Exit 0 when deleted; 1 when nothing is stored, the store failed or the
    answer was not yes; 2 for unusable arguments, and for no --yes without a
    terminal to ask on.
    """
    from token_finalizer.core.errors import CaptureCorrupt, CaptureError, describe_exception

    problem = _admin_problem(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not args.yes and not sys.stdin.isatty():
        print(
            "error: store delete asks for confirmation and stdin is not a terminal; "
            "pass --yes to delete without asking",
            file=sys.stderr,
        )
        return 2
    where, rollout_id = _where(args), args.rollout_id
    evidence = False
    try:
        report = _inspect(args)
    except _Usage:
        return 2
    except CaptureCorrupt as exc:
        # Exactly what delete is for: a capture whose files cannot be trusted.
        summary = f"unreadable: {exc}"
    except CaptureError as exc:
        print(f"error: rollout {rollout_id}: {describe_exception(exc)}", file=sys.stderr)
        return 1
    else:
        if report is None:
            print(f"nothing stored for rollout {rollout_id} in {where}", file=sys.stderr)
            return 1
        summary = _summary(report)
        evidence = report["frozen"] and not report["retired"]
    if not args.yes:
        if evidence:
            print(
                "warning: this capture is frozen and was not retired: it may be the only "
                "evidence of a failed or masked build",
                file=sys.stderr,
            )
        try:
            confirmed = _confirmed(f"delete rollout {rollout_id} ({summary}) from {where}?")
        except (EOFError, KeyboardInterrupt):
            confirmed = False
        if not confirmed:
            print("not deleted", file=sys.stderr)
            return 1
    try:
        removed = _delete(args)
    except (_Usage, CaptureError) as exc:
        print(f"error: rollout {rollout_id}: {describe_exception(exc)}", file=sys.stderr)
        return 1
    print(
        f"deleted rollout {rollout_id} ({summary}) from {where}: {', '.join(removed) or 'nothing'}",
        file=sys.stderr,
    )
    return 0


def _server_logging() -> dict[str, Any]:
    """JSON log lines: our request lines (no probe lines) instead of uvicorn's access log."""
    from token_finalizer._logging import logging_config
    from token_finalizer.web.access_log import ACCESS_LOGGER

    return {"log_config": logging_config(access_logger=ACCESS_LOGGER), "access_log": False}
