"""`token-finalizer finalize` / `retire`: offline batches, in-process (--config) and via a server.

The round trip: a JSONL of records (with bad lines among them) is finalized
into OUT, one answer line per input line in input order, then OUT is retired
and the file store shows each consumed capture retired.
"""

from __future__ import annotations

import errno
import io
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from tests.support.captures import agent_rollout, record_for
from tests.support.logs import messages
from tests.support.servers import running_app
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.cli import main
from token_finalizer.settings import settings_from_mapping

TOKEN = "batch-test-token"
# The key both targets sign and verify retire tickets with (at least 32 bytes).
RETIRE_KEY = "batch-test-retire-key-0123456789abcdef"


@pytest.fixture(scope="module")
def store_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Capture directories of the two configured sources, `local` (default) and `other`."""
    root = tmp_path_factory.mktemp("batch")
    dirs = {"local": root / "local", "other": root / "other"}
    for path in dirs.values():
        path.mkdir()
    return dirs


def _config(store_dirs: dict[str, Path], **sections: Any) -> dict[str, Any]:
    sources = {name: {"kind": "file", "dir": str(path)} for name, path in store_dirs.items()}
    return {"sources": {"default": "local", **sources}, "retire": {"key": RETIRE_KEY}, **sections}


@pytest.fixture(scope="module")
def config_path(store_dirs: dict[str, Path]) -> Path:
    """A YAML configuration naming both sources (JSON is valid YAML)."""
    path = store_dirs["local"].parent / "finalizer.yaml"
    path.write_text(json.dumps(_config(store_dirs)))
    return path


@pytest.fixture(scope="module")
def server_url(store_dirs: dict[str, Path]) -> Iterator[str]:
    """A live finalizer over the same sources, with a bearer token and a 64 kB body limit."""
    settings = settings_from_mapping(
        _config(store_dirs, auth={"bearer_tokens": [TOKEN]}, limits={"max_body_bytes": 65536}),
        env={},
    )
    with running_app(create_app(settings)) as base:
        yield base


@pytest.fixture
def local_store(store_dirs: dict[str, Path]) -> FileTokenStore:
    """The `local` source, opened as a store."""
    return FileTokenStore(store_dirs["local"])


def capture(store: FileTokenStore, calls: int = 3) -> tuple[str, list[dict[str, Any]]]:
    """Record a fresh rollout; return its id and entries."""
    rollout_id = f"b-{uuid.uuid4().hex[:10]}"
    entries = agent_rollout(rollout_id, calls=calls, new_tokens_per_turn=40)

    async def put_all() -> None:
        for entry in entries:
            await store.put(entry)

    anyio.run(put_all)
    return rollout_id, entries


def write_jsonl(path: Path, lines: list[Any]) -> Path:
    """Write JSON values (and raw strings as they are), one per line."""
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file, parsed."""
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(params=["config", "server"])
def target(request: pytest.FixtureRequest, config_path: Path) -> list[str]:
    """The target options of a batch command: in-process, or the live server."""
    if request.param == "config":
        return ["--config", str(config_path)]
    return ["--server", request.getfixturevalue("server_url"), "--token", TOKEN]


class Batch:
    """One input file with captured, uncaptured and bad lines, and the run of it."""

    def __init__(self, tmp_path: Path, store: FileTokenStore) -> None:
        self.first, self.first_entries = capture(store)
        self.second, _ = capture(store)
        self.missing = f"never-{uuid.uuid4().hex[:8]}"
        self.input = write_jsonl(
            tmp_path / "in.jsonl",
            [
                record_for(self.first),
                "{not json",
                record_for(self.second),
                [1, 2],
                record_for(self.missing),
                "",
                {"reward": 0.0},
            ],
        )
        self.output = tmp_path / "out.jsonl"


@pytest.fixture
def batch(tmp_path: Path, local_store: FileTokenStore) -> Batch:
    """A fresh batch input in the `local` source."""
    return Batch(tmp_path, local_store)


def finalize(batch: Batch, target: list[str], *extra: str) -> int:
    """Run `token-finalizer finalize` on the batch; the exit status."""
    return main(["finalize", str(batch.input), "-o", str(batch.output), *target, *extra])


def test_finalize_writes_one_line_per_input_line_in_order(batch: Batch, target: list[str]) -> None:
    """OUT holds the answers and the bad lines' errors, each at its input line's place."""
    assert finalize(batch, target, "--allow-bad-lines") == 0
    lines = read_jsonl(batch.output)
    assert [line.get("rollout_id", line.get("line")) for line in lines] == [
        batch.first,
        2,
        batch.second,
        4,
        batch.missing,
        6,
        None,
    ]


def test_bad_lines_make_the_exit_status_3(
    batch: Batch, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --allow-bad-lines a batch with bad lines goes through every line, then exits 3."""
    assert finalize(batch, target) == 3
    assert len(read_jsonl(batch.output)) == 7
    assert messages(capsys.readouterr().err).endswith(
        f"finalize: 3 bad lines (reported above, error lines in {batch.output}): "
        "exit status 3; --allow-bad-lines accepts them\n"
    )


def test_a_batch_without_bad_lines_exits_0(
    tmp_path: Path, target: list[str], local_store: FileTokenStore
) -> None:
    """Captured and masked records alike are no failure: exit 0."""
    rollout_id, _ = capture(local_store)
    batch_input = write_jsonl(tmp_path / "in.jsonl", [record_for(rollout_id), record_for("gone")])
    output = tmp_path / "out.jsonl"
    assert main(["finalize", str(batch_input), "-o", str(output), *target]) == 0


def test_bad_lines_are_written_as_line_errors(batch: Batch, target: list[str]) -> None:
    """A line that is not a JSON object becomes {"line": N, "error": ...} naming the problem."""
    finalize(batch, target)
    lines = read_jsonl(batch.output)
    assert lines[1]["error"].startswith("not valid JSON")
    assert lines[3] == {"line": 4, "error": "not a JSON object (got an array)"}
    assert lines[5] == {"line": 6, "error": "empty line; expected a JSON object"}


def test_bad_lines_are_reported_on_stderr_with_their_number(
    batch: Batch, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """stderr names each bad line by its number, and draws no progress bar off a terminal."""
    finalize(batch, target)
    err = messages(capsys.readouterr().err)
    assert "line 2: not valid JSON" in err
    assert "line 4: not a JSON object (got an array)" in err
    assert "\r" not in err


def test_summary_counts_outcomes_and_mask_reasons(
    batch: Batch, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary counts finalized, masked by reason, no build and bad lines."""
    finalize(batch, target)
    assert (
        f"7 lines -> {batch.output}: 2 finalized (2 retirable), 2 masked "
        "(empty_capture: 1, no_capture_key: 1), 0 no build, 3 bad lines"
    ) in messages(capsys.readouterr().err)


def test_output_carries_the_exact_captured_tokens(batch: Batch, target: list[str]) -> None:
    """The rebuilt record in OUT ends with the last captured call's generated tokens."""
    finalize(batch, target)
    record = read_jsonl(batch.output)[0]["record"]
    last = record["response"]["output"][-1]
    assert last["generation_token_ids"] == batch.first_entries[-1]["generation_token_ids"]


def test_retire_drops_every_retirable_capture(
    batch: Batch, target: list[str], local_store: FileTokenStore
) -> None:
    """After finalize then retire, both captured rollouts are retired in the store."""
    finalize(batch, target)
    assert main(["retire", str(batch.output), *target]) == 0
    assert stored_state(local_store, batch.first).retired is True
    assert stored_state(local_store, batch.second).retired is True


def test_retire_keeps_masked_captures_as_evidence(
    batch: Batch, target: list[str], local_store: FileTokenStore
) -> None:
    """The masked rollout's frozen state is not retired."""
    finalize(batch, target)
    main(["retire", str(batch.output), *target])
    assert stored_state(local_store, batch.missing).retired is False


def test_retire_summary_counts_each_kind_of_line(
    batch: Batch, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """retire reports retired, not retired, not retirable and error lines."""
    finalize(batch, target)
    capsys.readouterr()
    main(["retire", str(batch.output), *target])
    assert (
        "retire: 7 lines: 2 retired, 0 not retired (the store moved on), 2 not retirable, "
        "3 error lines, 0 bad, 0 tickets refused"
    ) in messages(capsys.readouterr().err)


def test_source_option_finalizes_in_that_source(
    tmp_path: Path, target: list[str], store_dirs: dict[str, Path]
) -> None:
    """--source NAME freezes in NAME and OUT names it as each line's source."""
    rollout_id, _ = capture(FileTokenStore(store_dirs["other"]))
    batch_input = write_jsonl(tmp_path / "in.jsonl", [record_for(rollout_id)])
    output = tmp_path / "out.jsonl"
    main(["finalize", str(batch_input), "-o", str(output), *target, "--source", "other"])
    assert [(line["source"], line["retirable"]) for line in read_jsonl(output)] == [("other", True)]


def test_agent_that_takes_no_part_gets_no_build(
    tmp_path: Path, store_dirs: dict[str, Path], local_store: FileTokenStore
) -> None:
    """With all_agents off, a record of an unlisted agent is written with `build: null`."""
    config = tmp_path / "agents.yaml"
    config.write_text(
        json.dumps(_config(store_dirs, token_id_capture={"all_agents": False, "agents": ["x"]}))
    )
    rollout_id, _ = capture(local_store)
    batch_input = write_jsonl(tmp_path / "in.jsonl", [record_for(rollout_id)])
    output = tmp_path / "out.jsonl"
    main(["finalize", str(batch_input), "-o", str(output), "--config", str(config)])
    assert read_jsonl(output)[0]["build"] is None


def test_record_over_the_body_limit_is_a_line_error(tmp_path: Path, server_url: str) -> None:
    """A record the server refuses as too large becomes an error line; the rest go on."""
    batch_input = write_jsonl(
        tmp_path / "in.jsonl",
        [record_for("absent-1", padding="x" * 70_000), record_for("absent-2")],
    )
    output = tmp_path / "out.jsonl"
    status = main(
        ["finalize", str(batch_input), "-o", str(output), "--server", server_url, "--token", TOKEN]
    )
    lines = read_jsonl(output)
    assert (status, lines[0]["line"], lines[1]["rollout_id"]) == (3, 1, "absent-2")
    assert "HTTP 413" in lines[0]["error"]


def test_mask_fraction_guard_stops_an_in_process_batch(
    tmp_path: Path, store_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--config applies the service's guard to --run-id: a tripped run stops with status 1."""
    config = tmp_path / "guarded.yaml"
    guard = {"max_mask_fraction": 0.0, "mask_fraction_min_samples": 1}
    config.write_text(json.dumps(_config(store_dirs, token_id_capture=guard)))
    batch_input = write_jsonl(
        tmp_path / "in.jsonl", [record_for("absent-1"), record_for("absent-2")]
    )
    output = tmp_path / "out.jsonl"
    status = main(
        ["finalize", str(batch_input), "-o", str(output), "--config", str(config), "--run-id", "r9"]
    )
    assert status == 1
    assert "finalize: stopped at line 1: run 'r9' masked" in messages(capsys.readouterr().err)


def test_wrong_token_stops_the_batch(
    batch: Batch, server_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A refusal every line would meet stops at line 1 with status 1 and an empty OUT."""
    status = finalize(batch, ["--server", server_url, "--token", "wrong"])
    assert (status, batch.output.read_text()) == (1, "")
    err = messages(capsys.readouterr().err)
    assert "finalize: stopped at line 1: HTTP 401: wrong bearer token" in err


def test_token_without_server_is_a_usage_error(
    batch: Batch, config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--token with --config exits 2 and says that --token needs --server."""
    status = finalize(batch, ["--config", str(config_path), "--token", "t"])
    assert status == 2
    assert "--token applies only with --server" in messages(capsys.readouterr().err)


def test_output_may_not_overwrite_the_input(
    batch: Batch, config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Naming the input as the output exits 2 and leaves the input intact."""
    before = batch.input.read_text()
    status = main(
        ["finalize", str(batch.input), "-o", str(batch.input), "--config", str(config_path)]
    )
    assert (status, batch.input.read_text()) == (2, before)
    assert messages(capsys.readouterr().err) == (
        f"token-finalizer finalize: cannot write {batch.input}: it is the input file\n"
    )


def test_missing_input_is_a_usage_error(
    tmp_path: Path, config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An input path that is not a file exits 2 naming it, in one line."""
    missing = tmp_path / "nope.jsonl"
    status = main(
        ["finalize", str(missing), "-o", str(tmp_path / "o"), "--config", str(config_path)]
    )
    assert (status, messages(capsys.readouterr().err)) == (
        2,
        f"token-finalizer finalize: cannot read {missing}: no such file\n",
    )


def test_invalid_configuration_is_a_usage_error(
    batch: Batch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A configuration that does not validate exits 2 with the key named."""
    config = tmp_path / "bad.yaml"
    config.write_text("sources: {local: {kind: file}}\n")
    assert finalize(batch, ["--config", str(config)]) == 2
    assert "a file source needs `dir`" in messages(capsys.readouterr().err)


def test_console_command_round_trip(
    batch: Batch, config_path: Path, local_store: FileTokenStore
) -> None:
    """`python -m token_finalizer.cli finalize` then `retire` work as separate processes."""
    command = [sys.executable, "-m", "token_finalizer.cli"]
    target = ["--config", str(config_path)]
    files = [str(batch.input), "-o", str(batch.output)]
    subprocess.run(
        [*command, "finalize", *files, *target, "--allow-bad-lines"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        [*command, "retire", str(batch.output), *target],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert stored_state(local_store, batch.first).retired is True


# -- paths and arguments that cannot work: exit 2, one line on stderr -----------


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    """stderr, which must be exactly one line; that line without its end."""
    err = messages(capsys.readouterr().err)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err.rstrip("\n")


def test_output_in_a_missing_directory_is_one_line_and_exit_2(
    batch: Batch, config_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o into a directory that does not exist: exit 2, one line naming the path, no file."""
    output = tmp_path / "no" / "such" / "dir" / "x.jsonl"
    status = main(["finalize", str(batch.input), "-o", str(output), "--config", str(config_path)])
    assert (status, _one_line_error(capsys), output.parent.exists()) == (
        2,
        f"token-finalizer finalize: cannot write {output}: directory does not exist",
        False,
    )


def test_output_that_is_a_directory_is_one_line_and_exit_2(
    batch: Batch, config_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o naming a directory: exit 2, one line."""
    status = main(["finalize", str(batch.input), "-o", str(tmp_path), "--config", str(config_path)])
    assert (status, _one_line_error(capsys)) == (
        2,
        f"token-finalizer finalize: cannot write {tmp_path}: it is a directory",
    )


def test_output_under_a_file_is_one_line_and_exit_2(
    batch: Batch, config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-o below a path that is a file, not a directory: exit 2, one line naming that file."""
    output = batch.input / "x.jsonl"
    status = main(["finalize", str(batch.input), "-o", str(output), "--config", str(config_path)])
    assert (status, _one_line_error(capsys)) == (
        2,
        f"token-finalizer finalize: cannot write {output}: {batch.input} is not a directory",
    )


@pytest.mark.parametrize("command", ["finalize", "retire"])
def test_input_that_is_a_directory_is_one_line_and_exit_2(
    command: str, config_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An input that cannot be read as a file (here a directory): exit 2, one line."""
    extra = ["-o", str(tmp_path / "out.jsonl")] if command == "finalize" else []
    status = main([command, str(tmp_path), *extra, "--config", str(config_path)])
    assert (status, _one_line_error(capsys)) == (
        2,
        f"token-finalizer {command}: cannot read {tmp_path}: it is a directory",
    )


def test_unreadable_input_is_one_line_and_exit_2(
    batch: Batch,
    config_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An input the process may not read (EACCES): exit 2, one line, no output created.

    The tests run as root, which reads any file whatever its mode: the refusal
    is the one open() raises for an unreadable file.
    """
    from token_finalizer.cli.batch import arguments

    real_open = open

    def refusing_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(path) == batch.input:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(arguments, "open", refusing_open, raising=False)
    status = finalize(batch, ["--config", str(config_path)])
    assert (status, _one_line_error(capsys), batch.output.exists()) == (
        2,
        f"token-finalizer finalize: cannot read {batch.input}: permission denied",
        False,
    )


def test_source_directory_that_cannot_be_made_is_one_line_and_exit_2(
    batch: Batch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--config whose file source lies under a file: exit 2, one line, no output created."""
    config = tmp_path / "blocked.yaml"
    config.write_text(
        json.dumps({"sources": {"local": {"kind": "file", "dir": f"{batch.input}/x"}}})
    )
    status = finalize(batch, ["--config", str(config)])
    assert (status, _one_line_error(capsys), batch.output.exists()) == (
        2,
        f"token-finalizer finalize: cannot open the sources of {config}: {batch.input}/x: "
        "a part of the path is not a directory",
        False,
    )


# -- retire given something other than a finalize output ---------------------------


def test_retire_refuses_a_file_of_records(
    batch: Batch,
    target: list[str],
    local_store: FileTokenStore,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """retire IN.jsonl (records, not answers) exits 2 in one line, before touching any capture."""
    status = main(["retire", str(batch.input), *target])
    assert (status, _one_line_error(capsys)) == (
        2,
        "token-finalizer retire: line 1 is a rollout record, not a finalize answer: "
        "pass the output of `token-finalizer finalize`",
    )
    state = stored_state(local_store, batch.first)
    assert state is None or (state.frozen, state.retired) == (False, False)


def test_retire_exits_2_when_no_line_is_a_finalize_answer(
    tmp_path: Path, config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file without a single finalize answer: each line reported, then exit 2 saying so."""
    source = write_jsonl(tmp_path / "junk.jsonl", ["{not json", "", "[1]"])
    status = main(["retire", str(source), "--config", str(config_path)])
    err = _reports(messages(capsys.readouterr().err))
    assert status == 2
    assert [line.split(":")[0] for line in err[:3]] == ["line 1", "line 2", "line 3"]
    assert err[-1] == (
        f"token-finalizer retire: no line of {source} is a finalize answer: "
        "pass the output of `token-finalizer finalize`"
    )


def test_retire_reports_a_record_among_answers_by_its_line(
    batch: Batch, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A record line inside a finalize output is reported and counted failed; the rest retire."""
    finalize(batch, target)
    with batch.output.open("a") as output:
        output.write(json.dumps(record_for(batch.missing)) + "\n")
    capsys.readouterr()
    status = main(["retire", str(batch.output), *target])
    err = messages(capsys.readouterr().err)
    assert status == 3
    assert (
        "line 8: a rollout record, not a finalize answer: "
        "pass the output of `token-finalizer finalize`\n"
    ) in err
    assert "retire: 8 lines: 2 retired" in err and ", 1 bad, 0 tickets refused\n" in err


# -- progress ------------------------------------------------------------------------


def _reports(err: str) -> list[str]:
    """The lines of stderr that are the command's own reports, not JSON log records."""
    return [line for line in err.splitlines() if not line.startswith('{"ts":')]


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal, and keeps what is written to it."""

    def isatty(self) -> bool:
        return True


def test_no_progress_is_drawn_when_stderr_is_not_a_terminal(
    batch: Batch, config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Off a terminal stderr holds the line reports and the summary, nothing else."""
    finalize(batch, ["--config", str(config_path)])
    err = messages(capsys.readouterr().err)
    assert "\r" not in err
    assert all(line.startswith(("line ", "finalize: ")) for line in _reports(err)), err


@pytest.mark.parametrize("command", ["finalize", "retire"])
def test_progress_on_a_terminal_shows_count_rate_and_eta(
    batch: Batch, config_path: Path, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal a bar shows the share done, lines done, byte and line rates and the ETA."""
    target = ["--config", str(config_path)]
    if command == "retire":
        finalize(batch, target)
        args = ["retire", str(batch.output), *target]
    else:
        args = ["finalize", str(batch.input), "-o", str(batch.output), *target]
    args.append("--allow-bad-lines")
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(args) == 0
    final = [part for part in terminal.getvalue().split("\r") if f"{command}: 100%" in part][-1]
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d, [\d.]+ ?[kMG]?B/s, 7 lines, [\d.]+ lines/s\]", final)


def test_line_reports_stay_on_their_own_lines_on_a_terminal(
    batch: Batch, config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a bar drawn, each `line N: message` report is a JSON line of its own, not in the bar."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    finalize(batch, ["--config", str(config_path)])
    segments = re.split(r"[\r\n]", terminal.getvalue())
    reports = [orjson.loads(segment) for segment in segments if segment.startswith('{"')]
    numbered = [report["message"].split(":")[0] for report in reports if "line" in report]
    assert numbered == ["line 2", "line 4", "line 6"]
