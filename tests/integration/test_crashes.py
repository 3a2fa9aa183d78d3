"""Crashes and concurrent processes: the store killed mid-stream, two finalizers at once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import yaml

from tests.support.captures import agent_rollout, record_for
from tests.support.servers import free_port, running_app, running_process
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping
from token_finalizer_client import FinalizerError, HttpTokenSink


def _store_process(directory: Path, port: int) -> AbstractContextManager[subprocess.Popen]:
    return running_process(
        ["store", "serve", "--dir", str(directory), "--port", str(port)], port=port
    )


async def _put_until_killed(
    url: str, rollout_id: str, kill_after: int, kill: Callable[[], None]
) -> list[str]:
    """Put a long chain call by call, killing the store after `kill_after` acks; the acked ids."""
    acked: list[str] = []
    sink = HttpTokenSink(url=url, timeout=5.0, max_retries=0)
    try:
        for entry in agent_rollout(rollout_id, calls=400, new_tokens_per_turn=200):
            if len(acked) == kill_after:
                kill()
            try:
                await sink.put(entry)
            except FinalizerError:
                break
            acked.append(entry["model_call_id"])
    finally:
        await sink.close()
    return acked


def test_store_killed_mid_stream_keeps_every_acknowledged_put(tmp_path: Path) -> None:
    """SIGKILL during puts, restart on the same directory: acked puts survive, torn tail cut."""
    directory = tmp_path / "store"
    port = free_port()
    with _store_process(directory, port) as process:
        url = f"http://127.0.0.1:{port}"
        acked = asyncio.run(
            _put_until_killed(url, "crash-1", 40, lambda: process.send_signal(signal.SIGKILL))
        )
        process.wait(10)
    assert len(acked) >= 40
    jsonl = directory / "crash-1.tokens.jsonl"
    # What a kill in the middle of a write leaves behind: a line never acknowledged.
    with open(jsonl, "ab") as handle:
        handle.write(b'{"created_at":1.0,"generation_log_probs":[-0.1,')

    with _store_process(directory, port):
        settings = settings_from_mapping(
            {"sources": {"store": {"kind": "http", "url": f"http://127.0.0.1:{port}"}}}
        )
        with running_app(create_app(settings)) as finalizer:
            answer = httpx.post(f"{finalizer}/finalize", json=record_for("crash-1"), timeout=60)
    finalized = answer.json()
    assert finalized["build"]["mask_sample"] is False, finalized["build"]
    delivered = [item["arguments"] for item in finalized["record"]["response"]["output"]]
    assert len(delivered) >= len(acked)
    state = stored_state(FileTokenStore(directory), "crash-1")
    assert set(acked) <= set(state.entry_digests)
    assert state.indexed_size == jsonl.stat().st_size
    assert jsonl.read_bytes().endswith(b"\n")


def _serve_process(config: Path, port: int) -> AbstractContextManager[subprocess.Popen]:
    return running_process(["serve", "--config", str(config), "--port", str(port)], port=port)


def test_two_finalizer_processes_agree_on_one_snapshot(tmp_path: Path) -> None:
    """Two services finalizing one rollout at once share one snapshot; retire is exact."""
    directory = tmp_path / "capture"
    store = FileTokenStore(directory)

    async def write() -> None:
        for entry in agent_rollout("shared-1", calls=30, new_tokens_per_turn=300):
            await store.put(entry)

    asyncio.run(write())
    config = tmp_path / "finalizer.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "sources": {"local": {"kind": "file", "dir": str(directory)}},
                "retire": {"key": "replicas-share-this-0123456789abcdef"},
            }
        )
    )
    ports = [free_port(), free_port()]
    with _serve_process(config, ports[0]), _serve_process(config, ports[1]):
        answers: list[dict] = [{}, {}]

        def finalize(index: int) -> None:
            answers[index] = httpx.post(
                f"http://127.0.0.1:{ports[index]}/finalize",
                json=record_for("shared-1"),
                timeout=60,
            ).json()

        threads = [threading.Thread(target=finalize, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        first, second = answers
        assert first["build"]["_capture_snapshot"] == second["build"]["_capture_snapshot"]
        assert first["retirable"] and second["retirable"]
        # One snapshot, one shared key: both processes minted the very same ticket.
        assert first["retire"] == second["retire"]

        other_version = {**second["retire"], "version": second["retire"]["version"] - 1}
        retire = [f"http://127.0.0.1:{port}/retire" for port in ports]
        assert httpx.post(retire[1], json=other_version, timeout=30).status_code == 403
        assert stored_state(store, "shared-1").retired is False
        # Each process accepts the other's ticket; the second retire finds it done.
        assert httpx.post(retire[1], json=first, timeout=30).json() == {"retired": True}
        assert httpx.post(retire[0], json=second, timeout=30).json() == {"retired": True}
        assert httpx.post(retire[0], json=other_version, timeout=30).status_code == 403
    assert stored_state(store, "shared-1").retired is True
    assert not (directory / "shared-1.tokens.jsonl").exists()
