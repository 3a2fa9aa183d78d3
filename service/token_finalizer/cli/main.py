"""The `token-finalizer` console script: one parser, every command wired by hand.

    token-finalizer serve            run the finalizer HTTP service
    token-finalizer store serve      run a protocol-v1 capture store over a directory or Redis
    token-finalizer store sweep      remove retired tombstones (and, if asked, abandoned captures)
    token-finalizer store inspect    print one capture's state as JSON
    token-finalizer store delete     delete one capture for good
    token-finalizer finalize         finalize a JSONL of records offline
    token-finalizer retire           retire the retirable lines of a finalize output
    token-finalizer completion bash  print a bash completion script
    token-finalizer --version        print the installed version

The docs' command-line reference (README.md, docs/configuration.md#command-line)
is rendered from `build_parser()` by `cli/reference.py`: regenerate it after
changing an option (`python -m token_finalizer.cli.reference --write`).

Each command module defines its arguments and the command, and imports its
heavy dependencies (FastAPI, uvicorn, httpx) inside the command, so building
the parser stays cheap and `store sweep` never loads a web framework.

An argument that cannot work exits with status 2 and one JSON log line on
stderr (its message `token-finalizer COMMAND: MESSAGE (see token-finalizer
COMMAND --help)`), not argparse's usage block.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from token_finalizer.cli import batch, completion, serve, store

__all__ = ["build_parser", "main"]

Command = Callable[[argparse.Namespace], int]
AddArguments = Callable[[argparse.ArgumentParser], None]

DISTRIBUTION = "token-finalizer"


def version() -> str:
    """The installed distribution's version, else the package's own (a source tree)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        from token_finalizer import __version__

        return __version__


class _Parser(argparse.ArgumentParser):
    """argparse, saying a usage error in one JSON log line (exit status 2); subcommands inherit it.

    Parsing comes before the level is read, so the line is said at error level
    whatever `TOKEN_FINALIZER_LOG_LEVEL` holds (docs/configuration.md#logs).
    """

    def error(self, message: str) -> NoReturn:
        from token_finalizer._logging import cli_logging, say

        with cli_logging("ERROR"):
            say(logging.ERROR, f"{self.prog}: {message} (see {self.prog} --help)")
        self.exit(2)


class _VersionAction(argparse.Action):
    """`--version`: print `token-finalizer VERSION` on stdout and exit 0 (looked up only then)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> NoReturn:
        sys.stdout.write(f"{parser.prog} {version()}\n")
        parser.exit(0)


def _command(
    parent: argparse._SubParsersAction[_Parser],
    name: str,
    help_text: str,
    add_arguments: AddArguments,
    run: Command,
) -> None:
    parser = parent.add_parser(name, help=help_text)
    add_arguments(parser)
    parser.set_defaults(_run=run)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every command and its arguments."""
    parser = _Parser(
        prog="token-finalizer",
        description="Freeze, rebuild and retire exact token captures of RL agent rollouts.",
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _command(commands, "serve", serve.HELP, serve.add_arguments, serve.serve)
    store_group = commands.add_parser("store", help="capture store commands")
    store_commands = store_group.add_subparsers(
        dest="store_command", required=True, metavar="COMMAND"
    )
    _command(
        store_commands, "serve", store.SERVE_HELP, store.add_serve_arguments, store.store_serve
    )
    _command(
        store_commands, "sweep", store.SWEEP_HELP, store.add_sweep_arguments, store.store_sweep
    )
    _command(
        store_commands,
        "inspect",
        store.INSPECT_HELP,
        store.add_inspect_arguments,
        store.store_inspect,
    )
    _command(
        store_commands, "delete", store.DELETE_HELP, store.add_delete_arguments, store.store_delete
    )
    _command(
        commands,
        "finalize",
        batch.FINALIZE_HELP,
        batch.add_finalize_arguments,
        batch.finalize_command,
    )
    _command(
        commands, "retire", batch.RETIRE_HELP, batch.add_retire_arguments, batch.retire_command
    )
    _command(
        commands,
        "completion",
        completion.HELP,
        completion.add_arguments,
        completion.completion,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    from token_finalizer._logging import cli_logging, log_level, say

    parser = build_parser()
    args = parser.parse_args(argv)
    args._parser = parser  # the whole command line, for `completion`
    run: Command = args._run
    try:
        level = log_level()
    except ValueError as exc:
        with cli_logging("ERROR"):  # the level named is no level: this line is said anyway
            say(logging.ERROR, f"token-finalizer: {exc}")
        return 2
    # Log records (retries, warnings) are JSON lines on stderr (docs/configuration.md#logs).
    with cli_logging(level):
        return int(run(args) or 0)
