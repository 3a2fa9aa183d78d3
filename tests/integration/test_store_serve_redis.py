"""`token-finalizer store serve --redis` as a real process: protocol v1 over a redis store.

One server process serves the module under its own key prefix; each test uses
its own rollout ids. The finalizer side is reached both as raw HTTP and through
the service's `http` source.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
import redis

from tests.support.captures import make_entry, record_for
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.servers import free_port, running_process
from token_finalizer.cli import main
from token_finalizer.cli.store import parse_ttl
from token_finalizer.core.delivery import (
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
)
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer.sources.redis import RedisTokenStore

PASSWORD = "hunter2-s3cret"


@dataclass(frozen=True)
class Served:
    """A running `store serve --redis` process: its base URL, and where its keys live."""

    base: str
    redis_url: str
    prefix: str

    def path(self, rollout_id: str, operation: str) -> str:
        return f"{self.base}/ng-rollout/{rollout_id}/training-token-capture/{operation}"

    def store(self) -> RedisTokenStore:
        return RedisTokenStore(self.redis_url, key_prefix=self.prefix)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """`store serve --redis URL --key-prefix P --retired-ttl 1h` on a free port."""
    url = find_redis_url()
    port = free_port()
    with unique_prefix(url, "served") as prefix:
        args = ["store", "serve", "--redis", url, "--key-prefix", prefix, "--port", str(port)]
        with running_process([*args, "--retired-ttl", "1h"], port=port) as process:
            yield Served(f"http://127.0.0.1:{port}", url, prefix)
        assert process.returncode == 0


def test_writes_and_freeze_go_through_http_into_redis(served: Served) -> None:
    """Puts and an announcement over HTTP; the freeze answers them, as stored in Redis."""
    first, second = make_entry("h1", "c1", [1, 2], [3]), make_entry("h1", "c2", [1, 2, 3], [4])
    with httpx.Client() as http:
        assert http.put(served.path("h1", "calls/c1"), json=first).status_code == 200
        assert http.put(served.path("h1", "calls/c1"), json=first).status_code == 200
        assert http.post(served.path("h1", "intents"), json={"model_call_id": "c3"}).is_success
        assert http.put(served.path("h1", "calls/c2"), json=second).status_code == 200
        answer = http.post(served.path("h1", "freeze")).json()
    assert [e["model_call_id"] for e in answer["entries"]] == ["c1", "c2"]
    assert answer["entries"][1]["prompt_token_ids"] == [1, 2, 3]
    assert (answer["incomplete"], answer["version"]) == (True, 3)
    client = redis.Redis.from_url(served.redis_url)
    state_key = f"{served.prefix}{{ng:h1}}:state"
    assert client.hget(state_key, "snapshot_id") == answer["snapshot_id"].encode()
    client.close()


def test_frozen_and_retired_captures_refuse_writes_over_http(served: Served) -> None:
    """After the freeze a put is 409; after the drop the freeze is 409 too."""
    with httpx.Client() as http:
        http.put(served.path("h2", "calls/c1"), json=make_entry("h2", "c1", [1], [2]))
        frozen = http.post(served.path("h2", "freeze")).json()
        late = http.put(served.path("h2", "calls/c2"), json=make_entry("h2", "c2", [1], [2]))
        ref = {"snapshot_id": frozen["snapshot_id"], "version": frozen["version"]}
        dropped = [http.post(served.path("h2", "drop"), json=ref).json() for _ in range(2)]
        again = http.post(served.path("h2", "freeze"))
    assert (late.status_code, "frozen" in late.json()["error"]) == (409, True)
    assert dropped == [{"dropped": True}, {"dropped": True}]
    assert (again.status_code, "retired" in again.json()["error"]) == (409, True)


def test_retired_ttl_flag_reaches_the_store(served: Served) -> None:
    """--retired-ttl 1h: the tombstone a drop leaves expires within the hour."""
    with httpx.Client() as http:
        frozen = http.post(served.path("h3", "freeze")).json()
        ref = {"snapshot_id": frozen["snapshot_id"], "version": frozen["version"]}
        assert http.post(served.path("h3", "drop"), json=ref).json() == {"dropped": True}
    client = redis.Redis.from_url(served.redis_url)
    ttl = client.pttl(f"{served.prefix}{{ng:h3}}:state")
    client.close()
    assert 3_500_000 < ttl <= 3_600_000


def test_non_finite_log_probs_cross_the_wire(served: Served) -> None:
    """A -Infinity log prob is stored and answered as the JSON token -Infinity."""
    entry = make_entry("h4", "c1", [1], [2, 3], log_probs=[float("-inf"), -0.5])
    body = orjson.dumps(entry).replace(b"null,-0.5", b"-Infinity,-0.5")
    with httpx.Client() as http:
        put = http.put(
            served.path("h4", "calls/c1"),
            content=body,
            headers={"Content-Type": "application/json"},
        )
        answer = http.post(served.path("h4", "freeze"))
    assert put.status_code == 200
    assert b'"generation_log_probs":[-Infinity,-0.5]' in answer.content


@pytest.mark.anyio
async def test_http_source_finalizes_and_retires_from_the_served_store(served: Served) -> None:
    """The finalizer's http source freezes, builds and retires a capture living in Redis."""
    store = served.store()
    await store.put(make_entry("h5", "c1", [1, 2], [3]))
    await store.put(make_entry("h5", "c2", [1, 2, 3, 9], [4]))
    source = HttpTokenSource(url=served.base)
    try:
        build = await finalize_rollout_token_capture(record_for("h5"), source)
        assert build["mask_sample"] is False
        assert await retire_rollout_token_capture("h5", source, build) is True
    finally:
        await source.close()
    status = await store.admin.status("h5")
    await store.close()
    assert status is not None and status.retired is True


# -- refusals before serving -------------------------------------------------------------------


def test_unreachable_redis_exits_2_without_the_password() -> None:
    """A Redis that does not answer stops the server at start-up; the message hides the password."""
    port = free_port()
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    command = ["store", "serve", "--redis", url, "--port", str(port)]
    result = subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", *command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "the store redis://127.0.0.1:" in result.stderr
    assert "redis node 127.0.0.1:" in result.stderr
    assert PASSWORD not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redis", "http://127.0.0.1:6379"], "must start with redis://"),
        (["--redis", "redis://127.0.0.1:6379", "--key-prefix", "{x}"], "no braces"),
        (["--dir", "DIR", "--key-prefix", "x"], "--key-prefix only goes with --redis"),
        (["--dir", "DIR", "--abandoned-ttl", "1d"], "--abandoned-ttl only goes with --redis"),
    ],
)
def test_bad_redis_options_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """A bad URL or prefix, or a redis-only flag with --dir, exits 2 naming the problem."""
    args = [str(tmp_path) if arg == "DIR" else arg for arg in args]
    assert main(["store", "serve", *args]) == 2
    assert message in capsys.readouterr().err


def test_dir_and_redis_exclude_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exactly one of --dir and --redis: both is a usage error."""
    with pytest.raises(SystemExit) as exit_info:
        main(["store", "serve", "--dir", str(tmp_path), "--redis", "redis://127.0.0.1"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90.0), ("7d", 604_800.0), ("never", None)])
def test_ttls_parse_to_seconds_or_never(text: str, seconds: float | None) -> None:
    """A TTL is a duration, or `never`."""
    assert parse_ttl(text) == seconds
