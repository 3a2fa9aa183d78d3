"""`token-finalizer store inspect` and `store delete`: one capture, on any store.

`inspect` prints the capture's state as JSON; `delete` removes it for good,
tombstone included, after asking (or with --yes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from token_finalizer._logging import say
from token_finalizer.cli.store.backend import (
    Backend,
    UsageError,
    add_backend_arguments,
    backend_of,
    exits_on_usage_error,
    opened,
)
from token_finalizer.sources.base import CaptureReport

__all__ = [
    "DELETE_HELP",
    "INSPECT_HELP",
    "add_delete_arguments",
    "add_inspect_arguments",
    "store_delete",
    "store_inspect",
]

INSPECT_HELP = "print one capture's state as JSON (a directory or a redis store)"
DELETE_HELP = "delete one capture for good, tombstone included (asks first unless --yes)"


def _add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rollout_id", metavar="ROLLOUT_ID", help="the capture's rollout id")
    add_backend_arguments(parser)


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


def _backend(args: argparse.Namespace) -> Backend:
    """The store of an inspect or delete; UsageError for a bad id or unusable options."""
    from token_finalizer.core.errors import InvalidRolloutId
    from token_finalizer.core.identity import check_store_id

    try:
        check_store_id(args.rollout_id)
    except InvalidRolloutId as exc:
        raise UsageError(str(exc)) from None
    return backend_of(args)


async def _inspect(backend: Backend, rollout_id: str) -> CaptureReport | None:
    async with opened(backend) as store:
        return await store.admin.inspect(rollout_id)


async def _delete(backend: Backend, rollout_id: str) -> tuple[str, ...]:
    async with opened(backend) as store:
        return await store.admin.delete(rollout_id)


def _prefix_hint(args: argparse.Namespace) -> str:
    """On Redis: which key prefix was looked under, and that a store's own must be named."""
    if not getattr(args, "redis", None):
        return ""
    prefix = getattr(args, "key_prefix", None) or ""
    if not prefix:
        return (
            " (under no key prefix: a store started with --key-prefix keeps its keys under "
            "it; pass the same --key-prefix)"
        )
    return f" (under key prefix {prefix!r}: is it the store's own --key-prefix?)"


@exits_on_usage_error
def store_inspect(args: argparse.Namespace) -> int:
    """Print the capture's state as JSON; exit 1 when nothing is stored or it cannot be read."""
    from token_finalizer.core.errors import CaptureError, describe_exception

    backend = _backend(args)
    try:
        report = asyncio.run(_inspect(backend, args.rollout_id))
    except CaptureError as exc:
        say(logging.ERROR, f"error: rollout {args.rollout_id}: {describe_exception(exc)}")
        return 1
    if report is None:
        print(json.dumps({"rollout_id": args.rollout_id, "found": False}))
        say(
            logging.WARNING,
            f"nothing stored for rollout {args.rollout_id} in {backend.where}{_prefix_hint(args)}",
        )
        return 1
    print(json.dumps({"found": True, **report.to_dict()}, indent=2))
    return 0


def _confirmed(question: str) -> bool:
    """Ask on the terminal (the prompt on stderr, so stdout stays clean); yes only for y/yes."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in {"y", "yes"}


def _summary(report: CaptureReport) -> str:
    entries = report.entries
    text = f"{report.state}, {entries} entr{'y' if entries == 1 else 'ies'}"
    if report.incomplete_reasons:
        text += ", incomplete"
    return f"{text}, version {report.version}"


@exits_on_usage_error
def store_delete(args: argparse.Namespace) -> int:
    """Delete one capture after confirmation (or --yes); say on stderr what was deleted.

    Exit 0 when deleted; 1 when nothing is stored, the store failed or the
    answer was not yes; 2 for unusable arguments, and for no --yes without a
    terminal to ask on.
    """
    from token_finalizer.core.errors import CaptureCorrupt, CaptureError, describe_exception

    backend = _backend(args)
    if not args.yes and not sys.stdin.isatty():
        say(
            logging.ERROR,
            "error: store delete asks for confirmation and stdin is not a terminal; "
            "pass --yes to delete without asking",
        )
        return 2
    rollout_id = args.rollout_id
    evidence = False
    try:
        report = asyncio.run(_inspect(backend, rollout_id))
    except CaptureCorrupt as exc:
        # Exactly what delete is for: a capture whose files cannot be trusted.
        summary = f"unreadable: {exc}"
    except CaptureError as exc:
        say(logging.ERROR, f"error: rollout {rollout_id}: {describe_exception(exc)}")
        return 1
    else:
        if report is None:
            say(logging.WARNING, f"nothing stored for rollout {rollout_id} in {backend.where}")
            return 1
        summary = _summary(report)
        evidence = report.frozen and not report.retired
    if not args.yes:
        if evidence:
            say(
                logging.WARNING,
                "warning: this capture is frozen and was not retired: it may be the only "
                "evidence of a failed or masked build",
            )
        try:
            confirmed = _confirmed(f"delete rollout {rollout_id} ({summary}) from {backend.where}?")
        except (EOFError, KeyboardInterrupt):
            confirmed = False
        if not confirmed:
            say(logging.WARNING, "not deleted")
            return 1
    try:
        removed = asyncio.run(_delete(backend, rollout_id))
    except CaptureError as exc:
        say(logging.ERROR, f"error: rollout {rollout_id}: {describe_exception(exc)}")
        return 1
    say(
        logging.INFO,
        f"deleted rollout {rollout_id} ({summary}) from {backend.where}: "
        f"{', '.join(removed) or 'nothing'}",
    )
    return 0
