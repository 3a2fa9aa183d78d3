"""Hostile and careless configurations given to a real `token-finalizer serve`.

Each must stop the command with exit status 2 and exactly one line on stderr
naming the problem, before any port opens: no traceback, no minutes spent
expanding aliases, no service running with less protection than its file says.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.logs import messages
from tests.support.servers import free_port

# A hang guard only: each case is refused in well under a second.
GUARD_S = 120
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n"
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
)
REDIS_SOURCE = (
    "sources:\n  r: {kind: redis, url: 'redis://127.0.0.1:6379/0', retired_ttl_s: .inf}\n"
)


def _serve(config: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = ["serve", "--config", str(config), "--port", str(free_port())]
    return subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", *command],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("x: " + "[" * 20_000 + "]" * 20_000 + "\n", "nests deeper than 64", id="deep"),
        pytest.param(ALIAS_BOMB, "more than 100000 values", id="alias-bomb"),
        pytest.param(REDIS_SOURCE, "sources.r.retired_ttl_s", id="infinite-ttl"),
        pytest.param("auth: {bearer_tokens: [t1]}\nauth: {}\n", "'auth' appears twice", id="dup"),
        pytest.param("retire: {key: k7}\n", "retire.key: holds 2 bytes", id="short-retire-key"),
    ],
)
def test_hostile_file_exits_2_with_one_line_naming_the_problem(
    tmp_path: Path, text: str, problem: str
) -> None:
    """Refused before serving: status 2, one stderr line, the problem named, nothing on stdout."""
    config = tmp_path / "finalizer.yaml"
    config.write_text(text)
    result = _serve(config)
    lines = messages(result.stderr).splitlines()
    assert (result.returncode, len(lines), result.stdout) == (2, 1, "")
    assert lines[0].startswith("token-finalizer serve: ") and problem in lines[0]


def test_an_override_switching_auth_off_exits_2_naming_the_variable(tmp_path: Path) -> None:
    """A file with tokens and `TOKEN_FINALIZER__AUTH__BEARER_TOKENS='[]'`: not served open."""
    config = tmp_path / "finalizer.yaml"
    config.write_text(
        f"sources:\n  local: {{kind: file, dir: '{tmp_path}'}}\nauth:\n  bearer_tokens: [t1]\n"
    )
    result = _serve(config, {"TOKEN_FINALIZER__AUTH__BEARER_TOKENS": "[]"})
    lines = result.stderr.splitlines()
    assert (result.returncode, len(lines)) == (2, 1)
    assert "TOKEN_FINALIZER__AUTH__BEARER_TOKENS switches off the auth.bearer_tokens" in lines[0]
