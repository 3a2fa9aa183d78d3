"""`token-finalizer store serve` (a real process) and `token-finalizer store sweep`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import httpx
import orjson
import pytest

from tests.support.captures import make_entry
from tests.support.servers import free_port, running_process
from tests.support.stores import run_sync, stored_state
from token_finalizer import FileTokenStore
from token_finalizer.cli import main
from token_finalizer.cli.store import STORE_TOKEN_ENV_VAR, parse_duration
from token_finalizer.cli.store.serve import ROLE_TOKENS_ENV_VARS

DAY = 86_400.0


# -- store serve -------------------------------------------------------------------------


def test_store_serve_writes_into_its_directory(capture_dir: Path) -> None:
    """The served process answers /health and a put lands in --dir."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running_process(
        ["store", "serve", "--dir", str(capture_dir), "--port", str(port)], port=port
    ):
        health = httpx.get(base + "/health").json()
        put = httpx.put(
            base + "/ng-rollout/s1/training-token-capture/calls/c1",
            json=make_entry("s1", "c1", [1], [2]),
        )
    assert (health, put.status_code) == ({"status": "ok"}, 200)
    assert stored_state(FileTokenStore(capture_dir), "s1").version == 1


@pytest.mark.parametrize("where", ["flag", "environment"])
def test_store_serve_requires_the_token(capture_dir: Path, where: str) -> None:
    """A token from --token or $TOKEN_FINALIZER_STORE_TOKEN guards every path but /health."""
    port = free_port()
    args = ["store", "serve", "--dir", str(capture_dir), "--port", str(port)]
    env = {STORE_TOKEN_ENV_VAR: "s3cret"} if where == "environment" else {}
    if where == "flag":
        args += ["--token", "s3cret"]
    freeze = f"http://127.0.0.1:{port}/ng-rollout/s1/training-token-capture/freeze"
    with running_process(args, port=port, env=env):
        statuses = (
            httpx.post(freeze).status_code,
            httpx.post(freeze, headers={"Authorization": "Bearer s3cret"}).status_code,
        )
    assert statuses == (401, 200)


def test_store_serve_warns_when_public_without_a_token(
    capture_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Binding beyond loopback with no token prints a warning, then serves as asked."""
    import uvicorn

    calls: list[uvicorn.Config] = []

    async def serve(server: uvicorn.Server) -> None:
        calls.append(server.config)

    monkeypatch.setattr(uvicorn.Server, "serve", serve)
    monkeypatch.delenv(STORE_TOKEN_ENV_VAR, raising=False)
    code = main(["store", "serve", "--dir", str(capture_dir), "--host", "0.0.0.0", "--port", "9"])
    assert (code, calls[0].host, calls[0].port) == (0, "0.0.0.0", 9)
    assert "without a token" in capsys.readouterr().err


def _started(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], args: list[str]
) -> tuple[int, str]:
    """Run `store serve ARGS` up to the point it would serve: exit status and stderr."""
    import uvicorn

    async def serve(server: uvicorn.Server) -> None:
        return None

    monkeypatch.setattr(uvicorn.Server, "serve", serve)
    for name in (STORE_TOKEN_ENV_VAR, *ROLE_TOKENS_ENV_VARS.values()):
        monkeypatch.delenv(name, raising=False)
    code = main(["store", "serve", *args])
    return code, capsys.readouterr().err


def test_store_serve_warns_that_a_single_token_holds_every_role(
    capture_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--token` alone starts with a warning saying what it allows and how to split it."""
    code, err = _started(monkeypatch, capsys, ["--dir", str(capture_dir), "--token", "t"])
    assert code == 0
    assert "--token is valid for every role" in err and "freeze any live rollout" in err
    assert "--writer-token, --finalizer-token, --control-token" in err


def test_store_serve_with_a_token_per_role_starts_without_a_token_warning(
    capture_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token for each role: nothing to warn about."""
    roles = ["--writer-token", "w", "--finalizer-token", "f", "--control-token", "c"]
    code, err = _started(monkeypatch, capsys, ["--dir", str(capture_dir), *roles])
    assert (code, err) == (0, "")


def test_store_serve_warns_about_a_role_without_a_token(
    capture_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Role tokens given, the control role left out: its routes are refused to all, said once."""
    roles = ["--writer-token", "w", "--finalizer-token", "f"]
    code, err = _started(monkeypatch, capsys, ["--dir", str(capture_dir), *roles])
    assert code == 0
    (line,) = err.splitlines()
    assert orjson.loads(line)["message"] == (
        "warning: no control token is configured: control routes are refused to all"
    )


def test_store_serve_warns_about_one_token_in_two_roles(
    capture_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same token as writer and finalizer holds both roles: said at start."""
    roles = ["--writer-token", "x", "--finalizer-token", "x", "--control-token", "c"]
    code, err = _started(monkeypatch, capsys, ["--dir", str(capture_dir), *roles])
    assert code == 0 and "several roles (writer+finalizer)" in err


def test_store_serve_refuses_an_empty_role_token(
    capture_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty --writer-token exits 2 naming the option."""
    assert main(["store", "serve", "--dir", str(capture_dir), "--writer-token", ""]) == 2
    assert "--writer-token is empty" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--finalizer-token", "--token"])
def test_store_serve_refuses_a_token_of_spaces(
    capture_dir: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    """A token of spaces only (no request can bear it: HTTP strips them) exits 2 like ''."""
    assert main(["store", "serve", "--dir", str(capture_dir), option, " "]) == 2
    assert f"{option} is empty" in capsys.readouterr().err


@pytest.mark.parametrize("value", [",", " ", " , "], ids=["comma", "space", "spaced-comma"])
def test_store_serve_refuses_a_token_variable_holding_no_token(
    capture_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    """`$TOKEN_FINALIZER_STORE_WRITER_TOKENS=','` (or spaces) exits 2 naming it, never open."""
    monkeypatch.setenv("TOKEN_FINALIZER_STORE_WRITER_TOKENS", value)
    assert main(["store", "serve", "--dir", str(capture_dir)]) == 2
    assert "$TOKEN_FINALIZER_STORE_WRITER_TOKENS is set but holds no token" in (
        capsys.readouterr().err
    )


def test_store_serve_refuses_an_empty_token(
    capture_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty --token exits 2 rather than serving without auth by accident."""
    assert main(["store", "serve", "--dir", str(capture_dir), "--token", ""]) == 2
    assert "--token is empty" in capsys.readouterr().err


# -- store sweep -------------------------------------------------------------------------


def _age(directory: Path, rollout_id: str, seconds: float) -> None:
    """Make every file of one capture look `seconds` old."""
    then = time.time() - seconds
    for path in directory.glob(f"{rollout_id}.tokens*"):
        os.utime(path, (then, then))


async def _capture(store: FileTokenStore, rollout_id: str, *, freeze: bool, drop: bool) -> None:
    await store.put(make_entry(rollout_id, "c1", [1], [2]))
    if freeze:
        snapshot = await store.freeze(rollout_id)
        if drop:
            await store.drop(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version)


@pytest.fixture
def aged_store(capture_dir: Path) -> Path:
    """Captures ten days old: retired, frozen-not-retired, never frozen; plus a fresh tombstone."""
    store = FileTokenStore(capture_dir)

    async def write() -> None:
        await _capture(store, "retired-old", freeze=True, drop=True)
        await _capture(store, "frozen-old", freeze=True, drop=False)
        await _capture(store, "open-old", freeze=False, drop=False)
        await _capture(store, "retired-new", freeze=True, drop=True)

    anyio.run(write)
    for rollout_id in ("retired-old", "frozen-old", "open-old"):
        _age(capture_dir, rollout_id, 10 * DAY)
    return capture_dir


def _sweep(directory: Path, *options: str) -> int:
    return main(["store", "sweep", "--dir", str(directory), *options])


def test_dry_run_lists_but_removes_nothing(
    aged_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--dry-run prints what would go and leaves every file in place."""
    before = sorted(aged_store.iterdir())
    assert _sweep(aged_store, "--retired-older-than", "7d", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "would remove retired-old (retired, 10d old)" in out
    assert "would remove 1 capture(s): 1 retired, 0 abandoned (dry run)" in out
    assert sorted(aged_store.iterdir()) == before


def test_sweep_removes_old_tombstones_only(
    aged_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Old tombstones go; a fresh tombstone, a frozen capture and an open one stay."""
    assert _sweep(aged_store, "--retired-older-than", "7d") == 0
    assert run_sync(FileTokenStore(aged_store).admin.rollout_ids()) == [
        "frozen-old",
        "open-old",
        "retired-new",
    ]
    assert "removed retired-old (retired, 10d old)" in capsys.readouterr().out


def test_abandoned_captures_go_only_when_asked(
    aged_store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--abandoned-older-than removes old never-frozen captures, never a frozen unretired one."""
    assert _sweep(aged_store, "--retired-older-than", "7d", "--abandoned-older-than", "1h") == 0
    assert run_sync(FileTokenStore(aged_store).admin.rollout_ids()) == ["frozen-old", "retired-new"]
    assert "removed 2 capture(s): 1 retired, 1 abandoned" in capsys.readouterr().out


def test_frozen_unretired_capture_survives_any_age(aged_store: Path) -> None:
    """Even with both thresholds at zero, a frozen capture that was not retired is kept."""
    _sweep(aged_store, "--retired-older-than", "0s", "--abandoned-older-than", "0s")
    assert run_sync(FileTokenStore(aged_store).admin.rollout_ids()) == ["frozen-old"]


def test_sweep_of_a_missing_directory_fails_without_creating_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --dir that does not exist exits 2 and is not created."""
    missing = tmp_path / "typo"
    assert _sweep(missing, "--retired-older-than", "1d") == 2
    assert (missing.exists(), "is not a directory" in capsys.readouterr().err) == (False, True)


def test_bad_duration_is_a_usage_error(
    capture_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A duration without a unit exits 2 naming the accepted forms."""
    with pytest.raises(SystemExit) as exit_info:
        _sweep(capture_dir, "--retired-older-than", "7")
    assert exit_info.value.code == 2
    assert "30s, 15m, 12h or 7d" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("15m", 900.0), ("12h", 43_200.0), ("7d", 604_800.0), ("1.5h", 5400.0)],
)
def test_durations_parse_to_seconds(text: str, seconds: float) -> None:
    """Each unit converts to seconds."""
    assert parse_duration(text) == seconds
