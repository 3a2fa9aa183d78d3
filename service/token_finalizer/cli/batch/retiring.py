"""`token-finalizer retire`: drop the capture of every retirable line of a durable finalize output.

A line is retired through its `retire` object (the finalize answer's ticket);
masked and failed builds have none and are never retired, and neither are
error lines.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from token_finalizer.cli.batch.arguments import open_target, readable_input
from token_finalizer.cli.batch.lines import Line, read_jsonl
from token_finalizer.cli.batch.progress import Progress
from token_finalizer.cli.batch.running import EXIT_OK, EXIT_STOPPED, in_order, run_command

if TYPE_CHECKING:
    from token_finalizer.cli.batch.targets import BatchTarget

__all__ = ["retire_command"]


@dataclass(slots=True)
class _Retirement:
    """One line of a finalize output: what to retire, or why it is skipped."""

    number: int
    ticket: dict[str, Any] | None = None
    skip: str | None = None  # error_line, not_retirable, unreadable
    error: str | None = None


def _retirement(line: Line) -> _Retirement:
    data = line.data
    if data is None:
        return _Retirement(line.number, skip="unreadable", error=line.error)
    if "record" not in data and "error" in data:
        return _Retirement(line.number, skip="error_line")
    if "retire" not in data:
        error = "not a finalize answer (no `retire` key): is this the finalize output file?"
        return _Retirement(line.number, skip="unreadable", error=error)
    ticket = data["retire"]
    if ticket is None:
        return _Retirement(line.number, skip="not_retirable")
    if not isinstance(ticket, dict):
        error = "`retire` is not the object finalize answered"
        return _Retirement(line.number, skip="unreadable", error=error)
    return _Retirement(line.number, ticket=ticket)


def _read_retirements(handle: IO[bytes], progress: Progress) -> Iterator[_Retirement]:
    for line in read_jsonl(handle, progress):
        yield _retirement(line)


async def _retire_line(target: BatchTarget, item: _Retirement) -> tuple[_Retirement, str]:
    from token_finalizer.cli.batch.targets import BatchAbortedError, LineRefusedError

    if item.skip is not None or item.ticket is None:
        return item, item.skip or "unreadable"
    try:
        retired = await target.retire(item.ticket)
    except LineRefusedError as exc:
        item.error = str(exc)
        return item, "refused"
    except BatchAbortedError as exc:
        raise BatchAbortedError(f"line {item.number}: {exc}") from None
    return item, "retired" if retired else "not_retired"


def _retire_summary(lines: int, outcomes: Counter[str]) -> str:
    failed = outcomes["unreadable"] + outcomes["refused"]
    return (
        f"retire: {lines} lines: {outcomes['retired']} retired, "
        f"{outcomes['not_retired']} not retired (the store moved on), "
        f"{outcomes['not_retirable']} not retirable, {outcomes['error_line']} error lines, "
        f"{failed} failed\n"
    )


def _retire(args: argparse.Namespace) -> int:
    source_path = readable_input(args.input)
    target = open_target(args)
    outcomes: Counter[str] = Counter()
    progress = Progress("retire", source_path.stat().st_size)

    def tally(result: tuple[_Retirement, str]) -> None:
        item, outcome = result
        outcomes[outcome] += 1
        progress.done_line()
        if item.error is not None:
            progress.report(item.number, item.error)

    with open(source_path, "rb") as reader:
        try:
            stopped = asyncio.run(
                in_order(
                    target,
                    _retire_line,
                    _read_retirements(reader, progress),
                    args.concurrency,
                    tally,
                )
            )
        finally:
            progress.finish()
    sys.stderr.write(_retire_summary(progress.lines, outcomes))
    if stopped is not None:
        sys.stderr.write(f"retire: stopped at {stopped}\n")
        return EXIT_STOPPED
    return EXIT_OK


def retire_command(args: argparse.Namespace) -> int:
    """Retire the retirable lines of a durable finalize output; the exit status."""
    return run_command(_retire, args, "retire")
