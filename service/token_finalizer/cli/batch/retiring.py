"""`token-finalizer retire`: drop the capture of every retirable line of a durable finalize output.

A line is retired through its `retire` object (the finalize answer's ticket);
masked and failed builds have none and are never retired, and neither are
error lines.

The input must be what `token-finalizer finalize` wrote. A file of rollout
records (finalize's input, a common slip) is refused at its first record,
before anything is retired; a file in which no line is a finalize answer
ends with exit status 2.

Every ticket is verified (through the service, or in this process with the
configured `retire.key`). A line that fails is reported and the batch goes
on, ending with exit status 3: a bad line (not JSON, not a finalize answer,
a `retire` object the service refuses as malformed; --allow-bad-lines
accepts these), or a ticket that does not verify (always a failure: it
retired nothing, and usually means the wrong key).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from token_finalizer._logging import say
from token_finalizer.cli.batch.arguments import open_input, open_target
from token_finalizer.cli.batch.lines import Line, read_jsonl
from token_finalizer.cli.batch.progress import Progress
from token_finalizer.cli.batch.running import (
    EXIT_LINES_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    EXIT_USAGE,
    UsageError,
    in_order,
    run_command,
)
from token_finalizer.cli.batch.wording import counted

if TYPE_CHECKING:
    from token_finalizer.cli.batch.targets import BatchTarget

__all__ = ["retire_command"]

_PASS_FINALIZE_OUTPUT = "pass the output of `token-finalizer finalize`"
# How many lines the check of the input's kind reads to find its first object line.
_KIND_CHECK_LINES = 1000
# Keys of a rollout record (finalize's input) that no finalize answer has at its top.
_RECORD_KEYS = frozenset({"response", "responses_create_params", "agent_ref", "reward"})
# Outcomes of lines that are finalize answers (retired or not).
_ANSWER_OUTCOMES = ("retired", "not_retired", "not_retirable", "refused", "bad_ticket")
# Outcomes of bad lines: --allow-bad-lines accepts them.
_BAD_OUTCOMES = ("unreadable", "not_an_answer", "bad_ticket")


@dataclass(slots=True)
class _Retirement:
    """One line of a finalize output: what to retire, or why it is skipped."""

    number: int
    ticket: dict[str, Any] | None = None
    skip: str | None = None  # error_line, not_retirable, not_an_answer, unreadable
    error: str | None = None


def _is_error_line(data: dict[str, Any]) -> bool:
    """finalize's line for an input line it could not finalize: {"line": N, "error": ...}."""
    return "record" not in data and "error" in data


def _not_an_answer(data: dict[str, Any]) -> str | None:
    """What an object line is when it is not a finalize answer (None when it is one)."""
    if "retire" in data:
        return None
    if "record" not in data and (
        any(key.startswith("_ng_") for key in data) or not _RECORD_KEYS.isdisjoint(data)
    ):
        return "a rollout record, not a finalize answer"
    return "not a finalize answer (it has no `retire` key)"


def _retirement(line: Line) -> _Retirement:
    data = line.data
    if data is None:
        return _Retirement(line.number, skip="unreadable", error=line.error)
    if _is_error_line(data):
        return _Retirement(line.number, skip="error_line")
    problem = _not_an_answer(data)
    if problem is not None:
        error = f"{problem}: {_PASS_FINALIZE_OUTPUT}"
        return _Retirement(line.number, skip="not_an_answer", error=error)
    ticket = data["retire"]
    if ticket is None:
        return _Retirement(line.number, skip="not_retirable")
    if not isinstance(ticket, dict):
        error = "`retire` is not the object finalize answered"
        return _Retirement(line.number, skip="unreadable", error=error)
    return _Retirement(line.number, ticket=ticket)


def _check_first_object_line(handle: IO[bytes]) -> None:
    """UsageError when the first object line (error lines aside) is not a finalize answer.

    Reads at most `_KIND_CHECK_LINES` lines, then rewinds `handle` (a pipe, which
    cannot be rewound, is not checked: its lines are judged one by one).
    """
    if not handle.seekable():
        return
    try:
        for line in itertools.islice(read_jsonl(handle), _KIND_CHECK_LINES):
            if line.data is None or _is_error_line(line.data):
                continue
            problem = _not_an_answer(line.data)
            if problem is not None:
                raise UsageError(f"line {line.number} is {problem}: {_PASS_FINALIZE_OUTPUT}")
            return
    finally:
        handle.seek(0)


def _read_retirements(handle: IO[bytes], progress: Progress) -> Iterator[_Retirement]:
    for line in read_jsonl(handle, progress):
        yield _retirement(line)


async def _retire_line(target: BatchTarget, item: _Retirement) -> tuple[_Retirement, str]:
    from token_finalizer.cli.batch.targets import (
        BatchAbortedError,
        LineRefusedError,
        TicketRefusedError,
    )

    if item.skip is not None or item.ticket is None:
        return item, item.skip or "unreadable"
    try:
        retired = await target.retire(item.ticket)
    except TicketRefusedError as exc:
        item.error = f"ticket refused, nothing retired: {exc}"
        return item, "refused"
    except LineRefusedError as exc:
        item.error = str(exc)
        return item, "bad_ticket"
    except BatchAbortedError as exc:
        raise BatchAbortedError(f"line {item.number}: {exc}") from None
    return item, "retired" if retired else "not_retired"


def _retire_summary(lines: int, outcomes: Counter[str]) -> str:
    bad = sum(outcomes[outcome] for outcome in _BAD_OUTCOMES)
    return (
        f"retire: {counted(lines, 'line')}: {outcomes['retired']} retired, "
        f"{outcomes['not_retired']} not retired (the store moved on), "
        f"{outcomes['not_retirable']} not retirable, "
        f"{counted(outcomes['error_line'], 'error line')}, "
        f"{bad} bad, {outcomes['refused']} tickets refused"
    )


def _failures(outcomes: Counter[str], allow_bad_lines: bool) -> str | None:
    """What makes the exit status 3, in words; None when nothing does."""
    bad = 0 if allow_bad_lines else sum(outcomes[outcome] for outcome in _BAD_OUTCOMES)
    refused = outcomes["refused"]
    parts = []
    if bad:
        parts.append(f"{counted(bad, 'bad line')} (--allow-bad-lines accepts them)")
    if refused:
        parts.append(
            f"{refused} ticket{'' if refused == 1 else 's'} refused (signed with another "
            "retire.key, or edited)"
        )
    return "; ".join(parts) or None


def _recovery(path: Path) -> str:
    """How to retire what refused tickets kept: finalize the answers again, retire the new file.

    The captures are still frozen, so the same snapshots come back with tickets
    the target signs now (docs/finalizer-api.md#post-retire).
    """
    again = path.with_name(f"{path.stem}.again.jsonl")
    return (
        f"retire: to recover, finalize this file again (finalize takes its answers and "
        f"finalizes their records), then retire the new output: "
        f"`token-finalizer finalize {path} -o {again}` and "
        f"`token-finalizer retire {again}`, both with this command's --server or --config"
    )


def _retire(args: argparse.Namespace) -> int:
    with open_input(args.input) as reader:
        _check_first_object_line(reader)
        target = open_target(args, retiring=True)
        outcomes: Counter[str] = Counter()
        progress = Progress("retire", os.fstat(reader.fileno()).st_size)

        def tally(result: tuple[_Retirement, str]) -> None:
            item, outcome = result
            outcomes[outcome] += 1
            progress.done_line()
            if item.error is not None:
                progress.report(item.number, item.error)

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
    # One JSON line with the counts, the words in its message (docs/configuration.md#logs).
    counts = {"lines": progress.lines, **dict(sorted(outcomes.items()))}
    say(logging.INFO, _retire_summary(progress.lines, outcomes), **counts)
    if stopped is not None:
        say(logging.ERROR, f"retire: stopped at {stopped}")
        return EXIT_STOPPED
    answers = sum(outcomes[outcome] for outcome in _ANSWER_OUTCOMES)
    if answers == 0 and outcomes["not_an_answer"] + outcomes["unreadable"] > 0:
        say(
            logging.ERROR,
            f"token-finalizer retire: no line of {args.input} is a finalize answer: "
            f"{_PASS_FINALIZE_OUTPUT}",
        )
        return EXIT_USAGE
    failures = _failures(outcomes, args.allow_bad_lines)
    if failures is not None:
        say(logging.ERROR, f"retire: {failures}: exit status {EXIT_LINES_FAILED}")
        if outcomes["refused"]:
            say(logging.ERROR, _recovery(args.input))
        return EXIT_LINES_FAILED
    return EXIT_OK


def retire_command(args: argparse.Namespace) -> int:
    """Retire the retirable lines of a durable finalize output; the exit status."""
    return run_command(_retire, args, "retire")
