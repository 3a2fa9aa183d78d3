"""The options of `finalize` and `retire`, and what they name: the input file and the target."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from token_finalizer._constants import BATCH_DEFAULT_CONCURRENCY, BATCH_TOKEN_ENV_VAR
from token_finalizer.cli.args import positive_int
from token_finalizer.cli.batch.running import UsageError

if TYPE_CHECKING:
    from token_finalizer.cli.batch.targets import BatchTarget

__all__ = [
    "FINALIZE_HELP",
    "RETIRE_HELP",
    "add_finalize_arguments",
    "add_retire_arguments",
    "open_target",
    "readable_input",
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


def open_target(args: argparse.Namespace) -> BatchTarget:
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
            raise UsageError(str(exc)) from None
    if args.token is not None:
        raise UsageError("--token applies only with --server")
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return InProcessTarget(settings, run_id=run_id, source=source)


def readable_input(path: Path) -> Path:
    """`path`, when it is a file; UsageError otherwise."""
    if not path.is_file():
        raise UsageError(f"input {path} is not a readable file")
    return path
