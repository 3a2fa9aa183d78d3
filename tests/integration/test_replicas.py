"""Stateless finalizer replicas as real processes: one store, two finalizers, one guard.

The topology of docker-compose.yml on loopback: `store serve --redis` in
front of Redis, and two `token-finalizer serve` processes (replicas a and b)
with the same configuration: an `http` source on the store server, a direct
`redis` source on the same keys, the mask-fraction guard shared through Redis
and one retire key. Whatever one replica does, the other must see:

- the guard trips on the SUM of both replicas' counts, and then refuses on both;
- a retire ticket issued by replica a retires on replica b;
- a capture written through the store server is finalized through the direct
  redis source just the same.

The last test runs docker-compose.yml's own replica command over
deploy/finalizer.yaml, and examples/compose_smoke.py against it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from tests.support.captures import agent_rollout, record_for
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.servers import free_port, running_process

ROOT = Path(__file__).resolve().parent.parent.parent
EMPTY = "empty_capture"
RETIRE_KEY = "replica-test-retire-key-0123456789"


@dataclass(frozen=True)
class Topology:
    """The running processes' base URLs and where their keys live."""

    store: str
    a: str
    b: str
    redis_url: str
    prefix: str

    @property
    def guard_prefix(self) -> str:
        return f"{self.prefix}guard:"

    def write(self, rollout_id: str) -> None:
        """A small agent rollout written through the store server, as model servers do."""
        with httpx.Client(base_url=self.store, timeout=10) as http:
            for entry in agent_rollout(rollout_id, calls=3, new_tokens_per_turn=16):
                path = (
                    f"/ng-rollout/{rollout_id}/training-token-capture/calls/"
                    f"{entry['model_call_id']}"
                )
                assert http.put(path, json=entry).status_code == 200


def _config(store_url: str, redis_url: str, prefix: str) -> str:
    return f"""\
sources:
  default: store
  store: {{kind: http, url: "{store_url}"}}
  direct: {{kind: redis, url: "{redis_url}", key_prefix: "{prefix}"}}
token_id_capture:
  max_mask_fraction: 0.5
  mask_fraction_min_samples: 4
guard:
  redis: "{redis_url}"
  key_prefix: "{prefix}guard:"
retire:
  key: "{RETIRE_KEY}"
"""


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """Store server on Redis + replicas a and b, each its own `serve` process."""
    url = find_redis_url()
    ports = {name: free_port() for name in ("store", "a", "b")}
    bases = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    config: Path = tmp_path_factory.mktemp("replicas") / "finalizer.yaml"
    with unique_prefix(url, "replicas") as prefix:
        config.write_text(_config(bases["store"], url, prefix))
        store_args = ["store", "serve", "--redis", url, "--key-prefix", prefix]
        with (
            running_process([*store_args, "--port", str(ports["store"])], port=ports["store"]),
            running_process(
                ["serve", "--config", str(config), "--port", str(ports["a"])], port=ports["a"]
            ),
            running_process(
                ["serve", "--config", str(config), "--port", str(ports["b"])], port=ports["b"]
            ),
        ):
            yield Topology(bases["store"], bases["a"], bases["b"], url, prefix)


def _finalize(base: str, rollout_id: str, run: str, *, source: str | None = None) -> httpx.Response:
    params = {} if source is None else {"source": source}
    return httpx.post(
        f"{base}/finalize",
        json=record_for(rollout_id),
        params=params,
        headers={"X-Run-Id": run},
        timeout=30,
    )


def _counts(topology: Topology, run: str) -> dict[str, Any]:
    client = redis.Redis.from_url(topology.redis_url)
    try:
        key = f"{topology.guard_prefix}run:{run}"
        fields = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
        return {"fields": fields, "ttl_ms": client.pttl(key)}
    finally:
        client.close()


def test_guard_trips_on_the_sum_of_both_replicas(topology: Topology) -> None:
    """Masked records alternate between a and b; neither alone has enough, the sum crosses.

    b sees masked, good, masked (2 of 3, below min_samples 4); a sees masked,
    good (1 of 2). Together: 3 masked of 5 > 0.5, so b's third call answers
    409, and every later call of the run, on either replica, too.
    """
    run = "guard-run"
    for rollout_id in ("g-0", "g-1", "late-a", "late-b"):
        topology.write(rollout_id)
    steps = [
        (topology.b, "m-0"),
        (topology.a, "m-1"),
        (topology.b, "g-0"),
        (topology.a, "g-1"),
        (topology.b, "m-2"),
    ]
    answers = [_finalize(base, rollout_id, run) for base, rollout_id in steps]
    later = [_finalize(topology.a, "late-a", run), _finalize(topology.b, "late-b", run)]
    other_run = _finalize(topology.a, "m-3", "another-run")
    assert [answer.status_code for answer in answers] == [200, 200, 200, 200, 409]
    assert [answer.json()["build"]["mask_sample"] for answer in answers[:4]] == [
        True,
        True,
        False,
        False,
    ]
    crossing = answers[-1].json()
    assert (crossing["finalized"], crossing["masked"], crossing["reasons"]) == (5, 3, {EMPTY: 3})
    assert [answer.status_code for answer in later] == [409, 409]
    assert other_run.status_code == 200
    shared = _counts(topology, run)
    assert shared["fields"] == {
        "finalized": "5",
        "masked": "3",
        f"reason:{EMPTY}": "3",
        "tripped": "1",
    }
    assert shared["ttl_ms"] > 0  # the run's counts expire (guard.run_ttl_s)
    # Both replicas counted the refusals in their own metrics.
    refusals = [httpx.get(f"{base}/metrics", timeout=10).text for base in (topology.a, topology.b)]
    assert "token_finalizer_guard_refusals_total 1.0" in refusals[0]
    assert "token_finalizer_guard_refusals_total 2.0" in refusals[1]


def test_a_ticket_from_replica_a_retires_on_replica_b(topology: Topology) -> None:
    """Finalize through a, retire through b: the shared retire key verifies the ticket."""
    topology.write("ticket")
    answer = _finalize(topology.a, "ticket", "retire-run")
    assert answer.status_code == 200
    body = answer.json()
    assert body["retirable"] is True
    retired = httpx.post(f"{topology.b}/retire", json=body["retire"], timeout=30)
    assert (retired.status_code, retired.json()) == (200, {"retired": True})
    # The store moved on: the capture is retired, a second freeze is refused.
    again = httpx.post(
        f"{topology.store}/ng-rollout/ticket/training-token-capture/freeze", timeout=10
    )
    assert again.status_code == 409


def test_a_forged_ticket_is_refused_by_either_replica(topology: Topology) -> None:
    """A ticket whose signature does not verify under the shared key is 403 on both."""
    topology.write("forged")
    body = _finalize(topology.b, "forged", "retire-run").json()
    forged = {**body["retire"], "ticket": "0" * len(body["retire"]["ticket"])}
    statuses = [
        httpx.post(f"{base}/retire", json=forged, timeout=30).status_code
        for base in (topology.a, topology.b)
    ]
    assert statuses == [403, 403]


def test_direct_redis_source_finalizes_what_the_store_server_holds(topology: Topology) -> None:
    """A capture written through the store server is built through `source=direct` too."""
    topology.write("direct")
    answer = _finalize(topology.b, "direct", "direct-run", source="direct")
    body = answer.json()
    assert answer.status_code == 200
    assert (body["source"], body["build"]["mask_sample"], body["retirable"]) == (
        "direct",
        False,
        True,
    )
    retired = httpx.post(f"{topology.a}/retire", json=body["retire"], timeout=30)
    assert retired.json() == {"retired": True}


# -- the compose topology, run as processes -------------------------------------------------


def test_compose_smoke_passes_against_the_deploy_config(tmp_path: Path) -> None:
    """docker-compose.yml's commands and deploy/finalizer.yaml on loopback; the smoke passes.

    The replicas run the compose file's own command (ports and config path
    swapped for local ones) over deploy/finalizer.yaml, given the environment
    compose gives them, with this test's key prefixes; then
    examples/compose_smoke.py runs as the `smoke` service would.
    """
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    url = find_redis_url()
    ports = {name: free_port() for name in ("store", "a", "b")}
    bases = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    env = {
        "CAPTURE_STORE_URL": bases["store"],
        "REDIS_URL": url,
        "CAPTURE_TOKEN": "smoke-store-token",  # the store's writer token
        "STORE_FINALIZER_TOKEN": "smoke-store-finalizer-token",  # the replicas' http source
        "FINALIZER_TOKEN": "smoke-finalizer-token",
        "RETIRE_KEY": "smoke-retire-key-0123456789abcdefgh",
    }
    with unique_prefix(url, "compose") as prefix:
        config = yaml.safe_load((ROOT / "deploy" / "finalizer.yaml").read_text())
        config["sources"]["redis"]["key_prefix"] = prefix
        config["guard"]["key_prefix"] = f"{prefix}guard:"
        config_path = tmp_path / "finalizer.yaml"
        config_path.write_text(yaml.safe_dump(config))
        store_args = ["store", "serve", "--redis", url, "--key-prefix", prefix]
        # A token per role, as docker-compose.yml gives the store.
        store_env = {
            "TOKEN_FINALIZER_STORE_WRITER_TOKENS": env["CAPTURE_TOKEN"],
            "TOKEN_FINALIZER_STORE_FINALIZER_TOKENS": env["STORE_FINALIZER_TOKEN"],
            "TOKEN_FINALIZER_STORE_CONTROL_TOKENS": "smoke-store-control-token",
        }

        def replica(name: str) -> list[str]:
            command = list(compose["services"][f"finalizer-{name}"]["command"][1:])
            for flag, value in [
                ("--config", str(config_path)),
                ("--host", "127.0.0.1"),
                ("--port", str(ports[name])),
            ]:
                command[command.index(flag) + 1] = value
            return command

        with (
            running_process(
                [*store_args, "--port", str(ports["store"])], port=ports["store"], env=store_env
            ),
            running_process(replica("a"), port=ports["a"], env=env),
            running_process(replica("b"), port=ports["b"], env=env),
        ):
            smoke_env = {
                **os.environ,
                **env,
                "FINALIZER_A_URL": bases["a"],
                "FINALIZER_B_URL": bases["b"],
            }
            result = subprocess.run(
                [sys.executable, str(ROOT / "examples" / "compose_smoke.py")],
                env=smoke_env,
                capture_output=True,
                text=True,
                timeout=120,
            )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke test passed" in result.stdout
