"""Every log line of every command is one JSON object (docs/configuration.md#logs).

Each command of `token-finalizer` runs as a real process, in a case made to
say something: start-up warnings, argument errors (argparse's and those found
after parsing), a bad log level, the batch commands' line reports and
summaries, retries, the admin commands' refusals. Which streams are logs:

- the servers (`serve`, `store serve`, with `--workers 2` too): stderr and
  stdout both (stdout holds the request lines); every line is read;
- every other command: stderr. Its stdout is the command's data, not a log:
  `store inspect`'s JSON report, `store sweep`'s list of removals and its
  summary, `completion bash`'s script, `--version`, `--help`; `finalize`
  writes its answers to `-o`. `store delete`'s question on a terminal is a
  prompt, asked only when stdin is one (never here).

`test_every_command_has_a_case` keeps the table complete: a new command
without a case fails it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.captures import make_entry, record_for
from tests.support.logs import log_lines
from tests.support.servers import free_port, running_process
from token_finalizer.cli import build_parser
from token_finalizer.cli.reference import commands
from token_finalizer.sources.file import FileTokenStore

# The keys every line has (docs/configuration.md#logs).
KEYS = {"ts", "level", "logger", "message"}
RETIRE_KEY = "k" * 40
CLI = (sys.executable, "-m", "token_finalizer.cli")


@dataclass(frozen=True)
class Case:
    """One run of a command: its arguments, and words one of its log lines must hold."""

    words: tuple[str, ...]
    args: tuple[str, ...]
    said: str
    env: dict[str, str] = field(default_factory=dict)


def _config(where: Path, *, key: bool) -> Path:
    path = where / ("keyed.yaml" if key else "plain.yaml")
    retire = f'retire:\n  key: "{RETIRE_KEY}"\n' if key else ""
    path.write_text(f"sources:\n  local: {{kind: file, dir: '{where / 'capture'}'}}\n{retire}")
    return path


def _prepared(where: Path) -> None:
    """A capture directory with one captured rollout, a batch input naming it (and another
    rollout, and a bad line), and that input finalized into out.jsonl."""
    capture = where / "capture"
    capture.mkdir()
    asyncio.run(FileTokenStore(capture).put(make_entry("r-logs", "c1", [1, 2, 3], [4, 5])))
    lines = [record_for("r-logs"), record_for("r-missing")]
    body = b"".join(orjson.dumps(line) + b"\n" for line in lines) + b"not json\n"
    (where / "in.jsonl").write_bytes(body)
    _config(where, key=False)
    keyed = _config(where, key=True)
    # The finalize output the retire cases read.
    subprocess.run(
        [
            *CLI,
            "finalize",
            "in.jsonl",
            "-o",
            "out.jsonl",
            "--config",
            str(keyed),
            "--allow-bad-lines",
        ],
        cwd=where,
        capture_output=True,
        timeout=90,
        check=True,
    )


# Commands that exit by themselves: (id, case). Paths are relative to the work directory.
ONE_SHOT: list[tuple[str, Case]] = [
    ("argparse-error", Case(("finalize",), ("finalize", "in.jsonl"), "arguments are required")),
    ("unknown-command", Case((), ("frobnicate",), "invalid choice")),
    (
        "bad-log-level",
        Case(
            ("completion",),
            ("completion", "bash"),
            "is not a log level",
            {"TOKEN_FINALIZER_LOG_LEVEL": "loud"},
        ),
    ),
    (
        "finalize-report",
        Case(
            ("finalize",),
            (
                "finalize",
                "in.jsonl",
                "-o",
                "report.jsonl",
                "--config",
                "keyed.yaml",
                "--allow-bad-lines",
            ),
            "finalize: 3 lines -> report.jsonl",
        ),
    ),
    (
        "finalize-warning",
        Case(
            ("finalize",),
            ("finalize", "in.jsonl", "-o", "unkeyed.jsonl", "--config", "plain.yaml"),
            "sets no retire.key",
        ),
    ),
    (
        "finalize-missing-input",
        Case(
            ("finalize",),
            ("finalize", "absent.jsonl", "-o", "x.jsonl", "--config", "keyed.yaml"),
            "cannot read",
        ),
    ),
    (
        "retire-report",
        Case(
            ("retire",),
            ("retire", "out.jsonl", "--config", "keyed.yaml"),
            "retire: 3 lines: 1 retired",
        ),
    ),
    (
        "retire-no-key",
        Case(("retire",), ("retire", "out.jsonl", "--config", "plain.yaml"), "no retire.key"),
    ),
    (
        "retries",
        Case(
            ("retire",),
            ("retire", "out.jsonl", "--server", "http://127.0.0.1:{port}"),
            "retrying in",
        ),
    ),
    (
        "serve-bad-config",
        Case(("serve",), ("serve", "--config", "absent.yaml"), "cannot read configuration"),
    ),
    (
        "inspect-nothing",
        Case(
            ("store", "inspect"),
            ("store", "inspect", "--dir", "capture", "r-none"),
            "nothing stored",
        ),
    ),
    (
        "delete-no-terminal",
        Case(
            ("store", "delete"),
            ("store", "delete", "--dir", "capture", "r-logs"),
            "stdin is not a terminal",
        ),
    ),
    (
        "delete-done",
        Case(
            ("store", "delete"),
            ("store", "delete", "--dir", "capture", "r-gone", "--yes"),
            "nothing stored",
        ),
    ),
    (
        "sweep-no-directory",
        Case(
            ("store", "sweep"),
            ("store", "sweep", "--dir", "absent", "--retired-older-than", "1h"),
            "not a directory",
        ),
    ),
    (
        "store-serve-bad-arguments",
        Case(
            ("store", "serve"),
            ("store", "serve", "--dir", "capture", "--token", ""),
            "--token is empty",
        ),
    ),
]

# Servers: (id, case). Each is asked for /health and /metrics, then stopped.
SERVERS: list[tuple[str, Case]] = [
    (
        "serve",
        Case(("serve",), ("serve", "--config", "plain.yaml"), "retire.key is not configured"),
    ),
    (
        "serve-workers",
        Case(("serve",), ("serve", "--config", "plain.yaml", "--workers", "2"), "retire.key"),
    ),
    (
        "store-serve-shared-token",
        Case(
            ("store", "serve"),
            ("store", "serve", "--dir", "capture", "--token", "t"),
            "valid for every role",
        ),
    ),
    (
        "store-serve-roles",
        Case(
            ("store", "serve"),
            ("store", "serve", "--dir", "capture", "--writer-token", "t", "--finalizer-token", "t"),
            "no control token",
        ),
    ),
    (
        "store-serve-workers",
        Case(
            ("store", "serve"),
            ("store", "serve", "--dir", "capture", "--token", "t", "--workers", "2"),
            "every role",
        ),
    ),
]


# The work directory's files a server's arguments name (a server starts in the test's
# own directory).
_FILES = frozenset({"plain.yaml", "capture"})


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The work directory every command runs in, prepared once (finalize before retire)."""
    where = tmp_path_factory.mktemp("logs")
    _prepared(where)
    return where


def _run(work: Path, case: Case) -> subprocess.CompletedProcess[str]:
    args = [arg.replace("{port}", str(free_port())) for arg in case.args]
    return subprocess.run(
        [*CLI, *args],
        cwd=work,
        env={**os.environ, **case.env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def _check(text: str, said: str) -> list[dict[str, Any]]:
    """Every line parsed as a JSON log line (fails on one that is not); one holds `said`."""
    lines = log_lines(text)
    assert [line for line in lines if not set(line) >= KEYS] == []
    assert any(said in line["message"] for line in lines), text
    return lines


@pytest.mark.parametrize("case", [case for _, case in ONE_SHOT], ids=[name for name, _ in ONE_SHOT])
def test_every_line_on_stderr_is_json(work: Path, case: Case) -> None:
    """A command's stderr holds JSON log lines only, the one that says what happened among them."""
    done = _run(work, case)
    _check(done.stderr, case.said)


def _server_output(work: Path, case: Case) -> str:
    port = free_port()
    log = work / f"server-{port}.log"
    args = [str(work / arg) if arg in _FILES else arg for arg in case.args]
    with running_process([*args, "--port", str(port)], port=port, log=log):
        base = f"http://127.0.0.1:{port}"
        httpx.get(base + "/metrics", headers={"Authorization": "Bearer t"}, timeout=10)
        httpx.get(base + "/no/such/route", timeout=10)
    return log.read_text()


@pytest.mark.parametrize("case", [case for _, case in SERVERS], ids=[name for name, _ in SERVERS])
def test_every_line_a_server_writes_is_json(work: Path, case: Case) -> None:
    """A server's stderr and stdout (request lines) hold JSON log lines only, warnings included."""
    _check(_server_output(work, case), case.said)


def test_data_on_stdout_is_not_logged_as_lines(work: Path) -> None:
    """`store inspect` prints its JSON report on stdout and says nothing else there."""
    done = _run(
        work, Case(("store", "inspect"), ("store", "inspect", "--dir", "capture", "r-logs"), "")
    )
    assert done.returncode == 0, done.stderr
    assert '"found": true' in done.stdout
    assert done.stderr == ""


def _covered() -> set[tuple[str, ...]]:
    return {case.words for _, case in [*ONE_SHOT, *SERVERS]}


def test_every_command_has_a_case() -> None:
    """Each runnable command of the parser is run by at least one case above."""
    runnable = {command.words for command in commands(build_parser())}
    assert runnable - _covered() == set()
