"""The `token-finalizer` command itself: --version, and arguments that cannot work."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

import token_finalizer
from tests.support.logs import log_lines
from token_finalizer.cli import main


def test_version_prints_the_installed_version() -> None:
    """`token-finalizer --version` prints the distribution's version on stdout and exits 0."""
    result = subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    expected = f"token-finalizer {importlib.metadata.version('token-finalizer')}\n"
    assert (result.returncode, result.stdout, result.stderr) == (0, expected, "")


def test_version_falls_back_to_the_package_version(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without installed metadata (a bare source tree), the package's __version__ is printed."""

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert (exit_info.value.code, capsys.readouterr().out) == (
        0,
        f"token-finalizer {token_finalizer.__version__}\n",
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["finalize", "in.jsonl"],
            "token-finalizer finalize: the following arguments are required",
        ),
        (
            ["retire", "out.jsonl", "--server", "http://x", "--concurrency", "0"],
            "token-finalizer retire: argument --concurrency: must be at least 1, got 0",
        ),
        (["serve", "--port", "eighty"], "token-finalizer serve: argument --port: invalid int"),
        (["frobnicate"], "token-finalizer: argument COMMAND: invalid choice: 'frobnicate'"),
        ([], "token-finalizer: the following arguments are required: COMMAND"),
    ],
)
def test_argument_errors_are_one_line_and_exit_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad argument exits 2 with one JSON error line naming it and pointing at --help."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    (line,) = log_lines(capsys.readouterr().err)
    assert (exit_info.value.code, line["level"], line["message"].startswith(said)) == (
        2,
        "error",
        True,
    ), line
    assert line["message"].endswith("--help)")
