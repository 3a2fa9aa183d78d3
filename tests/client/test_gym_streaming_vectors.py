"""Gym's external-capture streaming scenarios replayed on our ledger and staging classes (no Gym).

`tests/gym_wheel/test_external_capture_streaming.py` (run by hand with Gym
0.7.0) runs Gym's own streaming tests on `HttpCaptureLedger`,
`HttpStagingSink` and `HttpStagingSource`, and commits, per test, every
write Gym made (stages, ledger records, failure rows, with their outcomes),
then the manifest and staged snapshots the store held at the end
(`tests/vectors/nemo_gym_0_7_streaming/streaming.json`). Here each scenario's
writes are replayed through the same classes, every ledger call on an event
loop of its own, one ledger object for all of them, into a fresh store:
each outcome and the final state must be Gym's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import running_app
from token_finalizer import MemoryTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer_client import HttpCaptureLedger, HttpStagingSink, HttpStagingSource

VECTORS = Path(__file__).resolve().parents[1] / "vectors/nemo_gym_0_7_streaming/streaming.json"
SCENARIOS: dict[str, Any] = json.loads(VECTORS.read_text())


class StorePerScenario:
    """One ASGI server holding a fresh store per scenario, at `/s/{n}/...`.

    Gym's tests all write rollout `r1`, and the digests bind it, so each
    scenario needs a store of its own; one server for all of them keeps the
    module quick. The prefix is cut from `path` and `raw_path` alike (the
    store decodes call ids from the raw path).
    """

    def __init__(self) -> None:
        self.apps: dict[str, Any] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        parts = scope["path"].split("/", 3)
        if len(parts) < 4 or parts[1] != "s":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        app = self.apps.setdefault(parts[2], create_store_app(MemoryTokenStore()))
        prefix = len(parts[1]) + len(parts[2]) + 2
        raw = scope.get("raw_path") or scope["path"].encode()
        inner = {**scope, "path": scope["path"][prefix:], "raw_path": raw[prefix:]}
        await app(inner, receive, send)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """The module's one server; a scenario's store is at `{server_url}/s/{scenario index}`."""
    with running_app(StorePerScenario()) as url:
        yield url


async def _outcome(call: Any) -> str:
    try:
        await call
    except Exception as exc:  # the outcome is compared with Gym's, by class name
        return type(exc).__name__
    return "ok"


def replay(url: str, events: list[Any]) -> list[str]:
    """Every event's outcome, ledger calls each on a fresh `asyncio.run`."""
    ledger = HttpCaptureLedger(url)
    outcomes: list[str] = []
    with HttpStagingSink(url) as sink:
        for kind, payload, _ in events:
            if kind == "stage":
                outcomes.append("ok" if sink.stage(payload).ok else "failed")
            elif kind == "record":
                outcomes.append(asyncio.run(_outcome(ledger.record(payload))))
            else:
                outcomes.append(asyncio.run(_outcome(ledger.record_failure(*payload))))
    asyncio.run(ledger.close())
    return outcomes


def final_state(url: str) -> dict[str, Any]:
    """The manifest and the committed calls' base snapshots, as the vectors hold them."""

    async def manifest() -> Any:
        async with HttpCaptureLedger(url) as ledger:
            return await ledger.manifest("r1")

    rows = asyncio.run(manifest())
    keys = [row["staging_key"] for row in rows["records"]]
    with HttpStagingSource(url) as source:
        return {"manifest": rows, "snapshots": [s.to_json() for s in source.fetch(keys)]}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_replays_to_gyms_outcome(name: str, server_url: str) -> None:
    """Each write answers as it did under Gym, and the store ends in Gym's state."""
    scenario = SCENARIOS[name]
    url = f"{server_url}/s/{sorted(SCENARIOS).index(name)}"
    outcomes = replay(url, scenario["events"])
    state = final_state(url)
    assert outcomes == [event[2] for event in scenario["events"]]
    expected = {"manifest": scenario["manifest"], "snapshots": scenario["snapshots"]}
    assert state == expected
