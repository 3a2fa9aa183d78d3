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

from collections.abc import Iterator
from typing import Any

import nemo_gym.token_id_capture.lineage as gym_lineage
import pytest
import responses_api_models.vllm_model.tests.test_external_capture_streaming as gym_tests
from responses_api_models.vllm_model.tests.test_external_capture_streaming import *  # noqa: F403

from tests.support.servers import running_app
from token_finalizer import MemoryTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer_client import HttpCaptureLedger, HttpStagingSink, HttpStagingSource


@pytest.fixture(autouse=True)
def our_classes(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh store server; Gym's ledger and the worker's staging replaced by ours over it."""
    with running_app(create_store_app(MemoryTokenStore())) as url:
        sink, source = HttpStagingSink(url), HttpStagingSource(url)
        ledgers: list[HttpCaptureLedger] = []

        def ledger(*args: Any, **kwargs: Any) -> HttpCaptureLedger:
            ledgers.append(HttpCaptureLedger(url))
            return ledgers[-1]

        def stage(worker: Any, record: Any, *, attachments: Any = None) -> Any:
            result = sink.stage(record, attachments=attachments)
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
    # Both the server's ledger (from Gym's config) and the harness's were ours.
    assert len(ledgers) >= 2
