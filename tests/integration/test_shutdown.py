"""SIGTERM with finalizes in flight: /ready turns 503, every request completes, none is cut."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import httpx
import yaml

from tests.support.captures import agent_rollout, record_for
from tests.support.servers import free_port, running_process
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore


def _write_captures(directory: Path, count: int) -> list[str]:
    store = FileTokenStore(directory)
    ids = [f"drain-{i}" for i in range(count)]

    async def write() -> None:
        for rollout_id in ids:
            for entry in agent_rollout(rollout_id, calls=60, new_tokens_per_turn=800):
                await store.put(entry)

    asyncio.run(write())
    return ids


def test_sigterm_drains_in_flight_finalizes_and_reports_not_ready(tmp_path: Path) -> None:
    """In-flight finalizes answer 200 after SIGTERM while /ready already answers 503."""
    directory = tmp_path / "capture"
    ids = _write_captures(directory, 6)
    config = tmp_path / "finalizer.yaml"
    config.write_text(
        yaml.safe_dump({"sources": {"local": {"kind": "file", "dir": str(directory)}}})
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = ["serve", "--config", str(config), "--port", str(port), "--drain-seconds", "3"]
    with running_process(args, port=port) as process:
        statuses: dict[str, int] = {}

        def finalize(rollout_id: str) -> None:
            answer = httpx.post(f"{base}/finalize", json=record_for(rollout_id), timeout=120)
            statuses[rollout_id] = answer.status_code

        threads = [threading.Thread(target=finalize, args=(i,)) for i in ids]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # the finalizes are now in flight (each takes a while)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        ready = httpx.get(f"{base}/ready", timeout=10)
        health = httpx.get(f"{base}/health", timeout=10)
        for thread in threads:
            thread.join(120)
        process.wait(60)
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert health.status_code == 200
    assert statuses == dict.fromkeys(ids, 200)
    store = FileTokenStore(directory)
    assert all(stored_state(store, i).frozen for i in ids)
