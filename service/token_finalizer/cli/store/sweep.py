"""`token-finalizer store sweep`: remove retired tombstones and, only when asked, captures
never frozen that went quiet or frozen with nothing in them, from any store.

A frozen capture that was not retired is evidence and is never removed.
See docs/store-protocol.md#sweep.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from token_finalizer._logging import say
from token_finalizer.cli.store.backend import (
    Backend,
    add_backend_arguments,
    backend_of,
    exits_on_usage_error,
    opened,
)
from token_finalizer.cli.store.durations import format_age, parse_duration
from token_finalizer.sources.base import SweepReport, SweepRules

__all__ = ["SWEEP_HELP", "add_sweep_arguments", "print_sweep", "store_sweep"]

SWEEP_HELP = "remove retired tombstones (and, if asked, abandoned captures) from a store"

_LEFTOVER = {
    "temp": "temp file of a killed state write",
    "orphan": "data file of a retired capture",
    "lock": "lock file of nothing",
}
_REASONS = ("retired", "abandoned", "empty")


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer store sweep`."""
    add_backend_arguments(parser)
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


def print_sweep(report: SweepReport, rules: SweepRules, *, dry_run: bool) -> None:
    """One line per removal and a summary on stdout; what was skipped on stderr."""
    verb = "would remove" if dry_run else "removed"
    for capture in report.captures:
        age = format_age(capture.age_seconds)
        print(f"{verb} {capture.rollout_id} ({capture.reason}, {age} old)")
    for leftover in report.leftovers:
        what = _LEFTOVER.get(leftover.reason, leftover.reason)
        print(f"{verb} {leftover.name} ({what}, {format_age(leftover.age_seconds)} old)")
    for skipped in report.skipped:
        say(logging.WARNING, f"skipped {skipped.name!r}: {skipped.reason}")
    counts = {reason: sum(c.reason == reason for c in report.captures) for reason in _REASONS}
    summary = (
        f"{verb} {len(report.captures)} capture(s): {counts['retired']} retired, "
        f"{counts['abandoned']} abandoned"
    )
    if rules.empty_older_than is not None:
        summary += f", {counts['empty']} empty"
    if report.leftovers:
        summary += f"; {len(report.leftovers)} leftover file(s)"
    if report.skipped:
        summary += f"; skipped {len(report.skipped)} (listed on stderr)"
    print(summary + (" (dry run)" if dry_run else ""))


async def _sweep(backend: Backend, rules: SweepRules, dry_run: bool) -> SweepReport:
    async with opened(backend) as store:
        return await store.admin.sweep(rules, dry_run=dry_run)


@exits_on_usage_error
def store_sweep(args: argparse.Namespace) -> int:
    """Sweep the store; exit 0, or 1 when something was skipped (the rest is swept all the same)."""
    from token_finalizer.core.errors import CaptureError, describe_exception

    backend = backend_of(args)
    rules = SweepRules(
        retired_older_than=args.retired_older_than,
        abandoned_older_than=args.abandoned_older_than,
        empty_older_than=args.empty_older_than,
    )
    try:
        report = asyncio.run(_sweep(backend, rules, args.dry_run))
    except CaptureError as exc:
        say(logging.ERROR, f"error: sweep of {backend.where}: {describe_exception(exc)}")
        return 1
    print_sweep(report, rules, dry_run=args.dry_run)
    return 1 if report.skipped else 0
