"""The options of `finalize` and `retire`, and what they name: the files and the target.

A path or an option that cannot work is a `UsageError` (exit status 2, one
line on stderr) raised before anything is finalized or retired: the input is
opened first, the output checked, the target opened last.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING

from token_finalizer._constants import BATCH_DEFAULT_CONCURRENCY, BATCH_TOKEN_ENV_VAR
from token_finalizer._logging import say
from token_finalizer.cli.args import positive_int
from token_finalizer.cli.batch.running import UsageError

if TYPE_CHECKING:
    from token_finalizer.cli.batch.targets import BatchTarget
    from token_finalizer.settings import Settings

__all__ = [
    "FINALIZE_HELP",
    "RETIRE_HELP",
    "add_finalize_arguments",
    "add_retire_arguments",
    "check_output",
    "open_input",
    "open_output",
    "open_target",
]

FINALIZE_HELP = "finalize a JSONL of finished rollout records (offline, output in input order)"
RETIRE_HELP = "retire the retirable lines of a finalize output (only once it is durable)"


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
    parser.add_argument(
        "--allow-bad-lines",
        action="store_true",
        help="exit 0 even when lines are bad (not JSON, not what the command reads, or "
        "refused as malformed); they are still reported (finalize also writes an error line "
        "for each into its output; retire writes no output). Without "
        "it any failed line makes the exit status 3",
    )


def add_finalize_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `token-finalizer finalize`."""
    parser.add_argument(
        "input",
        metavar="IN.jsonl",
        type=Path,
        help="finished records, one a line; or an earlier finalize output, whose answers' "
        "records are finalized again (new tickets for the same snapshots) and whose error "
        "lines are kept as they are",
    )
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


def _check_retire_key(settings: Settings, config: str) -> None:
    """UsageError when an in-process retire could not verify a single ticket."""
    if settings.retire.key is None:
        raise UsageError(
            f"{config} sets no retire.key, so no retire ticket can be verified and nothing "
            "is retired: set retire.key (or $TOKEN_FINALIZER__RETIRE__KEY) to the key of the "
            "finalizer that issued the tickets, or retire through that finalizer with "
            "--server URL (docs/configuration.md#retire)"
        )


def _warn_unverifiable_tickets(settings: Settings, config: str) -> None:
    """Say that tickets signed under a random key cannot be retired by any later process."""
    if settings.retire.key is None:
        say(
            logging.WARNING,
            f"token-finalizer finalize: warning: {config} sets no retire.key: the tickets "
            "written to the output verify in this process only, so `token-finalizer retire` "
            "will refuse them; set retire.key to retire later (finalizing again then gives "
            "new tickets for the same snapshots)",
        )


def open_target(args: argparse.Namespace, *, retiring: bool = False) -> BatchTarget:
    """The service at --server, or this process on the sources of --config.

    In this process tickets are signed and verified with `retire.key`: a
    retire without one is a UsageError (it could verify nothing), a finalize
    without one is warned about.
    """
    from token_finalizer.cli.batch.targets import InProcessTarget, ServiceTarget
    from token_finalizer.settings import ConfigError, load_settings

    run_id = getattr(args, "run_id", None)
    source = getattr(args, "source", None)
    if args.server is not None:
        token = args.token or os.environ.get(BATCH_TOKEN_ENV_VAR) or None
        try:
            return ServiceTarget(args.server, token=token, run_id=run_id, source=source)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.token is not None:
        raise UsageError("--token applies only with --server")
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if retiring:
        _check_retire_key(settings, args.config)
    try:
        target = InProcessTarget(settings, run_id=run_id, source=source)
    except OSError as exc:  # a file source whose directory cannot be created or opened
        where = f"{exc.filename}: " if exc.filename else ""
        raise UsageError(
            f"cannot open the sources of {args.config}: {where}{_reason(exc)}"
        ) from None
    if not retiring:
        _warn_unverifiable_tickets(settings, args.config)
    return target


# What an OSError means for a file named on the command line, said plainly.
_REASONS = {
    errno.ENOENT: "no such file",
    errno.EISDIR: "it is a directory",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
    errno.ENOSPC: "no space left on the device",
}


def _reason(exc: OSError) -> str:
    if exc.errno in _REASONS:
        return _REASONS[exc.errno]
    return (exc.strerror or str(exc)).lower()


def open_input(path: Path) -> IO[bytes]:
    """The input file, open for reading; UsageError saying why it cannot be read."""
    try:
        return open(path, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {_reason(exc)}") from None


def check_output(path: Path, input_path: Path) -> None:
    """UsageError unless `path` can be created or overwritten, and is not the input.

    Checked before the target is opened and without touching the file; the
    output is created (or truncated) only once everything else is in place.
    """
    directory = path.parent
    if not directory.exists():
        raise UsageError(f"cannot write {path}: directory does not exist")
    if not directory.is_dir():
        raise UsageError(f"cannot write {path}: {directory} is not a directory")
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a directory")
    if path.exists() and path.samefile(input_path):
        raise UsageError(f"cannot write {path}: it is the input file")
    if not os.access(path if path.exists() else directory, os.W_OK):
        raise UsageError(f"cannot write {path}: permission denied")


def open_output(path: Path) -> IO[bytes]:
    """The output file, created or truncated; UsageError saying why it cannot be written."""
    try:
        return open(path, "wb")
    except OSError as exc:
        reason = "directory does not exist" if exc.errno == errno.ENOENT else _reason(exc)
        raise UsageError(f"cannot write {path}: {reason}") from None
