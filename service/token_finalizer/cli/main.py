"""The `token-finalizer` console script: one parser, every command wired by hand.

    token-finalizer serve            run the finalizer HTTP service
    token-finalizer store serve      run a protocol-v1 capture store over a directory
    token-finalizer store sweep      remove retired tombstones (and, if asked, abandoned captures)
    token-finalizer finalize         finalize a JSONL of records offline
    token-finalizer retire           retire the retirable lines of a finalize output

Each command module defines its arguments and the command, and imports its
heavy dependencies (FastAPI, uvicorn, httpx) inside the command, so building
the parser stays cheap and `store sweep` never loads a web framework.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from token_finalizer.cli import batch, serve, store

__all__ = ["build_parser", "main"]

Command = Callable[[argparse.Namespace], int]
AddArguments = Callable[[argparse.ArgumentParser], None]


def _command(
    parent: argparse._SubParsersAction[argparse.ArgumentParser],
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
    parser = argparse.ArgumentParser(
        prog="token-finalizer",
        description="Freeze, rebuild and retire exact token captures of RL agent rollouts.",
    )
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
        commands,
        "finalize",
        batch.FINALIZE_HELP,
        batch.add_finalize_arguments,
        batch.finalize_command,
    )
    _command(
        commands, "retire", batch.RETIRE_HELP, batch.add_retire_arguments, batch.retire_command
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    run: Command = args._run
    return int(run(args) or 0)
