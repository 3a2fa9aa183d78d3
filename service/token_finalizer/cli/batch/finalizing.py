"""`token-finalizer finalize`: every line of IN answered in OUT, in input order, then fsynced.

OUT holds one line per IN line: the finalize answer object, or
`{"line": N, "error": ...}` for a bad line (not a JSON object, nested deeper
than the service accepts, a record the service refused, an answer that cannot
be written), so nothing is dropped silently.

IN may also be an earlier finalize output: each answer's `record` is finalized
again (a frozen capture answers the same snapshot, with a ticket this target
signs: the recovery of tickets that no longer verify,
docs/finalizer-api.md#post-retire), and its report lines are copied through as
they are, neither finalized nor counted as new bad lines.

A bad line is reported and the batch goes on; it makes the exit status 3
unless --allow-bad-lines. OUT is flushed and fsynced before the
command returns, after a stop or an interrupt too; only then is it safe to
run `retire`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from token_finalizer._constants import MAX_JSON_DEPTH
from token_finalizer._logging import CLI_LOGGER, say
from token_finalizer.cli.batch.arguments import (
    check_output,
    open_input,
    open_output,
    open_target,
)
from token_finalizer.cli.batch.lines import Line, fsync, read_jsonl
from token_finalizer.cli.batch.progress import Progress
from token_finalizer.cli.batch.running import (
    EXIT_LINES_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    UsageError,
    in_order,
    run_command,
)
from token_finalizer.cli.batch.wording import counted

if TYPE_CHECKING:
    from token_finalizer.cli.batch.targets import BatchTarget

__all__ = ["finalize_command"]


@dataclass(slots=True)
class _Written:
    """One encoded output line and what the summary counts about it."""

    number: int
    payload: bytes
    outcome: str  # finalized, masked, no_build, bad_line, carried
    reason: str | None = None
    retirable: bool = False
    error: str | None = None


# Every outcome a line can have, each a key of the summary's log line.
_OUTCOMES = ("finalized", "masked", "no_build", "bad_line")


@dataclass
class _FinalizeSummary:
    lines: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    retirable: int = 0

    def count(self, written: _Written) -> None:
        self.lines += 1
        self.outcomes[written.outcome] += 1
        self.retirable += written.retirable
        if written.reason is not None:
            self.reasons[written.reason] += 1

    def text(self, output: Path) -> str:
        by_reason = ", ".join(f"{reason}: {n}" for reason, n in sorted(self.reasons.items()))
        bad = self.outcomes["bad_line"]
        carried = self.outcomes["carried"]
        kept = f", {counted(carried, 'earlier report line')} kept" if carried else ""
        return (
            f"finalize: {counted(self.lines, 'line')} -> {output}: "
            f"{self.outcomes['finalized']} finalized ({self.retirable} retirable), "
            f"{self.outcomes['masked']} masked{f' ({by_reason})' if by_reason else ''}, "
            f"{self.outcomes['no_build']} no build, {counted(bad, 'bad line')}{kept}"
        )

    def fields(self, output: Path) -> dict[str, Any]:
        """The summary's counts, as keys of its log line."""
        return {
            "lines": self.lines,
            "output": str(output),
            **{outcome: self.outcomes[outcome] for outcome in _OUTCOMES},
            "carried": self.outcomes["carried"],
            "retirable": self.retirable,
            "mask_reasons": dict(sorted(self.reasons.items())),
        }


def _encode(payload: dict[str, Any]) -> bytes:
    from token_finalizer.core.codec import encode_json

    # In-process answers keep token fields as numpy arrays: encoded as they are;
    # integers beyond 64 bits are written exactly, as the service writes them.
    return encode_json(payload)


def _is_report_line(data: dict[str, Any]) -> bool:
    """An earlier finalize output's line for a line it could not finalize: {"line", "error"}."""
    return "record" not in data and "error" in data and "line" in data


def _record_of(data: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The record to finalize from an input object line, or why there is none.

    A finalize answer (`record` beside `build` or `retirable`) gives its record:
    finalizing it again is the one-command recovery of its ticket.
    """
    if "record" in data and ("build" in data or "retirable" in data):
        record = data["record"]
        if not isinstance(record, dict):
            return None, "a finalize answer whose `record` is not a JSON object"
        return record, None
    return data, None


def _mask_reason(build: Any) -> str | None:
    """The machine-readable mask reason a finalize answer's build carries."""
    if not isinstance(build, dict) or not build.get("mask_sample"):
        return None
    reason = build.get("mask_reason")
    return reason if isinstance(reason, str) else "unknown"


def _answer_line(number: int, answer: dict[str, Any]) -> _Written:
    build = answer.get("build")
    reason = _mask_reason(build)
    outcome = "no_build" if build is None else "finalized" if reason is None else "masked"
    retirable = bool(answer.get("retirable"))
    try:
        payload = _encode(answer)
    except (TypeError, ValueError, RecursionError) as exc:
        # Reported like any bad line: one record must not end the batch.
        return _error_line(number, f"the finalize answer cannot be written as JSON: {exc}")
    return _Written(number, payload, outcome, reason=reason, retirable=retirable)


def _error_line(number: int, message: str) -> _Written:
    return _Written(number, _encode({"line": number, "error": message}), "bad_line", error=message)


async def _finalize_line(target: BatchTarget, line: Line) -> _Written:
    from token_finalizer.cli.batch.targets import BatchAbortedError, LineRefusedError

    if line.data is None:
        return _error_line(line.number, line.error or "unreadable line")
    if _is_report_line(line.data):
        return _Written(line.number, _encode(line.data), "carried")
    record, problem = _record_of(line.data)
    if record is None:
        return _error_line(line.number, problem or "not a rollout record")
    try:
        answer = await target.finalize(record)
    except LineRefusedError as exc:
        return _error_line(line.number, str(exc))
    except BatchAbortedError as exc:
        raise BatchAbortedError(f"line {line.number}: {exc}") from None
    # Encoded here, inside the concurrency window: bytes are far smaller than
    # the decoded answer while it waits for the lines before it.
    return _answer_line(line.number, answer)


@contextlib.contextmanager
def _per_record_warnings_muted() -> Iterator[None]:
    """Silence the service's per-record warnings while a batch runs in this process.

    Each masked record logs one; here every one of them is in OUT and counted
    in the summary, and thousands of them would bury the lines that matter.
    """
    service_logger = logging.getLogger("token_finalizer")
    # The command's own lines (line reports, the summary) keep the level they had.
    cli_logger = logging.getLogger(CLI_LOGGER)
    level, cli_level = service_logger.level, cli_logger.level
    cli_logger.setLevel(cli_logger.getEffectiveLevel())
    service_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        service_logger.setLevel(level)
        cli_logger.setLevel(cli_level)


def _finalize(args: argparse.Namespace) -> int:
    output_path: Path = args.output
    with contextlib.ExitStack() as stack:
        reader = stack.enter_context(open_input(args.input))
        check_output(output_path, args.input)
        target = open_target(args)
        try:
            writer = stack.enter_context(open_output(output_path))
        except UsageError:
            asyncio.run(target.close())
            raise
        stack.enter_context(_per_record_warnings_muted())
        summary = _FinalizeSummary()
        progress = Progress("finalize", os.fstat(reader.fileno()).st_size)

        def write(written: _Written) -> None:
            writer.write(written.payload + b"\n")
            summary.count(written)
            progress.done_line()
            if written.error is not None:
                progress.report(written.number, written.error)

        # Lines nesting deeper than the service accepts are refused before they
        # are parsed, as the service refuses such a body (docs/finalizer-api.md#limits).
        lines = read_jsonl(reader, progress, max_depth=MAX_JSON_DEPTH)
        try:
            stopped = asyncio.run(in_order(target, _finalize_line, lines, args.concurrency, write))
        finally:
            # Durable before anyone may retire: also after a stop or an interrupt.
            fsync(writer, output_path)
            progress.finish()
    # One JSON line with the counts, the words in its message (docs/configuration.md#logs).
    say(logging.INFO, summary.text(output_path), **summary.fields(output_path))
    if stopped is not None:
        say(logging.ERROR, f"finalize: stopped at {stopped}")
        say(logging.ERROR, f"finalize: {output_path} holds the first {summary.lines} lines only")
        return EXIT_STOPPED
    bad = summary.outcomes["bad_line"]
    if bad and not args.allow_bad_lines:
        say(
            logging.ERROR,
            f"finalize: {counted(bad, 'bad line')} (reported above, error lines "
            f"in {output_path}): exit status {EXIT_LINES_FAILED}; --allow-bad-lines accepts them",
        )
        return EXIT_LINES_FAILED
    return EXIT_OK


def finalize_command(args: argparse.Namespace) -> int:
    """Finalize every line of IN into OUT, in order, then fsync OUT; the exit status."""
    return run_command(_finalize, args, "finalize")
