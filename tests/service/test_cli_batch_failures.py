"""Batch lines that fail: reported, the batch goes on, and the exit status says so.

`finalize` and `retire` exit 3 when every line was handled but some failed
(bad lines, refused tickets), 0 with `--allow-bad-lines` for bad lines only;
a record nested too deep is one bad line, not the end of the batch; an
in-process retire verifies every ticket and needs `retire.key` to do so.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.captures import agent_rollout, record_for
from tests.support.logs import messages
from tests.support.servers import running_app
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.cli import main
from token_finalizer.settings import settings_from_mapping

RETIRE_KEY = "failures-test-retire-key-0123456789abcdef"


@pytest.fixture
def capture_root(tmp_path: Path) -> Path:
    """The capture directory of the `local` source."""
    path = tmp_path / "capture"
    path.mkdir()
    return path


def _config(capture_root: Path, *, retire_key: str | None = RETIRE_KEY) -> dict[str, Any]:
    config: dict[str, Any] = {"sources": {"local": {"kind": "file", "dir": str(capture_root)}}}
    if retire_key is not None:
        config["retire"] = {"key": retire_key}
    return config


def _write_config(path: Path, config: dict[str, Any]) -> str:
    path.write_text(json.dumps(config))
    return str(path)


@pytest.fixture
def server_url(capture_root: Path) -> Iterator[str]:
    """A live finalizer over the same capture directory and retire key."""
    with running_app(create_app(settings_from_mapping(_config(capture_root), env={}))) as base:
        yield base


@pytest.fixture(params=["config", "server"])
def target(request: pytest.FixtureRequest, tmp_path: Path, capture_root: Path) -> list[str]:
    """In this process (--config, with retire.key), or the live server."""
    if request.param == "config":
        return ["--config", _write_config(tmp_path / "finalizer.yaml", _config(capture_root))]
    return ["--server", request.getfixturevalue("server_url")]


def capture(capture_root: Path) -> str:
    """Record a fresh 3-call rollout in the `local` source; its id."""
    rollout_id = f"f-{uuid.uuid4().hex[:10]}"
    store = FileTokenStore(capture_root)

    async def put_all() -> None:
        for entry in agent_rollout(rollout_id, calls=3, new_tokens_per_turn=20):
            await store.put(entry)

    anyio.run(put_all)
    return rollout_id


def write_lines(path: Path, lines: list[Any]) -> Path:
    """JSON values (raw strings as they are), one a line."""
    path.write_text("".join((v if isinstance(v, str) else json.dumps(v)) + "\n" for v in lines))
    return path


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def nested(depth: int) -> str:
    """A record line whose `x` nests `depth` arrays deep."""
    return '{"_ng_rollout_id": "deep-1", "x": ' + "[" * depth + "]" * depth + "}"


# -- finalize ----------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [200, 1000, 100_000])
def test_a_record_nested_too_deep_is_one_bad_line(
    tmp_path: Path, capture_root: Path, target: list[str], depth: int
) -> None:
    """The deep record is reported and kept as an error line; the lines after it are finalized."""
    first, last = capture(capture_root), capture(capture_root)
    source = write_lines(
        tmp_path / "in.jsonl", [record_for(first), nested(depth), record_for(last)]
    )
    output = tmp_path / "out.jsonl"
    status = main(["finalize", str(source), "-o", str(output), *target])
    lines = read_lines(output)
    assert (status, [line.get("rollout_id", line.get("line")) for line in lines]) == (
        3,
        [first, 2, last],
    )
    assert "levels deep; at most 128 are accepted" in lines[1]["error"]


def test_a_deep_record_freezes_nothing(
    tmp_path: Path, capture_root: Path, target: list[str]
) -> None:
    """A refused deep record leaves its rollout's capture as it was: never frozen."""
    source = write_lines(tmp_path / "in.jsonl", [nested(500)])
    main(["finalize", str(source), "-o", str(tmp_path / "out.jsonl"), *target])
    assert stored_state(FileTokenStore(capture_root), "deep-1") is None


def test_allow_bad_lines_keeps_them_in_the_output_and_exits_0(
    tmp_path: Path, capture_root: Path, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """--allow-bad-lines: the bad line is still reported and written, and the exit status is 0."""
    source = write_lines(tmp_path / "in.jsonl", ["{not json", record_for(capture(capture_root))])
    output = tmp_path / "out.jsonl"
    status = main(["finalize", str(source), "-o", str(output), *target, "--allow-bad-lines"])
    assert (status, read_lines(output)[0]["line"]) == (0, 1)
    assert "line 1: not valid JSON" in messages(capsys.readouterr().err)


def test_a_finalize_answer_is_finalized_again(
    tmp_path: Path, capture_root: Path, target: list[str]
) -> None:
    """An answer fed back to finalize finalizes its record again: the same snapshot, unmasked."""
    rollout_id = capture(capture_root)
    first = write_lines(tmp_path / "in.jsonl", [record_for(rollout_id)])
    answers = tmp_path / "answers.jsonl"
    main(["finalize", str(first), "-o", str(answers), *target])
    output = tmp_path / "again.jsonl"
    assert main(["finalize", str(answers), "-o", str(output), *target]) == 0
    [before], [after] = read_lines(answers), read_lines(output)
    assert after["build"]["mask_sample"] is False
    assert after["retire"]["snapshot_id"] == before["retire"]["snapshot_id"]
    assert after["retire"]["version"] == before["retire"]["version"]


def test_integers_beyond_64_bits_come_back_exact(tmp_path: Path, capture_root: Path) -> None:
    """In this process a record field of 2**64 + 1 is written back exactly, as the service does."""
    target = ["--config", _write_config(tmp_path / "finalizer.yaml", _config(capture_root))]
    rollout_id = capture(capture_root)
    source = write_lines(tmp_path / "in.jsonl", [record_for(rollout_id, reward=2**64 + 1)])
    output = tmp_path / "out.jsonl"
    assert main(["finalize", str(source), "-o", str(output), *target]) == 0
    assert read_lines(output)[0]["record"]["reward"] == 2**64 + 1


def test_finalize_without_a_retire_key_warns_that_tickets_will_not_verify(
    tmp_path: Path, capture_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--config without retire.key: a warning says retire will refuse the tickets, and why."""
    config = _write_config(tmp_path / "nokey.yaml", _config(capture_root, retire_key=None))
    source = write_lines(tmp_path / "in.jsonl", [record_for(capture(capture_root))])
    main(["finalize", str(source), "-o", str(tmp_path / "out.jsonl"), "--config", config])
    assert "sets no retire.key" in messages(capsys.readouterr().err)


# -- retire ------------------------------------------------------------------------------


def _finalized(tmp_path: Path, capture_root: Path, target: list[str]) -> tuple[str, Path]:
    """One captured rollout finalized into OUT (under `tmp_path`); its id and OUT."""
    tmp_path.mkdir(exist_ok=True)
    rollout_id = capture(capture_root)
    source = write_lines(tmp_path / "in.jsonl", [record_for(rollout_id)])
    output = tmp_path / "out.jsonl"
    assert main(["finalize", str(source), "-o", str(output), *target]) == 0
    return rollout_id, output


def _forge(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer with an all-zero ticket (what an attacker who lacks the key can write)."""
    forged = json.loads(json.dumps(answer))
    forged["retire"]["ticket"] = "0" * 64
    return forged


def test_a_forged_ticket_is_refused_and_the_rest_retire(
    tmp_path: Path, capture_root: Path, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """An all-zero ticket retires nothing (exit 3, named on stderr); the genuine line retires."""
    forged_id, forged_out = _finalized(tmp_path / "a", capture_root, target)
    genuine_id, genuine_out = _finalized(tmp_path / "b", capture_root, target)
    mixed = write_lines(
        tmp_path / "mixed.jsonl",
        [_forge(read_lines(forged_out)[0]), read_lines(genuine_out)[0]],
    )
    status = main(["retire", str(mixed), *target])
    store = FileTokenStore(capture_root)
    assert (status, stored_state(store, forged_id).retired) == (3, False)
    assert stored_state(store, genuine_id).retired is True
    err = messages(capsys.readouterr().err)
    assert "line 1: ticket refused, nothing retired" in err
    assert (
        "retire: 1 ticket refused (signed with another retire.key, or edited): exit status 3\n"
        in err
    )


def test_allow_bad_lines_does_not_accept_a_refused_ticket(
    tmp_path: Path, capture_root: Path, target: list[str]
) -> None:
    """A refused ticket is a failure even with --allow-bad-lines."""
    _, output = _finalized(tmp_path, capture_root, target)
    forged = write_lines(tmp_path / "forged.jsonl", [_forge(read_lines(output)[0])])
    assert main(["retire", str(forged), *target, "--allow-bad-lines"]) == 3


def test_retire_with_allow_bad_lines_accepts_a_record_line(
    tmp_path: Path, capture_root: Path, target: list[str]
) -> None:
    """A record among the answers is a bad line: exit 3, or 0 with --allow-bad-lines."""
    rollout_id, output = _finalized(tmp_path, capture_root, target)
    with output.open("a") as handle:
        handle.write(json.dumps(record_for("stray")) + "\n")
    assert main(["retire", str(output), *target, "--allow-bad-lines"]) == 0
    assert stored_state(FileTokenStore(capture_root), rollout_id).retired is True


def test_retire_config_without_a_key_refuses_before_retiring(
    tmp_path: Path, capture_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """retire --config without retire.key: exit 2 saying how to set the key; a forged line stays."""
    keyed = _write_config(tmp_path / "keyed.yaml", _config(capture_root))
    rollout_id, output = _finalized(tmp_path, capture_root, ["--config", keyed])
    forged = write_lines(tmp_path / "forged.jsonl", [_forge(read_lines(output)[0])])
    capsys.readouterr()
    nokey = _write_config(tmp_path / "nokey.yaml", _config(capture_root, retire_key=None))
    status = main(["retire", str(forged), "--config", nokey])
    err = messages(capsys.readouterr().err)
    assert (status, err.count("\n")) == (2, 1)
    assert err.startswith(f"token-finalizer retire: {nokey} sets no retire.key, so no retire ")
    assert "set retire.key" in err and "--server URL" in err
    assert stored_state(FileTokenStore(capture_root), rollout_id).retired is False


def test_retire_config_with_another_key_refuses_every_ticket(
    tmp_path: Path, capture_root: Path
) -> None:
    """Tickets signed under one key are refused by a retire configured with another."""
    keyed = _write_config(tmp_path / "keyed.yaml", _config(capture_root))
    rollout_id, output = _finalized(tmp_path, capture_root, ["--config", keyed])
    other = _config(capture_root, retire_key="another-retire-key-0123456789abcdefgh")
    status = main(["retire", str(output), "--config", _write_config(tmp_path / "o.yaml", other)])
    assert (status, stored_state(FileTokenStore(capture_root), rollout_id).retired) == (3, False)
