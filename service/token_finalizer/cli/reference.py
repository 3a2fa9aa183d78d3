"""The command-line reference of the docs, rendered from the parser itself.

    python -m token_finalizer.cli.reference --write    rewrite the generated regions
    python -m token_finalizer.cli.reference --check    exit 1 when they are out of date

Two regions are generated, each between marker comments, and nothing else in
the files is touched: the synopsis of every command in README.md ("Command
line") and one section per command, with every argument and its help text,
in docs/configuration.md ("Command line"). Both come from `build_parser()`,
so an option added to a command shows up in the docs by regenerating them;
tests/service/test_cli_reference.py fails while the committed text differs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CONFIGURATION",
    "README",
    "Command",
    "commands",
    "generated_files",
    "reference",
    "replace_region",
    "synopsis",
]

PROG = "token-finalizer"
README = Path("README.md")
CONFIGURATION = Path("docs/configuration.md")
_SYNOPSIS_REGION = "CLI synopsis"
_REFERENCE_REGION = "CLI reference"
_REGENERATE = "python -m token_finalizer.cli.reference --write"
# Synopsis lines longer than this are continued on the next line, indented.
_WIDTH = 100


@dataclass(frozen=True, slots=True)
class Command:
    """One runnable command: its words after the program name, its parser, its help line."""

    words: tuple[str, ...]
    parser: argparse.ArgumentParser
    help: str

    @property
    def name(self) -> str:
        """`token-finalizer store sweep`."""
        return " ".join((PROG, *self.words))


def _subcommands(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[Command]:
    """Every runnable command under `parser`, depth first, in the order they were added."""
    subcommands = _subcommands(parser)
    if subcommands is None:
        return
    helps = {choice.dest: choice.help or "" for choice in subcommands._choices_actions}
    for name, child in subcommands.choices.items():
        if _subcommands(child) is None:
            yield Command((*words, name), child, helps.get(name, ""))
        else:
            yield from commands(child, (*words, name))


def _shown(action: argparse.Action) -> bool:
    return action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)


def _metavar(action: argparse.Action) -> str:
    metavar = action.metavar or action.dest.upper()
    return " ".join(metavar) if isinstance(metavar, tuple) else metavar


def _usage(action: argparse.Action) -> str:
    """How one argument is written: `IN.jsonl`, `--dir DIR`, `--dry-run`."""
    if not action.option_strings:
        return _metavar(action)
    flag = action.option_strings[0]
    return flag if action.nargs == 0 else f"{flag} {_metavar(action)}"


def _groups(
    parser: argparse.ArgumentParser,
) -> dict[argparse.Action, argparse._MutuallyExclusiveGroup]:
    return {
        action: group
        for group in parser._mutually_exclusive_groups
        for action in group._group_actions
    }


def _usage_parts(parser: argparse.ArgumentParser) -> list[str]:
    """The synopsis of one command's arguments, in the order they were added."""
    group_of = _groups(parser)
    parts: list[str] = []
    seen: set[int] = set()
    for action in parser._actions:
        if not _shown(action):
            continue
        group = group_of.get(action)
        if group is not None:
            if id(group) in seen:
                continue
            seen.add(id(group))
            inner = " | ".join(_usage(a) for a in group._group_actions if _shown(a))
            parts.append(f"({inner})" if group.required else f"[{inner}]")
        elif not action.option_strings or action.required:
            parts.append(_usage(action))
        else:
            parts.append(f"[{_usage(action)}]")
    return parts


def _wrapped(head: str, parts: Sequence[str]) -> str:
    """`head` and its parts on lines of at most _WIDTH characters, continued indented."""
    lines, line = [], head
    indent = " " * (len(head) + 1)
    for part in parts:
        if len(line) + 1 + len(part) > _WIDTH and line.strip() != head.strip():
            lines.append(line)
            line = indent + part
        else:
            line = f"{line} {part}"
    lines.append(line)
    return "\n".join(lines)


def _synopsis_line(command: Command) -> str:
    return _wrapped(command.name, _usage_parts(command.parser))


def synopsis(parser: argparse.ArgumentParser) -> str:
    """README's command block: one synopsis per command, then `--version`."""
    lines = [_synopsis_line(command) for command in commands(parser)]
    lines.append(f"{PROG} --version")
    return "```\n" + "\n".join(lines) + "\n```\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _meaning(action: argparse.Action, group: argparse._MutuallyExclusiveGroup | None) -> str:
    text = action.help or ""
    if group is not None:
        flags = " / ".join(f"`{a.option_strings[0]}`" for a in group._group_actions if _shown(a))
        text += f" (one of {flags}{', required' if group.required else ''})"
    elif action.option_strings and action.required:
        text += " (required)"
    return _cell(text.strip())


def _section(command: Command) -> str:
    group_of = _groups(command.parser)
    rows = [
        f"| `{_usage(action)}` | {_meaning(action, group_of.get(action))} |"
        for action in command.parser._actions
        if _shown(action)
    ]
    table = "\n".join(["| argument | meaning |", "|---|---|", *rows])
    summary = command.help[:1].upper() + command.help[1:]
    return f"### {command.name}\n\n{summary}.\n\n```\n{_synopsis_line(command)}\n```\n\n{table}\n"


def reference(parser: argparse.ArgumentParser) -> str:
    """docs/configuration.md's command sections: every command, every argument."""
    return "\n".join(_section(command) for command in commands(parser))


def _markers(region: str) -> tuple[str, str]:
    return (
        f"<!-- BEGIN {region}: generated by `{_REGENERATE}` from the parser; do not edit -->\n",
        f"<!-- END {region} -->\n",
    )


def replace_region(text: str, region: str, body: str) -> str:
    """`text` with what lies between the region's markers replaced by `body`.

    ValueError when the markers are missing or out of order.
    """
    begin, end = _markers(region)
    start = text.find(begin)
    stop = text.find(end, start + len(begin)) if start >= 0 else -1
    if start < 0 or stop < 0:
        raise ValueError(f"no {region!r} region (its BEGIN and END markers) in the text")
    return text[: start + len(begin)] + body + text[stop:]


def generated_files(root: Path, parser: argparse.ArgumentParser | None = None) -> dict[Path, str]:
    """What README.md and docs/configuration.md under `root` must read, by path."""
    from token_finalizer.cli.main import build_parser

    parser = parser or build_parser()
    wanted = {
        README: (_SYNOPSIS_REGION, synopsis(parser)),
        CONFIGURATION: (_REFERENCE_REGION, reference(parser)),
    }
    return {
        root / path: replace_region((root / path).read_text(), region, body)
        for path, (region, body) in wanted.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Write the generated regions (--write) or check them (--check); exit 1 on drift."""
    options = argparse.ArgumentParser(
        prog="python -m token_finalizer.cli.reference", description=__doc__.splitlines()[0]
    )
    mode = options.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the generated regions")
    mode.add_argument("--check", action="store_true", help="exit 1 when a region is out of date")
    options.add_argument(
        "--root", type=Path, default=Path(), help="the repository checkout (default: .)"
    )
    args = options.parse_args(argv)
    wanted = generated_files(args.root)
    stale = [path for path, text in wanted.items() if path.read_text() != text]
    if args.write:
        for path in stale:
            path.write_text(wanted[path])
            print(f"rewrote the command-line reference in {path}")
        return 0
    for path in stale:
        print(
            f"{path}: the command-line reference is out of date; run {_REGENERATE}", file=sys.stderr
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
