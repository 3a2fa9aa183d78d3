"""The `token-finalizer` console script.

    token-finalizer serve            run the finalizer HTTP service
    token-finalizer store serve      run a protocol-v1 capture store over a directory
    token-finalizer store sweep      remove retired tombstones (and, if asked, abandoned captures)
    token-finalizer finalize         finalize a JSONL of records offline
    token-finalizer retire           retire the retirable lines of a finalize output

Each command lives in a `_cli_*` module that defines `HELP`, an
`add_<command>_arguments(parser)` and the command itself, and defers heavy
imports (FastAPI, uvicorn, httpx) into the command, so building the parser
stays cheap and `token-finalizer store sweep` never loads a web framework.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# command path -> (module, function); each module also offers `add_arguments(parser)`.
_COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("serve",): ("token_finalizer._cli_serve", "serve"),
    ("store", "serve"): ("token_finalizer._cli_store", "store_serve"),
    ("store", "sweep"): ("token_finalizer._cli_store", "store_sweep"),
    ("finalize",): ("token_finalizer._cli_batch", "finalize"),
    ("retire",): ("token_finalizer._cli_batch", "retire"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="token-finalizer",
        description="Freeze, rebuild and retire exact token captures of RL agent rollouts.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for path, (module_name, function_name) in _COMMANDS.items():
        module = importlib.import_module(module_name)
        if len(path) == 1:
            sub = commands.add_parser(path[0], help=module.HELP[function_name])
        else:
            if path[0] not in groups:
                group = commands.add_parser(path[0], help=f"{path[0]} commands")
                groups[path[0]] = group.add_subparsers(
                    dest=f"{path[0]}_command", required=True, metavar="COMMAND"
                )
            sub = groups[path[0]].add_parser(path[1], help=module.HELP[function_name])
        getattr(module, f"add_{function_name}_arguments")(sub)
        sub.set_defaults(_run=getattr(module, function_name))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    args = _parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
