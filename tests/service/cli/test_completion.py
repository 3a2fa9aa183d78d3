"""`token-finalizer completion bash`: the script completes commands and options in a real bash."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from token_finalizer.cli import build_parser
from token_finalizer.cli.completion import completion_words


def _complete(tmp_path: Path, line: str) -> list[str]:
    """What bash offers for the last word of `line`, with the generated script loaded."""
    generated = subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", "completion", "bash"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    words = shlex.split(line) + ([""] if line.endswith(" ") else [])
    program = (
        f"{generated}\nCOMP_WORDS=({' '.join(shlex.quote(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n_token_finalizer\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    )
    result = subprocess.run(
        ["bash", "--norc", "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return [word for word in result.stdout.splitlines() if word]


@pytest.mark.parametrize(
    ("line", "offered"),
    [
        ("token-finalizer st", ["store"]),
        ("token-finalizer store s", ["serve", "sweep"]),
        ("token-finalizer finalize --co", ["--concurrency", "--config"]),
        ("token-finalizer store sweep --retired", ["--retired-older-than"]),
        ("token-finalizer completion ", ["bash", "--help"]),
    ],
)
def test_bash_completes_commands_and_options(tmp_path: Path, line: str, offered: list[str]) -> None:
    """In an empty directory, bash offers exactly the commands or options that fit the word."""
    assert _complete(tmp_path, line) == offered


def test_bash_completes_file_names_for_other_words(tmp_path: Path) -> None:
    """A word that is no option completes as a file name (a batch command's JSONL)."""
    (tmp_path / "records.jsonl").write_text("")
    assert _complete(tmp_path, "token-finalizer finalize rec") == ["records.jsonl"]


def test_every_long_option_of_every_command_is_completed() -> None:
    """The script's words come from the parser: each command's every long option is there."""
    words = dict(completion_words(build_parser()))
    assert "--drain-seconds" in words["serve"] and "--writer-token" in words["store serve"]
    assert {"serve", "store", "finalize", "retire", "completion"} <= set(words[""])
