"""`token-finalizer finalize` and `token-finalizer retire`: offline batches of records.

    token-finalizer finalize IN.jsonl -o OUT.jsonl (--server URL [--token T] | --config PATH)
                             [--source NAME] [--concurrency K] [--run-id ID]
    token-finalizer retire OUT.jsonl (--server URL [--token T] | --config PATH) [--concurrency K]

`finalize` streams IN one line at a time and writes one OUT line per IN line,
in input order: the finalize answer object, or `{"line": N, "error": ...}`
for a line that is not a JSON object (or that the service refused), so
nothing is dropped silently. OUT is flushed and fsynced before the command
returns; only then is it safe to run `retire`, which drops the capture of
every retirable line (masked and failed builds are never retired).

Exit status: 0 when every line was handled (bad lines included: they are
in OUT and in the summary), 1 when the batch stopped early (OUT then holds
the lines before the failure), 2 for unusable arguments or configuration, 130
when interrupted (the lines written so far are fsynced too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from token_finalizer._constants import (
    BATCH_DEFAULT_CONCURRENCY,
    BATCH_PROGRESS_INTERVAL_S,
    BATCH_TOKEN_ENV_VAR,
)
from token_finalizer.cli.args import positive_int

if TYPE_CHECKING:
    from token_finalizer.cli.batch.targets import BatchTarget

__all__ = [
    "FINALIZE_HELP",
    "RETIRE_HELP",
    "add_finalize_arguments",
    "add_retire_arguments",
    "finalize",
    "retire",
]

FINALIZE_HELP = "finalize a JSONL of finished rollout records (offline, output in input order)"
RETIRE_HELP = "retire the retirable lines of a finalize output (only once it is durable)"

_EXIT_OK = 0
_EXIT_STOPPED = 1
_EXIT_USAGE = 2
_EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT


class _UsageError(Exception):
    """Arguments or configuration that cannot work (exit status 2)."""


# ---------------------------------------------------------------------------
# arguments and target
# ---------------------------------------------------------------------------


def _add_target_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--server", metavar="URL", help="base URL of a running finalizer service")
    target.add_argument(
        "--config",
        metavar="PATH",
        help="run in this process on the sources of this YAML configuration (no server)",
    )
    parser.add_argument(
        "--token", metavar="T", help=f"bearer token for --server (default: ${BATCH_TOKEN_ENV_VAR})"
    )
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=BATCH_DEFAULT_CONCURRENCY,
        metavar="K",
        help=f"records handled at once (default {BATCH_DEFAULT_CONCURRENCY})",
    )


def add_finalize_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer finalize`."""
    parser.add_argument("input", metavar="IN.jsonl", type=Path, help="finished records, one a line")
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT.jsonl",
        type=Path,
        required=True,
        help="finalize answers, one per input line, in input order (fsynced at the end)",
    )
    _add_target_arguments(parser)
    parser.add_argument("--source", metavar="NAME", help="configured source (default: the default)")
    parser.add_argument(
        "--run-id", metavar="ID", help="run the mask-fraction guard counts these records in"
    )


def add_retire_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer retire`."""
    parser.add_argument(
        "input", metavar="OUT.jsonl", type=Path, help="a durable `token-finalizer finalize` output"
    )
    _add_target_arguments(parser)


def _open_target(args: argparse.Namespace) -> BatchTarget:
    """The service at --server, or this process on the sources of --config."""
    from token_finalizer.cli.batch.targets import InProcessTarget, ServiceTarget
    from token_finalizer.settings import ConfigError, load_settings

    run_id = getattr(args, "run_id", None)
    source = getattr(args, "source", None)
    if args.server is not None:
        token = args.token or os.environ.get(BATCH_TOKEN_ENV_VAR) or None
        try:
            return ServiceTarget(args.server, token=token, run_id=run_id, source=source)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
    if args.token is not None:
        raise _UsageError("--token applies only with --server")
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        raise _UsageError(str(exc)) from None
    return InProcessTarget(settings, run_id=run_id, source=source)


def _readable(path: Path) -> Path:
    if not path.is_file():
        raise _UsageError(f"input {path} is not a readable file")
    return path


# ---------------------------------------------------------------------------
# JSONL in and out
# ---------------------------------------------------------------------------


class _Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, verb: str, total_bytes: int) -> None:
        self.verb = verb
        self.total_bytes = total_bytes
        self.enabled = sys.stderr.isatty()
        self.lines = 0
        self.bytes_read = 0
        self._started = time.monotonic()
        self._drawn = 0.0

    def advance(self, raw_size: int) -> None:
        """Count bytes read from the input (the bar's position)."""
        self.bytes_read += raw_size

    def done_line(self) -> None:
        """Count one finished line; redraw when the last drawing is old enough."""
        self.lines += 1
        now = time.monotonic()
        if self.enabled and now - self._drawn >= BATCH_PROGRESS_INTERVAL_S:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        share = min(self.bytes_read / self.total_bytes, 1.0) if self.total_bytes else 1.0
        filled = int(share * 30)
        rate = self.lines / max(now - self._started, 1e-9)
        sys.stderr.write(
            f"\r{self.verb} [{'#' * filled}{'.' * (30 - filled)}] {share:4.0%} "
            f"{self.lines} lines {rate:.1f}/s"
        )
        sys.stderr.flush()

    def clear(self) -> None:
        """Erase the bar so that a message can take its line (the next draw restores it)."""
        if self.enabled and self._drawn:
            sys.stderr.write("\r\x1b[K")

    def finish(self) -> None:
        """Leave the bar's final state on its own line."""
        if self.enabled and self._drawn:
            self._draw(time.monotonic())
            sys.stderr.write("\n")
            sys.stderr.flush()


@dataclass(slots=True)
class _Line:
    """One input line: its parsed object, or why it is not one."""

    number: int
    data: dict[str, Any] | None
    error: str | None = None


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    return "null" if value is None else "a number"


def _parse_line(number: int, raw: bytes) -> _Line:
    from token_finalizer.core.codec import loads_json

    text = raw.rstrip(b"\r\n")
    if not text.strip():
        return _Line(number, None, "empty line; expected a JSON object")
    try:
        value = loads_json(text)
    except ValueError as exc:
        return _Line(number, None, f"not valid JSON: {exc}")
    if not isinstance(value, dict):
        return _Line(number, None, f"not a JSON object (got {_json_kind(value)})")
    return _Line(number, value)


def _read_jsonl(handle: IO[bytes], progress: _Progress) -> Iterator[_Line]:
    for number, raw in enumerate(handle, start=1):
        progress.advance(len(raw))
        yield _parse_line(number, raw)


def _report(progress: _Progress, number: int, message: str) -> None:
    progress.clear()
    sys.stderr.write(f"line {number}: {message}\n")


def _fsync(handle: IO[bytes], path: Path) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    # A new file's directory entry is durable only once its directory is synced.
    directory = os.open(path.resolve().parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


async def _in_order(
    target: BatchTarget,
    step: Callable[[BatchTarget, Any], Awaitable[Any]],
    items: Iterator[Any],
    concurrency: int,
    consume: Callable[[Any], None],
) -> str | None:
    """Run `step` over `items` with bounded concurrency, consuming results in input order.

    Returns None when every item was handled, else why the batch stopped.
    The target is closed either way.
    """
    from token_finalizer.cli.batch.targets import BatchAbortedError
    from token_finalizer_client._ordered import ordered_map

    try:
        results = ordered_map(lambda item: step(target, item), items, concurrency=concurrency)
        async with contextlib.aclosing(results):
            async for result in results:
                consume(result)
    except BatchAbortedError as exc:
        return str(exc)
    finally:
        await target.close()
    return None


# ---------------------------------------------------------------------------
# finalize
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Written:
    """One encoded output line and what the summary counts about it."""

    number: int
    payload: bytes
    outcome: str  # finalized, masked, no_build, bad_line
    reason: str | None = None
    retirable: bool = False
    error: str | None = None


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
        return (
            f"finalize: {self.lines} lines -> {output}: "
            f"{self.outcomes['finalized']} finalized ({self.retirable} retirable), "
            f"{self.outcomes['masked']} masked{f' ({by_reason})' if by_reason else ''}, "
            f"{self.outcomes['no_build']} no build, {bad} bad line{'' if bad == 1 else 's'}\n"
        )


def _encode(payload: dict[str, Any]) -> bytes:
    import orjson

    # In-process answers keep token fields as numpy arrays: encoded as they are.
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


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
    return _Written(number, _encode(answer), outcome, reason=reason, retirable=retirable)


def _error_line(number: int, message: str) -> _Written:
    return _Written(number, _encode({"line": number, "error": message}), "bad_line", error=message)


async def _finalize_line(target: BatchTarget, line: _Line) -> _Written:
    from token_finalizer.cli.batch.targets import BatchAbortedError, LineRefusedError

    if line.data is None:
        return _error_line(line.number, line.error or "unreadable line")
    try:
        answer = await target.finalize(line.data)
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
    level = service_logger.level
    service_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        service_logger.setLevel(level)


def _finalize(args: argparse.Namespace) -> int:
    source_path = _readable(args.input)
    output_path: Path = args.output
    if output_path.exists() and output_path.resolve() == source_path.resolve():
        raise _UsageError("the output must not be the input file")
    target = _open_target(args)
    summary = _FinalizeSummary()
    progress = _Progress("finalize", source_path.stat().st_size)
    with (
        _per_record_warnings_muted(),
        open(source_path, "rb") as reader,
        open(output_path, "wb") as writer,
    ):

        def write(written: _Written) -> None:
            writer.write(written.payload + b"\n")
            summary.count(written)
            progress.done_line()
            if written.error is not None:
                _report(progress, written.number, written.error)

        try:
            stopped = asyncio.run(
                _in_order(
                    target, _finalize_line, _read_jsonl(reader, progress), args.concurrency, write
                )
            )
        finally:
            # Durable before anyone may retire: also after a stop or an interrupt.
            _fsync(writer, output_path)
            progress.finish()
    sys.stderr.write(summary.text(output_path))
    if stopped is not None:
        sys.stderr.write(
            f"finalize: stopped at {stopped}\n"
            f"finalize: {output_path} holds the first {summary.lines} lines only\n"
        )
        return _EXIT_STOPPED
    return _EXIT_OK


def finalize(args: argparse.Namespace) -> int:
    """Finalize every line of IN into OUT, in order, then fsync OUT; the exit status."""
    return _run(_finalize, args, "finalize")


# ---------------------------------------------------------------------------
# retire
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Retirement:
    """One line of a finalize output: what to retire, or why it is skipped."""

    number: int
    rollout_id: str = ""
    build: dict[str, Any] | None = None
    source: str | None = None
    skip: str | None = None  # error_line, not_retirable, unreadable
    error: str | None = None


def _slim(build: dict[str, Any]) -> dict[str, Any]:
    # Retire decides on the build's flags and snapshot; the rebuilt tokens only
    # cost memory here, so a stub keeps "has a rebuilt response" true.
    rebuilt = build.get("rebuilt_response")
    if isinstance(rebuilt, dict):
        return {**build, "rebuilt_response": {"id": rebuilt.get("id")}}
    return build


def _retirement(line: _Line) -> _Retirement:
    data = line.data
    if data is None:
        return _Retirement(line.number, skip="unreadable", error=line.error)
    if "record" not in data and "error" in data:
        return _Retirement(line.number, skip="error_line")
    if not data.get("retirable"):
        return _Retirement(line.number, skip="not_retirable")
    build = data.get("build")
    if not isinstance(build, dict):
        error = "marked retirable but `build` is not an object"
        return _Retirement(line.number, skip="unreadable", error=error)
    return _Retirement(
        line.number,
        rollout_id=str(data.get("rollout_id") or ""),
        build=_slim(build),
        source=data.get("source"),
    )


def _read_retirements(handle: IO[bytes], progress: _Progress) -> Iterator[_Retirement]:
    for line in _read_jsonl(handle, progress):
        yield _retirement(line)


async def _retire_line(target: BatchTarget, item: _Retirement) -> tuple[_Retirement, str]:
    from token_finalizer.cli.batch.targets import BatchAbortedError, LineRefusedError

    if item.skip is not None or item.build is None:
        return item, item.skip or "unreadable"
    try:
        retired = await target.retire(item.rollout_id, item.build, item.source)
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
    source_path = _readable(args.input)
    target = _open_target(args)
    outcomes: Counter[str] = Counter()
    progress = _Progress("retire", source_path.stat().st_size)

    def tally(result: tuple[_Retirement, str]) -> None:
        item, outcome = result
        outcomes[outcome] += 1
        progress.done_line()
        if item.error is not None:
            _report(progress, item.number, item.error)

    with open(source_path, "rb") as reader:
        try:
            stopped = asyncio.run(
                _in_order(
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
        return _EXIT_STOPPED
    return _EXIT_OK


def retire(args: argparse.Namespace) -> int:
    """Retire the retirable lines of a durable finalize output; the exit status."""
    return _run(_retire, args, "retire")


def _run(command: Callable[[argparse.Namespace], int], args: argparse.Namespace, name: str) -> int:
    try:
        return command(args)
    except _UsageError as exc:
        sys.stderr.write(f"token-finalizer {name}: error: {exc}\n")
        return _EXIT_USAGE
    except KeyboardInterrupt:
        # The lines written so far were fsynced on the way out.
        sys.stderr.write(f"\ntoken-finalizer {name}: interrupted\n")
        return _EXIT_INTERRUPTED
