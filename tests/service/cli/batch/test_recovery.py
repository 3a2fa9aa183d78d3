"""The one-command recovery of tickets that no longer verify (docs/finalizer-api.md#post-retire).

Without `retire.key` each finalizer process signs with a random key of its
own: after a restart, `retire OUT` refuses every ticket. Finalizing OUT again
(finalize takes its own answers) answers the same snapshots with tickets the
new process signs, and retiring that output retires them.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.captures import agent_rollout, record_for
from tests.support.servers import running_app
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.cli import main
from token_finalizer.settings import settings_from_mapping


def _capture(root: Path) -> str:
    """A fresh 3-call rollout written into `root`; its id."""
    rollout_id = f"r-{uuid.uuid4().hex[:10]}"
    store = FileTokenStore(root)

    async def put_all() -> None:
        for entry in agent_rollout(rollout_id, calls=3, new_tokens_per_turn=20):
            await store.put(entry)

    anyio.run(put_all)
    return rollout_id


def _app(root: Path) -> Any:
    """A finalizer over `root` without retire.key: its tickets die with it."""
    config = {"sources": {"local": {"kind": "file", "dir": str(root)}}}
    return create_app(settings_from_mapping(config, env={}))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def restarted(tmp_path: Path) -> tuple[Path, Path]:
    """Two rollouts and a bad line finalized by a server that has since stopped, into OUT.

    Returns the capture directory and OUT.
    """
    root = tmp_path / "capture"
    root.mkdir()
    records = [record_for(_capture(root)), record_for(_capture(root))]
    source = tmp_path / "in.jsonl"
    source.write_text(f"{json.dumps(records[0])}\nnot json\n{json.dumps(records[1])}\n")
    out = tmp_path / "out.jsonl"
    with running_app(_app(root)) as first:
        main(["finalize", str(source), "-o", str(out), "--server", first, "--allow-bad-lines"])
    return root, out


def test_retire_after_a_restart_says_to_finalize_again(
    tmp_path: Path, restarted: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused tickets end with the two commands that recover them, this file named."""
    root, out = restarted
    capsys.readouterr()
    with running_app(_app(root)) as second:
        assert main(["retire", str(out), "--server", second]) == 3
    again = tmp_path / "out.again.jsonl"
    err = capsys.readouterr().err
    assert f"`token-finalizer finalize {out} -o {again}`" in err
    assert f"`token-finalizer retire {again}`" in err


def test_finalizing_the_output_again_then_retiring_it_retires_every_capture(
    tmp_path: Path, restarted: tuple[Path, Path]
) -> None:
    """The commands the refusal names retire every capture the first output finalized."""
    root, out = restarted
    again = tmp_path / "out.again.jsonl"
    with running_app(_app(root)) as second:
        assert main(["finalize", str(out), "-o", str(again), "--server", second]) == 0
        assert main(["retire", str(again), "--server", second]) == 0
    store = FileTokenStore(root)
    ids = [line["record"]["_ng_rollout_id"] for line in _lines(again) if "record" in line]
    assert len(ids) == 2 and all(stored_state(store, i).retired for i in ids)


def test_report_lines_are_kept_as_they_are_and_not_finalized(
    tmp_path: Path, restarted: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """An earlier report line is copied through unchanged, counted as kept, not as a bad line."""
    root, out = restarted
    again = tmp_path / "out.again.jsonl"
    capsys.readouterr()
    with running_app(_app(root)) as second:
        assert main(["finalize", str(out), "-o", str(again), "--server", second]) == 0
    assert _lines(again)[1] == _lines(out)[1] == {"line": 2, "error": _lines(out)[1]["error"]}
    assert (
        "2 finalized (2 retirable), 0 masked, 0 no build, 0 bad lines, 1 earlier report line kept"
        in capsys.readouterr().err
    )
