"""`token-finalizer store inspect|delete` (file and redis), and `store sweep` in a hostile dir."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.support.captures import make_entry
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.stores import run_sync, stored_state
from token_finalizer import FileTokenStore
from token_finalizer.cli import main
from token_finalizer.sources.redis import RedisTokenStore

DAY = 86_400.0


class _Terminal(io.StringIO):
    """Stdin of an interactive terminal that answers `text`."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))


def _terminal(monkeypatch: pytest.MonkeyPatch, answer: str) -> None:
    monkeypatch.setattr("sys.stdin", _Terminal(answer))


@pytest.fixture
def capture(capture_dir: Path) -> Path:
    """Rollout r1: c1 stored, c2 announced and missing, c3 failed; frozen."""
    store = FileTokenStore(capture_dir)

    async def write() -> None:
        await store.put(make_entry("r1", "c1", [1], [2]))
        await store.begin_call("r1", "c2")
        await store.mark_incomplete("r1", "c3")
        await store.freeze("r1")

    anyio.run(write)
    return capture_dir


def _run(*args: str) -> int:
    return main(["store", *args])


# -- inspect -----------------------------------------------------------------------------


def test_inspect_prints_the_capture_as_json(
    capture: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """State, entry count, incomplete reasons and ids, snapshot id and version, retired."""
    assert _run("inspect", "r1", "--dir", str(capture)) == 0
    report = json.loads(capsys.readouterr().out)
    status = stored_state(FileTokenStore(capture), "r1")
    assert report["found"] is True
    assert (report["state"], report["frozen"], report["retired"]) == ("frozen", True, False)
    assert (report["snapshot_id"], report["version"]) == (status.snapshot_id, status.version)
    assert report["entries"] == 1
    assert (report["incomplete"], report["incomplete_call_ids"], report["missing_call_ids"]) == (
        True,
        ["c3"],
        ["c2"],
    )
    assert "1 announced call(s) have no entry" in report["incomplete_reasons"]


def test_inspect_of_nothing_stored_exits_1(
    capture_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unknown rollout: `{"found": false}` on stdout, a line on stderr, exit 1, no file made."""
    assert _run("inspect", "ghost", "--dir", str(capture_dir)) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"rollout_id": "ghost", "found": False}
    assert "nothing stored for rollout ghost" in err
    assert list(capture_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["../etc", "--dir", "{dir}"], "must be a non-empty string"),
        (["r1", "--dir", "{dir}/typo"], "is not a directory"),
        (["r1", "--dir", "{dir}", "--key-prefix", "p:"], "--key-prefix only goes with --redis"),
    ],
)
def test_inspect_refuses_unusable_arguments(
    capture_dir: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """A bad id, a missing directory (not created), a redis-only flag: exit 2."""
    filled = [a.replace("{dir}", str(capture_dir)) for a in args]
    assert _run("inspect", *filled) == 2
    assert message in capsys.readouterr().err
    assert not (capture_dir / "typo").exists()


def test_inspect_of_an_untrusted_capture_names_the_file(
    capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A planted link: exit 1 naming the capture file, never the link's target."""
    (capture / "r1.tokens.intents").unlink()
    (capture / "r1.tokens.intents").symlink_to(tmp_path / "elsewhere")
    assert _run("inspect", "r1", "--dir", str(capture)) == 1
    err = capsys.readouterr().err
    assert "r1.tokens.intents is a symbolic link" in err
    assert "elsewhere" not in err


# -- delete ------------------------------------------------------------------------------


def test_delete_with_yes_removes_every_file_and_says_so(
    capture: Path, capsys: pytest.CaptureFixture[str], not_a_terminal: None
) -> None:
    """--yes deletes without asking; stderr names what was deleted."""
    assert _run("delete", "r1", "--dir", str(capture), "--yes") == 0
    err = capsys.readouterr().err
    assert list(capture.iterdir()) == []
    assert "deleted rollout r1 (frozen, 1 entry, incomplete" in err
    for name in ("r1.tokens.jsonl", "r1.tokens.state.json", "r1.tokens.intents"):
        assert name in err


def test_delete_without_a_terminal_and_without_yes_refuses(
    capture: Path, capsys: pytest.CaptureFixture[str], not_a_terminal: None
) -> None:
    """No terminal to ask on and no --yes: exit 2, nothing deleted (even with 'y' piped in)."""
    before = sorted(capture.iterdir())
    assert _run("delete", "r1", "--dir", str(capture)) == 2
    assert "pass --yes" in capsys.readouterr().err
    assert sorted(capture.iterdir()) == before


@pytest.mark.parametrize(("answer", "code"), [("y\n", 0), ("yes\n", 0), ("n\n", 1), ("", 1)])
def test_delete_asks_on_a_terminal(
    capture: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    answer: str,
    code: int,
) -> None:
    """On a terminal it asks (warning about an unretired frozen capture); only yes deletes."""
    _terminal(monkeypatch, answer)
    assert _run("delete", "r1", "--dir", str(capture)) == code
    err = capsys.readouterr().err
    assert "delete rollout r1 (frozen, 1 entry, incomplete, version" in err
    assert "frozen and was not retired" in err
    assert (stored_state(FileTokenStore(capture), "r1") is None) == (code == 0)


def test_delete_of_nothing_stored_exits_1(
    capture_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing to delete: exit 1, and no lock file is left behind."""
    assert _run("delete", "ghost", "--dir", str(capture_dir), "--yes") == 1
    assert "nothing stored for rollout ghost" in capsys.readouterr().err
    assert list(capture_dir.iterdir()) == []


def test_delete_of_an_untrusted_capture_removes_the_names_only(
    capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A capture with a planted link is deleted (what delete is for); the target is untouched."""
    target = tmp_path / "outside.txt"
    target.write_bytes(b"keep me")
    (capture / "r1.tokens.jsonl").unlink()
    (capture / "r1.tokens.jsonl").symlink_to(target)
    assert _run("delete", "r1", "--dir", str(capture), "--yes") == 0
    assert "unreadable: r1.tokens.jsonl is a symbolic link" in capsys.readouterr().err
    assert list(capture.iterdir()) == []
    assert target.read_bytes() == b"keep me"


# -- the same over redis -----------------------------------------------------------------


@pytest.fixture
def redis_capture() -> Iterator[tuple[str, str]]:
    """(url, key prefix) of a redis store holding rollout r1 (one entry, frozen)."""
    url = find_redis_url()
    with unique_prefix(url, "cli-admin") as prefix:

        async def write() -> None:
            store = RedisTokenStore(url, key_prefix=prefix)
            try:
                await store.put(make_entry("r1", "c1", [1], [2]))
                await store.freeze("r1")
            finally:
                await store.close()

        anyio.run(write)
        yield url, prefix


def test_inspect_and_delete_over_redis(
    redis_capture: tuple[str, str], capsys: pytest.CaptureFixture[str], not_a_terminal: None
) -> None:
    """--redis URL --key-prefix P: the same report and the same explicit delete."""
    url, prefix = redis_capture
    backend = ["--redis", url, "--key-prefix", prefix]
    assert _run("inspect", "r1", *backend) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["store"], report["state"], report["entries"]) == ("redis", "frozen", 1)
    assert report["snapshot_id"] and report["version"] == 2
    assert report["keys"] == [
        f"{prefix}{{ng:r1}}:{part}" for part in ("state", "entries", "digests", "order", "links")
    ]
    assert _run("delete", "r1", *backend) == 2  # no terminal, no --yes
    assert _run("delete", "r1", *backend, "--yes") == 0
    assert f"{prefix}{{ng:r1}}:state" in capsys.readouterr().err
    assert _run("inspect", "r1", *backend) == 1


@pytest.mark.parametrize(
    ("prefix", "hint"),
    [
        (None, "under no key prefix: a store started with --key-prefix keeps its keys under it"),
        ("wrong:", "under key prefix 'wrong:': is it the store's own --key-prefix?"),
    ],
)
def test_inspect_over_redis_finding_nothing_names_the_key_prefix(
    redis_capture: tuple[str, str],
    capsys: pytest.CaptureFixture[str],
    prefix: str | None,
    hint: str,
) -> None:
    """A rollout stored under another prefix: the miss says which prefix was looked under."""
    url, _ = redis_capture
    backend = ["--redis", url, *(["--key-prefix", prefix] if prefix else [])]
    assert _run("inspect", "r1", *backend) == 1
    assert hint in capsys.readouterr().err


# -- sweep in a hostile directory --------------------------------------------------------


def _age_all(directory: Path, seconds: float) -> None:
    then = time.time() - seconds
    for path in directory.iterdir():
        os.utime(path, (then, then), follow_symlinks=False)


def test_sweep_skips_a_stray_name_reports_it_and_sweeps_the_rest(
    capture_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No traceback: the stray file is reported on stderr (exit 1); tombstones still go."""
    store = FileTokenStore(capture_dir)

    async def retire(rollout_id: str) -> None:
        await store.put(make_entry(rollout_id, "c1", [1], [2]))
        snapshot = await store.freeze(rollout_id)
        await store.drop(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version)

    for rollout_id in ("a-old", "z-old"):
        anyio.run(retire, rollout_id)
    (capture_dir / "notes about run 7.tokens.jsonl").write_text("notes\n")
    (capture_dir / f".a-old.tokens.state.json.{'0' * 32}.tmp").write_text("{")
    _age_all(capture_dir, 10 * DAY)
    assert _run("sweep", "--dir", str(capture_dir), "--retired-older-than", "7d") == 1
    out, err = capsys.readouterr()
    assert "removed a-old (retired, 10d old)" in out and "removed z-old (retired, 10d old)" in out
    assert f"removed .a-old.tokens.state.json.{'0' * 32}.tmp (temp file" in out
    assert "removed 2 capture(s): 2 retired, 0 abandoned; 1 leftover file(s); skipped 1" in out
    assert "skipped 'notes about run 7.tokens.jsonl': not a capture file of this store" in err
    assert sorted(p.name for p in capture_dir.iterdir()) == ["notes about run 7.tokens.jsonl"]


def test_sweep_removes_frozen_empty_captures_with_the_flag(
    capture_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--empty-older-than removes what finalizing a never-captured id left; nothing else."""
    store = FileTokenStore(capture_dir)

    async def write() -> None:
        await store.freeze("ghost")
        await store.put(make_entry("kept", "c1", [1], [2]))
        await store.freeze("kept")

    anyio.run(write)
    _age_all(capture_dir, 2 * DAY)
    directory = str(capture_dir)
    assert _run("sweep", "--dir", directory, "--retired-older-than", "7d") == 0
    assert run_sync(store.admin.rollout_ids()) == ["ghost", "kept"]
    args = ("sweep", "--dir", directory, "--retired-older-than", "7d", "--empty-older-than", "1d")
    assert _run(*args) == 0
    assert "removed 1 capture(s): 0 retired, 0 abandoned, 1 empty" in capsys.readouterr().out
    assert run_sync(store.admin.rollout_ids()) == ["kept"]


def test_sweep_over_redis_removes_frozen_empty_captures_only_with_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`store sweep --redis` removes an empty frozen capture only with --empty-older-than."""
    url = find_redis_url()
    with unique_prefix(url, "cli-sweep") as prefix:

        async def write() -> None:
            store = RedisTokenStore(url, key_prefix=prefix)
            try:
                await store.freeze("never-captured")  # what finalizing a typo'd id leaves
                await store.put(make_entry("kept", "c1", [1], [2]))
                await store.freeze("kept")  # frozen with an entry: evidence
            finally:
                await store.close()

        anyio.run(write)
        backend = ["--redis", url, "--key-prefix", prefix, "--retired-older-than", "7d"]
        assert _run("sweep", *backend) == 0
        assert "removed 0 capture(s)" in capsys.readouterr().out
        assert _run("sweep", *backend, "--empty-older-than", "0s") == 0
        out = capsys.readouterr().out
        assert "removed never-captured (empty" in out and "removed 1 capture(s)" in out
        assert _run("inspect", "kept", "--redis", url, "--key-prefix", prefix) == 0
        assert _run("inspect", "never-captured", "--redis", url, "--key-prefix", prefix) == 1
