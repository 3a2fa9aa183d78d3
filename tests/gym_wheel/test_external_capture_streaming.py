"""Gym's own external-capture streaming tests, on our ledger, staging sink and staging source.

NeMo Gym 0.7.0 ships `responses_api_models/vllm_model/tests/test_external_capture_streaming.py`
(116 tests: four dialects, streaming, evaluation mode, synthetic completions,
the Megatron backend). Its tests are collected here unmodified; only the
classes they load change, as an integrator's configuration changes them:

- the model server's ledger, `FileLineageStore` (loaded from Gym's config
  and built by the harness), is our `HttpCaptureLedger`;
- the worker stages through our `HttpStagingSink` and fetches through our
  `HttpStagingSource` (it keeps its own copy of each record too, which the
  tests count and the fake worker reads prefixes from).

Each test gets a store server of its own: Gym's tests all write rollout `r1`.
The control-route manifest read runs in Starlette's TestClient portal (its own
loop), the rest in the test's loop: our pools follow both (docs/architecture.md#event-loops).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nemo_gym.token_id_capture.lineage as gym_lineage
import pytest
import responses_api_models.vllm_model.tests.test_external_capture_streaming as gym_tests
from responses_api_models.vllm_model.tests.test_external_capture_streaming import *  # noqa: F403

from tests.support.servers import running_app
from token_finalizer import MemoryTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer_client import HttpCaptureLedger, HttpStagingSink, HttpStagingSource

VECTORS = Path(__file__).resolve().parents[1] / "vectors/nemo_gym_0_7_streaming/streaming.json"


class RecordingLedger(HttpCaptureLedger):
    """Our ledger, noting each write Gym makes through it (and its outcome) in `events`."""

    def __init__(self, url: str, events: list[Any]) -> None:
        super().__init__(url)
        self.events = events

    async def record(self, commit: Any) -> None:
        row = commit.model_dump(mode="json") if hasattr(commit, "model_dump") else dict(commit)
        try:
            await super().record(commit)
        except Exception as exc:
            self.events.append(["record", row, type(exc).__name__])
            raise
        self.events.append(["record", row, "ok"])

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        await super().record_failure(rollout_id, model_call_id, reason)
        self.events.append(["failure", [rollout_id, model_call_id, reason], "ok"])


def _final_state(url: str) -> dict[str, Any]:
    """The rollout's manifest and the base snapshots of its committed calls, as JSON."""

    async def manifest() -> Any:
        async with HttpCaptureLedger(url) as ledger:
            return await ledger.manifest("r1")

    rows = asyncio.run(manifest())
    keys = [row["staging_key"] for row in rows["records"]]
    with HttpStagingSource(url) as source:
        snapshots = [snapshot.model_dump(mode="json") for snapshot in source.fetch(keys)]
    return {"manifest": rows, "snapshots": snapshots}


def _write_vector(name: str, vector: dict[str, Any]) -> None:
    """Add one test's vector to the committed file (GYM_WRITE_VECTORS=1 only)."""
    VECTORS.parent.mkdir(parents=True, exist_ok=True)
    vectors = json.loads(VECTORS.read_text()) if VECTORS.exists() else {}
    vectors[name] = vector
    VECTORS.write_text(json.dumps(vectors, indent=1, sort_keys=True) + "\n")


@pytest.fixture(autouse=True)
def our_classes(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh store server; Gym's ledger and the worker's staging replaced by ours over it."""
    with running_app(create_store_app(MemoryTokenStore())) as url:
        sink, source = HttpStagingSink(url), HttpStagingSource(url)
        ledgers: list[HttpCaptureLedger] = []
        events: list[Any] = []

        def ledger(*args: Any, **kwargs: Any) -> HttpCaptureLedger:
            ledgers.append(RecordingLedger(url, events))
            return ledgers[-1]

        def stage(worker: Any, record: Any, *, attachments: Any = None) -> Any:
            result = sink.stage(record, attachments=attachments)
            outcome = "ok" if result.ok else "failed"
            events.append(["stage", record.model_dump(mode="json"), outcome])
            if result.ok:
                worker.records[result.staging_key] = record
            return result

        def fetch(worker: Any, keys: Any) -> list[Any]:
            return source.fetch(keys)

        monkeypatch.setattr(gym_lineage, "FileLineageStore", ledger)
        monkeypatch.setattr(gym_tests, "FileLineageStore", ledger)
        monkeypatch.setattr(gym_tests._Worker, "stage", stage)
        monkeypatch.setattr(gym_tests._Worker, "fetch", fetch)
        yield url
        sink.close()
        source.close()
        if os.environ.get("GYM_WRITE_VECTORS") == "1" and events:
            _write_vector(request.node.name, {"events": events, **_final_state(url)})
    # Whatever Gym wrote went through our ledger (a test refused at setup writes nothing).
    assert ledgers or not events
