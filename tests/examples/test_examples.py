"""The quickstart for real: every examples/ script, and the curl commands of docs/quickstart.md.

Each example runs as a subprocess (`sys.executable examples/NAME.py ...`)
against a finalizer (`serve --config`) and a capture store (`store serve
--dir`) started on free loopback ports, exactly as a newcomer would run them,
so the examples and the walk-through cannot rot unnoticed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.packed import canonical_lines
from tests.support.servers import free_port, running_process
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
QUICKSTART = REPO / "docs" / "quickstart.md"
README = REPO / "README.md"
ROLLOUT = "quickstart-0"
# The examples read these; the tests name every address explicitly instead.
_EXAMPLE_ENV = ("FINALIZER_URL", "FINALIZER_TOKEN", "CAPTURE_DIR", "CAPTURE_STORE_URL")
_EXAMPLE_ENV += ("CAPTURE_TOKEN", "FINALIZED_JSONL", "FINALIZER_A_URL", "FINALIZER_B_URL")
# The addresses docs/quickstart.md uses, replaced by the test servers' own.
_DOC_FINALIZER = "http://127.0.0.1:8000"
_DOC_STORE = "http://127.0.0.1:8100"


def run_example(
    name: str, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run examples/NAME as a newcomer would: its own process, its own working directory."""
    clean = {key: value for key, value in os.environ.items() if key not in _EXAMPLE_ENV}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """The stdout of a run that has to succeed (its output shown when it did not)."""
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def read_capture(path: Path) -> list[dict[str, Any]]:
    """A capture file's entries as readers see them (stored packed at rest)."""
    return [json.loads(line) for line in canonical_lines(path.read_bytes())]


def token_items(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in record["response"]["output"] if "generation_token_ids" in item]


def assert_unmasked_with_tokens(record: dict[str, Any]) -> None:
    assert "mask_sample" not in record, record.get("_ng_token_capture")
    items = token_items(record)
    assert len(items) == 3
    for item in items:
        assert item["prompt_token_ids"] and all(type(i) is int for i in item["prompt_token_ids"])
        assert item["generation_token_ids"]
        assert len(item["generation_log_probs"]) == len(item["generation_token_ids"])


@contextlib.contextmanager
def serving_finalizer(
    tmp_path: Path, source: str, *, name: str = "finalizer", extra: str = ""
) -> Iterator[str]:
    """`serve --config` with that one source (and `extra` YAML) until the block ends; its URL.

    It runs in tmp_path, as a newcomer runs it in their checkout: a relative
    `dir` is under tmp_path.
    """
    config = tmp_path / f"{name}.yaml"
    config.write_text(f"sources:\n  {source}\n{extra}")
    port = free_port()
    args = ["serve", "--config", str(config), "--port", str(port)]
    with running_process(args, port=port, cwd=tmp_path):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def finalizer(tmp_path: Path) -> Iterator[str]:
    """`serve` with one file source over ./capture in tmp_path (the embedded default's)."""
    with serving_finalizer(tmp_path, "local: {kind: file, dir: ./capture}") as url:
        yield url


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    """`store serve --dir tmp_path/store`."""
    port = free_port()
    args = ["store", "serve", "--dir", str(tmp_path / "store"), "--port", str(port)]
    with running_process(args, port=port):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def remote_finalizer(tmp_path: Path, store: str) -> Iterator[str]:
    """`serve` whose only source is the capture store, through an http source."""
    with serving_finalizer(tmp_path, f'store: {{kind: http, url: "{store}"}}') as url:
        yield url


@pytest.fixture
def replicas(tmp_path: Path, store: str) -> Iterator[tuple[str, str]]:
    """Two `serve` replicas in front of the store, sharing one retire.key (docker-compose.yml)."""
    source = f'store: {{kind: http, url: "{store}"}}'
    extra = "retire: {key: examples-shared-secret-0123456789abc}\n"
    with (
        serving_finalizer(tmp_path, source, name="replica-a", extra=extra) as replica_a,
        serving_finalizer(tmp_path, source, name="replica-b", extra=extra) as replica_b,
    ):
        yield replica_a, replica_b


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """Rollout quickstart-0 written by examples/write_capture_file.py into tmp_path/capture."""
    ok(run_example("write_capture_file.py", "--dir", str(tmp_path / "capture"), cwd=tmp_path))
    return tmp_path / "capture"


# -- the examples -----------------------------------------------------------------


ALL_EXAMPLES = sorted(path.name for path in EXAMPLES.glob("*.py"))


def test_every_example_is_run_here() -> None:
    """Every script in examples/ is run by a test of this module."""
    source = Path(__file__).read_text()
    assert ALL_EXAMPLES
    assert [name for name in ALL_EXAMPLES if f'"{name}"' not in source] == []


@pytest.mark.parametrize("name", ALL_EXAMPLES)
def test_example_docstring_says_who_and_how(name: str) -> None:
    """Each example opens with a docstring saying who it is for and how to run it."""
    result = run_example(name, "--help", cwd=REPO)
    assert ok(result).startswith("usage:")
    text = (EXAMPLES / name).read_text()
    docstring = text.split('"""')[1]
    assert "For:" in docstring and "Run" in docstring and f"examples/{name}" in docstring


def test_write_capture_file_writes_one_entry_per_call(tmp_path: Path) -> None:
    """By default the file writer puts 3 full TokenEntries into ./capture/ROLLOUT.tokens.jsonl."""
    ok(run_example("write_capture_file.py", cwd=tmp_path))
    entries = read_capture(tmp_path / "capture" / f"{ROLLOUT}.tokens.jsonl")
    fields = {"rollout_id", "model_call_id", "prompt_token_ids", "generation_token_ids"}
    fields |= {"generation_log_probs", "output_items", "token_item_index", "created_at"}
    assert [entry["model_call_id"] for entry in entries] == ["call-0", "call-1", "call-2"]
    assert all(fields <= entry.keys() and entry["rollout_id"] == ROLLOUT for entry in entries)
    for before, after in itertools.pairwise(entries):
        context = before["prompt_token_ids"] + before["generation_token_ids"]
        assert after["prompt_token_ids"][: len(context)] == context


def test_write_capture_file_takes_its_directory_from_the_environment(tmp_path: Path) -> None:
    """$CAPTURE_DIR names the capture directory when --dir is not given."""
    env = {"CAPTURE_DIR": str(tmp_path / "elsewhere")}
    ok(run_example("write_capture_file.py", "--rollout-id", "7-0", cwd=tmp_path, env=env))
    assert stored_state(FileTokenStore(tmp_path / "elsewhere"), "7-0") is not None


def test_write_capture_file_refuses_a_second_run(tmp_path: Path, written: Path) -> None:
    """Running the writer again for the same rollout exits 1 and leaves the capture intact."""
    result = run_example("write_capture_file.py", "--dir", str(written), cwd=tmp_path)
    assert result.returncode == 1 and "another --rollout-id" in result.stderr
    assert stored_state(FileTokenStore(written), ROLLOUT).incomplete is False


def _finalize_early(finalizer: str, rollout_id: str = ROLLOUT) -> None:
    """POST /finalize for a rollout before its writer ran: the mistake item 8 is about."""
    record = {"_ng_rollout_id": rollout_id, "response": {"output": []}}
    answer = httpx.post(f"{finalizer}/finalize", json=record, timeout=30)
    assert answer.json()["build"]["mask_reason"] == "empty_capture"


WRITERS_RULE = "must match ^[A-Za-z0-9][A-Za-z0-9._-]*$"


def test_an_id_finalize_refuses_is_never_written_and_finalize_masks_it(
    tmp_path: Path, finalizer: str, store: str
) -> None:
    """`_x1`: both example writers and the store refuse it, and finalize masks a record naming it.

    The capture a newcomer wrote under such an id used to be orphaned for
    good (docs/records-and-builds.md#store-id-rule); now nothing is stored.
    """
    directory = tmp_path / "capture"
    by_file = run_example("write_capture_file.py", "--dir", str(directory), "--rollout-id", "_x1",
                          cwd=tmp_path)  # fmt: skip
    by_http = run_example("write_capture_http.py", "--store-url", store, "--rollout-id", "_x1",
                          cwd=tmp_path)  # fmt: skip
    for result in (by_file, by_http):
        assert (result.returncode, f"'_x1' {WRITERS_RULE}" in result.stderr) == (2, True)
    # A writer of its own (Gym's sink, curl) meets the same rule at the store.
    put = httpx.put(
        f"{store}/ng-rollout/_x1/training-token-capture/calls/c1",
        json={"rollout_id": "_x1", "model_call_id": "c1"},
        timeout=30,
    )
    assert (put.status_code, f"'_x1' {WRITERS_RULE}" in put.json()["error"]) == (422, True)
    record = {"_ng_rollout_id": "_x1", "response": {"output": []}}
    answer = httpx.post(f"{finalizer}/finalize", json=record, timeout=30).json()
    assert answer["build"]["mask_reason"] == "malformed_rollout_id"
    assert stored_state(FileTokenStore(directory), "_x1") is None
    assert stored_state(FileTokenStore(tmp_path / "store"), "_x1") is None


def test_write_capture_file_says_a_finalized_id_is_frozen(tmp_path: Path, finalizer: str) -> None:
    """Finalized before it was written: the writer says frozen, by whom unknown, and the way out."""
    _finalize_early(finalizer)
    directory = tmp_path / "capture"
    result = run_example("write_capture_file.py", "--dir", str(directory), cwd=tmp_path)
    assert result.returncode == 1
    assert f"rollout {ROLLOUT} is frozen" in result.stderr
    assert "cannot tell who" in result.stderr
    assert f"`token-finalizer store delete {ROLLOUT} --dir {directory}`" in result.stderr


def test_the_store_delete_the_writer_names_frees_the_id(tmp_path: Path, finalizer: str) -> None:
    """After the `store delete` the writer's message names, the same id is written again."""
    _finalize_early(finalizer)
    directory = tmp_path / "capture"
    delete = [sys.executable, "-m", "token_finalizer.cli", "store", "delete", ROLLOUT]
    subprocess.run([*delete, "--dir", str(directory), "--yes"], check=True, timeout=60)
    ok(run_example("write_capture_file.py", "--dir", str(directory), cwd=tmp_path))
    assert stored_state(FileTokenStore(directory), ROLLOUT).frozen is False


def test_write_capture_http_says_a_finalized_id_is_frozen(
    tmp_path: Path, store: str, remote_finalizer: str
) -> None:
    """Through a capture store too: the 409 is read as 'finalized', with `store delete` named."""
    _finalize_early(remote_finalizer)
    result = run_example("write_capture_http.py", "--store-url", store, cwd=tmp_path)
    assert result.returncode == 1
    assert f"rollout {ROLLOUT} was finalized" in result.stderr
    assert "cannot tell by whom" in result.stderr
    assert f"`token-finalizer store delete {ROLLOUT} --dir DIR`" in result.stderr


def test_finalize_with_client_writes_an_unmasked_record(
    tmp_path: Path, finalizer: str, written: Path
) -> None:
    """The harness stores an unmasked record carrying prompt and generation token ids."""
    out = tmp_path / "finalized.jsonl"
    args = ["--finalizer-url", finalizer, "--out", str(out), "--no-retire"]
    stdout = ok(run_example("finalize_with_client.py", *args, cwd=tmp_path))
    assert "mask_sample: false" in stdout
    [answer] = read_jsonl(out)
    assert_unmasked_with_tokens(answer["record"])
    assert answer["retire"]["rollout_id"] == ROLLOUT
    assert stored_state(FileTokenStore(written), ROLLOUT).retired is False


def test_finalize_with_client_retires_after_the_durable_write(
    tmp_path: Path, finalizer: str, written: Path
) -> None:
    """Without --no-retire the harness retires the capture once the JSONL line is written."""
    env = {"FINALIZER_URL": finalizer}
    stdout = ok(run_example("finalize_with_client.py", cwd=tmp_path, env=env))
    assert "retired: true" in stdout
    assert len(read_jsonl(tmp_path / "finalized.jsonl")) == 1
    assert stored_state(FileTokenStore(written), ROLLOUT).retired is True


def test_finalize_with_client_reports_an_unreachable_finalizer(tmp_path: Path) -> None:
    """With no finalizer listening, the harness exits 2 saying how to start one."""
    url = f"http://127.0.0.1:{free_port()}"
    result = run_example("finalize_with_client.py", "--finalizer-url", url, cwd=tmp_path)
    assert result.returncode == 2 and "token-finalizer serve" in result.stderr


def test_retire_after_durable_write_retires_the_stored_answer(
    tmp_path: Path, finalizer: str, written: Path
) -> None:
    """The trainer retires the `retire` object it reads back from the durable JSONL."""
    env = {"FINALIZER_URL": finalizer}
    ok(run_example("finalize_with_client.py", "--no-retire", cwd=tmp_path, env=env))
    stdout = ok(run_example("retire_after_durable_write.py", cwd=tmp_path, env=env))
    assert stdout.strip() == f"line 1: {ROLLOUT}: retired true"
    assert stored_state(FileTokenStore(written), ROLLOUT).retired is True


def test_retire_after_durable_write_skips_a_masked_answer(tmp_path: Path, finalizer: str) -> None:
    """A masked answer has no `retire` object: the trainer skips it and keeps its capture."""
    env = {"FINALIZER_URL": finalizer}
    args = ["--rollout-id", "never-written", "--no-retire"]
    ok(run_example("finalize_with_client.py", *args, cwd=tmp_path, env=env))
    stdout = ok(run_example("retire_after_durable_write.py", cwd=tmp_path, env=env))
    assert "not retirable, skipped" in stdout
    assert stored_state(FileTokenStore(tmp_path / "capture"), "never-written").retired is False


def test_ops_check_shows_readiness_and_the_finalize(
    tmp_path: Path, finalizer: str, written: Path
) -> None:
    """ops_check reports the source reachable and counts the finalize in /metrics."""
    ok(run_example("finalize_with_client.py", "--finalizer-url", finalizer, cwd=tmp_path))
    stdout = ok(run_example("ops_check.py", "--finalizer-url", finalizer, cwd=tmp_path))
    assert f"finalizer {finalizer}: ready (200)" in stdout
    assert "source local: reachable" in stdout
    assert "finalize ok (source local): 1" in stdout
    assert "retire retired (source local): 1" in stdout


def test_ops_check_exits_2_when_the_finalizer_is_unreachable(tmp_path: Path) -> None:
    """Nothing listening: ops_check says unreachable and exits 2."""
    url = f"http://127.0.0.1:{free_port()}"
    result = run_example("ops_check.py", "--finalizer-url", url, cwd=tmp_path)
    assert result.returncode == 2 and "unreachable" in result.stdout


def test_write_capture_http_writes_through_store_serve(tmp_path: Path, store: str) -> None:
    """HttpTokenSink puts the 3 entries into the directory `store serve` serves."""
    env = {"CAPTURE_STORE_URL": store}
    ok(run_example("write_capture_http.py", cwd=tmp_path, env=env))
    entries = read_capture(tmp_path / "store" / f"{ROLLOUT}.tokens.jsonl")
    assert [entry["model_call_id"] for entry in entries] == ["call-0", "call-1", "call-2"]


def test_remote_capture_finalizes_unmasked_and_retires(
    tmp_path: Path, store: str, remote_finalizer: str
) -> None:
    """Written through the store, finalized through an http source: unmasked, then retired."""
    ok(run_example("write_capture_http.py", "--store-url", store, cwd=tmp_path))
    args = ["--finalizer-url", remote_finalizer, "--out", "remote.jsonl"]
    stdout = ok(run_example("finalize_with_client.py", *args, cwd=tmp_path))
    [answer] = read_jsonl(tmp_path / "remote.jsonl")
    assert answer["source"] == "store"
    assert_unmasked_with_tokens(answer["record"])
    assert "retired: true" in stdout
    assert stored_state(FileTokenStore(tmp_path / "store"), ROLLOUT).retired is True


def _staged_answer(tmp_path: Path, store: str, remote_finalizer: str) -> tuple[dict[str, Any], str]:
    """examples/write_staging_rollout.py, then finalize_with_client.py on its record."""
    ok(run_example("write_staging_rollout.py", "--store-url", store, cwd=tmp_path))
    args = ["--finalizer-url", remote_finalizer, "--record", "staging-record.json"]
    stdout = ok(run_example("finalize_with_client.py", *args, "--out", "staged.jsonl",
                            cwd=tmp_path))  # fmt: skip
    [answer] = read_jsonl(tmp_path / "staged.jsonl")
    return answer, stdout


def test_staging_rollout_finalizes_to_a_verified_row_of_both_calls(
    tmp_path: Path, store: str, remote_finalizer: str
) -> None:
    """The staging example's two calls finalize unmasked into one verified row: call-0, call-1."""
    answer, stdout = _staged_answer(tmp_path, store, remote_finalizer)
    staged = answer["staged"]
    assert (staged["error"], answer["record"].get("mask_sample")) == (None, None)
    assert staged["row"]["model_call_ids"] == ["call-0", "call-1"]
    assert "verified row: 172 tokens (42 generated)" in stdout and "retired: true" in stdout


def test_staging_rollout_row_holds_the_exact_tokens_served(
    tmp_path: Path, store: str, remote_finalizer: str
) -> None:
    """The verified row is the task, both answers and the tool output, token for token."""
    row = _staged_answer(tmp_path, store, remote_finalizer)[0]["staged"]["row"]
    text = bytes(row["token_ids"]).decode()  # the example's tokenizer: one token per byte
    generated = bytes(t for t, m in zip(row["token_ids"], row["token_mask"], strict=True) if m)
    assert text.startswith("<system>") and text.endswith("notes.txt has 3 lines.")
    assert generated.decode() == "run: wc -l notes.txt" + "notes.txt has 3 lines."


def test_staging_doc_commands_print_what_the_doc_shows(
    tmp_path: Path, store: str, remote_finalizer: str
) -> None:
    """docs/staging.md's two example commands, run as written, print its output block."""
    section = (REPO / "docs" / "staging.md").read_text().split("### A staging rollout, runnable")[1]
    commands, shown = re.findall(r"^```\w*\n(.*?)^```", section, re.MULTILINE | re.DOTALL)[:2]
    env = {"CAPTURE_STORE_URL": store, "FINALIZER_URL": remote_finalizer}
    printed = ""
    for command in commands.splitlines():
        program, script, *args = shlex.split(command)
        assert (program, script.startswith("examples/")) == (".venv/bin/python", True)
        printed += ok(run_example(script.removeprefix("examples/"), *args, cwd=tmp_path, env=env))
    assert printed.replace(store, _DOC_STORE) == shown


def test_write_staging_rollout_refuses_a_second_run(tmp_path: Path, store: str) -> None:
    """Staging the same rollout again exits 1 and says to pass another --rollout-id."""
    ok(run_example("write_staging_rollout.py", "--store-url", store, cwd=tmp_path))
    again = run_example("write_staging_rollout.py", "--store-url", store, cwd=tmp_path)
    assert again.returncode == 1 and "another --rollout-id" in again.stderr


def test_compose_smoke_passes_against_two_replicas(
    tmp_path: Path, store: str, replicas: tuple[str, str]
) -> None:
    """compose_smoke finalizes on one replica and retires on the other, through the store."""
    replica_a, replica_b = replicas
    args = ["--store-url", store, "--finalizer-a", replica_a, "--finalizer-b", replica_b]
    stdout = ok(run_example("compose_smoke.py", *args, cwd=tmp_path))
    assert "smoke test passed" in stdout


# -- the curl commands of docs/quickstart.md -------------------------------------------


def _commands(body: str) -> list[str]:
    """The shell commands of a fenced block, each whole: continuation and quoted lines joined."""
    commands, pending = [], ""
    for line in body.splitlines():
        pending += line + "\n"
        if pending.rstrip().endswith("\\"):
            continue
        try:
            shlex.split(pending)
        except ValueError:  # a quote still open: the command goes on
            continue
        if pending.strip():
            commands.append(pending.strip())
        pending = ""
    assert not pending.strip(), f"unfinished command: {pending}"
    return commands


def _expected(lang: str, body: str, count: int) -> list[Any] | None:
    """What a json block after `count` commands shows: one document per command, or None."""
    if lang != "json":
        return None
    lines = [line for line in body.splitlines() if line.strip()]
    if count > 1 and len(lines) == count:
        return [json.loads(line) for line in lines]
    return [json.loads(body)] if count == 1 else None


def doc_curl_steps(section: str) -> list[tuple[list[str], list[Any] | None]]:
    """The curl commands of each bash block of the doc, with the json output shown after it."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    steps = []
    for index, (lang, body) in enumerate(blocks):
        curls = [command for command in _commands(body) if command.startswith("curl ")]
        if lang != "bash" or not curls:
            continue
        following = blocks[index + 1] if index + 1 < len(blocks) else ("", "")
        steps.append((curls, _expected(*following, len(curls))))
    return steps


def quickstart_sections() -> tuple[str, str]:
    """docs/quickstart.md before and from its "Remote capture store" section."""
    local, remote = QUICKSTART.read_text().split("\n## Remote capture store\n")
    return local, remote


def assert_shape(shown: Any, actual: Any, where: str = "answer") -> None:
    """`actual` has everything the doc shows: its keys and exact values, abridged parts aside.

    The doc abridges with "..." keys, strings ending in "..." (ids, tickets)
    and lists holding a "..." string (token lists); those parts only have to
    exist.
    """
    if isinstance(shown, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r:.200}"
        for key, value in shown.items():
            if key != "...":
                assert key in actual, f"{where}: no {key!r} in {sorted(actual)}"
                assert_shape(value, actual[key], f"{where}.{key}")
    elif isinstance(shown, list):
        assert isinstance(actual, list), f"{where}: {actual!r:.200}"
        if not any(isinstance(item, str) and "..." in item for item in shown):
            assert len(actual) == len(shown), f"{where}: {len(actual)} items"
            for index, (item, real) in enumerate(zip(shown, actual, strict=True)):
                assert_shape(item, real, f"{where}[{index}]")
    elif isinstance(shown, str) and shown.endswith("..."):
        assert isinstance(actual, str), f"{where}: {actual!r:.200}"
    else:
        assert actual == shown, f"{where}: {actual!r} where the doc shows {shown!r}"


def run_doc_steps(
    steps: list[tuple[list[str], list[Any] | None]], cwd: Path, urls: dict[str, str]
) -> list[str]:
    """Run each command with the test servers' addresses; check what the doc shows after it."""
    outputs = []
    for commands, expected in steps:
        for index, command in enumerate(commands):
            for doc_url, url in urls.items():
                command = command.replace(doc_url, url)
            result = subprocess.run(
                ["bash", "-o", "pipefail", "-c", command],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
            written = re.search(r" -o (\S+)", command)
            output = (cwd / written[1]).read_text() if written else result.stdout
            if expected is not None:
                assert_shape(expected[index], json.loads(output), command.splitlines()[0])
            outputs.append(output)
    return outputs


def test_quickstart_starts_the_service_with_the_readme_set_up_command() -> None:
    """Step 1 of the quickstart is the README's set-up command, verbatim."""
    set_up = README.read_text().split("\n## Set up\n")[1]
    command = re.search(r"^```bash\n(.*?)^```", set_up, re.MULTILINE | re.DOTALL)
    assert command is not None and "token-finalizer serve" in command[1]
    assert f"```bash\n{command[1]}```" in QUICKSTART.read_text()


needs_curl = pytest.mark.skipif(
    shutil.which("curl") is None, reason="curl is not installed: the doc's curl commands need it"
)


@needs_curl
def test_quickstart_curl_commands_answer_as_shown(
    tmp_path: Path, finalizer: str, written: Path
) -> None:
    """The walk-through's curl commands run against a real finalizer and answer as the doc shows."""
    steps = doc_curl_steps(quickstart_sections()[0])
    assert sum(len(commands) for commands, _ in steps) >= 5
    outputs = run_doc_steps(steps, tmp_path, {_DOC_FINALIZER: finalizer})
    assert_unmasked_with_tokens(json.loads((tmp_path / "answer.json").read_text())["record"])
    assert '{"retired":true}' in outputs
    assert any('token_finalizer_finalize_total{outcome="ok",source="local"}' in o for o in outputs)
    assert stored_state(FileTokenStore(written), ROLLOUT).retired is True


@needs_curl
def test_quickstart_remote_curl_commands_answer_as_shown(
    tmp_path: Path, store: str, remote_finalizer: str
) -> None:
    """The remote variant's curl commands reach the store and a finalizer reading it."""
    steps = doc_curl_steps(quickstart_sections()[1])
    assert steps and all(expected is not None for _, expected in steps)
    run_doc_steps(steps, tmp_path, {_DOC_FINALIZER: remote_finalizer, _DOC_STORE: store})


def _shown_after(section: str, command_prefix: str) -> tuple[str, str]:
    """The command of the bash block starting with `command_prefix`, and the block after it."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    for index, (lang, body) in enumerate(blocks):
        if lang == "bash" and body.startswith(command_prefix):
            return body.strip(), blocks[index + 1][1].strip()
    raise AssertionError(f"no bash block starting with {command_prefix!r}")


def test_quickstart_store_delete_frees_a_wrongly_finalized_id(
    tmp_path: Path, finalizer: str
) -> None:
    """The quickstart's `store delete` of the masked example prints what the doc shows."""
    _finalize_early(finalizer, "nobody-wrote-this")
    command, shown = _shown_after(
        quickstart_sections()[0], ".venv/bin/token-finalizer store delete"
    )
    args = shlex.split(command.removeprefix(".venv/bin/token-finalizer"))
    result = subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # The report is a JSON log line: the same as the doc's but for its time stamp.
    assert result.returncode == 0
    assert {**json.loads(result.stderr), "ts": None} == {**json.loads(shown), "ts": None}
    assert stored_state(FileTokenStore(tmp_path / "capture"), "nobody-wrote-this") is None


def _walk_through_commands(section: str) -> list[str]:
    """Every command of the section's bash blocks, in order, then its inline `store sweep`."""
    commands = [
        command
        for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
        if lang == "bash"
        for command in _commands(body)
    ]
    sweep = re.search(r"`(token-finalizer store sweep [^`]*)`", section)
    assert sweep is not None
    return [*commands, f".venv/bin/{sweep[1]}"]


def test_quickstart_walk_through_runs_verbatim(tmp_path: Path, finalizer: str) -> None:
    """Every command of the quickstart up to the remote store, in order and as written, exits 0.

    Only the finalizer's address (and where .venv/ and examples/ are) differs;
    step 1 is the README's set-up command, run by the test above.
    """
    set_up = README.read_text().split("\n## Set up\n")[1].split("```bash\n")[1].split("```")[0]
    commands = [c for c in _walk_through_commands(quickstart_sections()[0]) if c != set_up.strip()]
    assert len(commands) >= 12
    env = {key: value for key, value in os.environ.items() if key not in _EXAMPLE_ENV}
    env["FINALIZER_URL"] = finalizer
    for command in commands:
        command = command.replace(_DOC_FINALIZER, finalizer)
        command = command.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
        command = command.replace("examples/", f"{EXAMPLES}/")
        result = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"


def test_quickstart_commands_write_only_inside_the_checkout() -> None:
    """No command of docs/quickstart.md names an absolute path: two checkouts never share a file."""
    blocks = re.findall(r"^```bash\n(.*?)^```", QUICKSTART.read_text(), re.MULTILINE | re.DOTALL)
    words = [word for block in blocks for command in _commands(block) for word in
             shlex.split(command.replace("\\\n", " "))]  # fmt: skip
    assert blocks and [word for word in words if word.startswith("/")] == []


def _as_cli(command: str, port: int) -> list[str]:
    """A doc's `.venv/bin/token-finalizer ...` command as running_process args, on `port`."""
    assert command.startswith(".venv/bin/token-finalizer ")
    return [*shlex.split(command.removeprefix(".venv/bin/token-finalizer ")), "--port", str(port)]


def test_quickstart_remote_servers_start_from_the_commands_shown(tmp_path: Path) -> None:
    """The remote section's store and finalizer start as written (on a free port), and are ready."""
    section = quickstart_sections()[1]
    store_port, finalizer_port = free_port(), free_port()
    store_url = f"http://127.0.0.1:{store_port}"
    [store_command] = _commands(_shown_after(section, ".venv/bin/token-finalizer store")[0])
    printf, serve = _commands(_shown_after(section, "printf ")[0])
    with running_process(_as_cli(store_command, store_port), port=store_port, cwd=tmp_path):
        subprocess.run(["bash", "-c", printf.replace(_DOC_STORE, store_url)], cwd=tmp_path,
                       check=True, timeout=30)  # fmt: skip
        args = _as_cli(serve, finalizer_port)
        with running_process(args, port=finalizer_port, cwd=tmp_path):
            ready = httpx.get(f"http://127.0.0.1:{finalizer_port}/ready", timeout=30).json()
    assert ready == {"status": "ready", "sources": {"store": {"reachable": True}}}
    assert (tmp_path / "capture-store").is_dir()


def _write_rollouts(directory: Path, cwd: Path, *rollout_ids: str) -> None:
    for rollout_id in rollout_ids:
        args = ["--dir", str(directory), "--rollout-id", rollout_id]
        ok(run_example("write_capture_file.py", *args, cwd=cwd))


@pytest.mark.parametrize("mode", [[], ["--many"]], ids=["finalize_iter", "finalize_many"])
def test_finalize_batch_async_writes_then_retires_every_rollout(
    tmp_path: Path, finalizer: str, mode: list[str]
) -> None:
    """The asyncio batch harness writes one unmasked answer per rollout, then retires each."""
    directory = tmp_path / "capture"
    _write_rollouts(directory, tmp_path, "a-0", "b-0")
    args = ["--finalizer-url", finalizer, "--rollout-id", "a-0", "--rollout-id", "b-0", *mode]
    stdout = ok(run_example("finalize_batch_async.py", *args, cwd=tmp_path))
    answers = read_jsonl(tmp_path / "finalized.jsonl")
    assert [answer["record"]["_ng_rollout_id"] for answer in answers] == ["a-0", "b-0"]
    for answer in answers:
        assert_unmasked_with_tokens(answer["record"])
    assert "retired 2 of 2 retirable captures" in stdout
    assert all(stored_state(FileTokenStore(directory), rid).retired for rid in ("a-0", "b-0"))


def test_finalize_batch_async_keeps_going_past_a_refused_record(
    tmp_path: Path, finalizer: str
) -> None:
    """A record the finalizer refuses (400) is reported; the batch's other records still land."""
    _write_rollouts(tmp_path / "capture", tmp_path, "a-0")
    records = tmp_path / "batch.jsonl"
    records.write_text(json.dumps(["not", "a record"]) + "\n" + json.dumps(_record("a-0")) + "\n")
    args = ["--finalizer-url", finalizer, "--records", str(records), "--no-retire"]
    result = run_example("finalize_batch_async.py", *args, cwd=tmp_path)
    assert "record 1: rollout a-0 finalized" in ok(result)
    assert "record 0: not finalized" in result.stderr
    [answer] = read_jsonl(tmp_path / "finalized.jsonl")
    assert answer["record"]["_ng_rollout_id"] == "a-0"


def _record(rollout_id: str) -> dict[str, Any]:
    sys.path.insert(0, str(EXAMPLES))
    try:
        from finalize_with_client import example_record
    finally:
        sys.path.remove(str(EXAMPLES))
    return example_record(rollout_id)
