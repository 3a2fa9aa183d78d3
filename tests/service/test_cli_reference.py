"""The command-line reference of README.md and docs/configuration.md is the parser's own.

Both regions are rendered from `build_parser()` (token_finalizer.cli.reference);
these tests fail as soon as an option is added, renamed or re-documented
without regenerating them (`python -m token_finalizer.cli.reference --write`).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from token_finalizer.cli import build_parser
from token_finalizer.cli.reference import (
    CONFIGURATION,
    README,
    commands,
    generated_files,
    main,
    reference,
    synopsis,
)

ROOT = Path(__file__).resolve().parents[2]


def _every_option(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """(command, first option string) of every documented option of every command."""
    return [
        (command.name, action.option_strings[0])
        for command in commands(parser)
        for action in command.parser._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    ]


def _store_serve(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return next(c.parser for c in commands(parser) if c.words == ("store", "serve"))


@pytest.mark.parametrize("path", [README, CONFIGURATION], ids=str)
def test_committed_reference_matches_the_parser(path: Path) -> None:
    """The generated region of the file is exactly what the parser renders today."""
    wanted = generated_files(ROOT)[ROOT / path]
    assert (ROOT / path).read_text() == wanted, (
        f"{path} is out of date: run python -m token_finalizer.cli.reference --write"
    )


def test_every_option_of_every_command_is_documented() -> None:
    """Each option appears in the README synopsis and in its command's reference section."""
    parser = build_parser()
    lines, sections = synopsis(parser), reference(parser).split("\n### ")
    for name, option in _every_option(parser):
        section = next(s for s in sections if s.removeprefix("### ").startswith(name + "\n"))
        assert f"| `{option}" in section, (name, option)
        assert option in lines, (name, option)


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("token-finalizer store sweep", "--redis"),
        ("token-finalizer store sweep", "--key-prefix"),
        ("token-finalizer store sweep", "--empty-older-than"),
        ("token-finalizer store inspect", "--key-prefix"),
        ("token-finalizer store delete", "--key-prefix"),
        ("token-finalizer store serve", "--retired-ttl"),
        ("token-finalizer store serve", "--abandoned-ttl"),
        ("token-finalizer finalize", "--allow-bad-lines"),
        ("token-finalizer retire", "--allow-bad-lines"),
    ],
)
def test_options_the_summaries_used_to_miss_are_in_the_docs(command: str, option: str) -> None:
    """The options newcomers could not find in the old hand-written summaries are there now."""
    text = (ROOT / CONFIGURATION).read_text()
    section = text.split(f"### {command}\n", 1)[1].split("\n### ", 1)[0]
    assert f"| `{option}" in section


def test_a_new_option_shows_up_in_both_regions() -> None:
    """An option added to a command is rendered, so the committed text then drifts."""
    parser = build_parser()
    _store_serve(parser).add_argument("--shiny", metavar="N", help="a brand new knob")
    assert "[--shiny N]" in synopsis(parser)
    assert "| `--shiny N` | a brand new knob |" in reference(parser)
    assert generated_files(ROOT, parser)[ROOT / CONFIGURATION] != (ROOT / CONFIGURATION).read_text()


def test_a_pipe_in_help_text_does_not_break_the_table() -> None:
    """`|` inside a help text is escaped in the markdown table."""
    parser = build_parser()
    _store_serve(parser).add_argument("--mode", help="a | b")
    assert "| `--mode MODE` | a \\| b |" in reference(parser)


def test_check_fails_on_a_stale_copy_and_write_repairs_it(tmp_path: Path) -> None:
    """--check exits 1 on stale text; --write rewrites only the region, then --check exits 0."""
    for path in (README, CONFIGURATION):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    stale = (tmp_path / README).read_text().replace("[--dry-run]", "[--dry-run-old]")
    (tmp_path / README).write_text(stale)
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert main(["--write", "--root", str(tmp_path)]) == 0
    assert main(["--check", "--root", str(tmp_path)]) == 0
    assert (tmp_path / README).read_text() == (ROOT / README).read_text()
