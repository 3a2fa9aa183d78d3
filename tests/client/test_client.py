"""Every client method, sync and async, against a live finalizer service on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.client.conftest import Connect, mark_incomplete, settings_for, write_rollout
from tests.support.captures import record_for
from tests.support.servers import free_port, running_app
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping
from token_finalizer_client import (
    AsyncFinalizerClient,
    Finalized,
    FinalizerClient,
    MaskFractionExceeded,
)


def test_health_answers_ok(api: Any) -> None:
    """health() returns the service's `{"status": "ok"}`."""
    assert api.health() == {"status": "ok"}


def test_ready_when_every_source_is_reachable(api: Any) -> None:
    """ready() is ready with a 200 and names each configured source as reachable."""
    readiness = api.ready()
    assert (readiness.ready, readiness.status_code) == (True, 200)
    assert readiness.body["sources"] == {"local": {"reachable": True}, "other": {"reachable": True}}


@pytest.fixture(scope="module")
def unready_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A service whose second source is a capture store nobody listens for."""
    settings = settings_from_mapping(
        {
            "sources": {
                "default": "local",
                "local": {"kind": "file", "dir": str(tmp_path_factory.mktemp("unready"))},
                "gone": {"kind": "http", "url": f"http://127.0.0.1:{free_port()}"},
            }
        },
        env={},
    )
    with running_app(create_app(settings)) as base:
        yield base


def test_ready_reports_a_503_with_its_details(connect: Connect, unready_url: str) -> None:
    """On a 503 ready() returns not-ready with the body naming the unreachable source."""
    readiness = connect(unready_url).ready()
    assert (readiness.ready, readiness.status_code) == (False, 503)
    assert readiness.body["sources"]["gone"]["reachable"] is False


def test_finalize_returns_the_rebuilt_record(api: Any, local_store: FileTokenStore) -> None:
    """finalize() answers a retirable Finalized whose record carries the captured tokens."""
    rollout_id = write_rollout(local_store)
    finalized = api.finalize(record_for(rollout_id))
    assert isinstance(finalized, Finalized)
    assert (finalized.rollout_id, finalized.source, finalized.retirable) == (
        rollout_id,
        "local",
        True,
    )
    assert finalized.record["response"]["output"][-1]["generation_token_ids"]


def test_retirable_answer_carries_a_retire_object(api: Any, local_store: FileTokenStore) -> None:
    """A clean finalize answers a `retire` object naming the rollout, source and snapshot."""
    rollout_id = write_rollout(local_store)
    retire = api.finalize(record_for(rollout_id)).retire
    assert retire is not None
    assert (retire["rollout_id"], retire["source"]) == (rollout_id, "local")
    assert set(retire) == {"rollout_id", "source", "snapshot_id", "version", "ticket"}


def test_build_no_longer_holds_the_rebuilt_response(api: Any, local_store: FileTokenStore) -> None:
    """The rebuilt output lives once, in the record: the build has no `rebuilt_response`."""
    rollout_id = write_rollout(local_store)
    finalized = api.finalize(record_for(rollout_id))
    assert finalized.build is not None
    assert "rebuilt_response" not in finalized.build


def test_client_record_equals_the_plain_answer(
    api: Any, service_url: str, local_store: FileTokenStore
) -> None:
    """The compact answer, expanded, is the answer the service gives without tokens=compact."""
    rollout_id = write_rollout(local_store, calls=6, new_tokens_per_turn=50)
    record = record_for(rollout_id)
    plain = httpx.post(f"{service_url}/finalize", json=record, timeout=60).json()
    assert "context_token_ids" not in plain
    assert api.finalize(record).to_answer() == plain


def test_numpy_prompts_of_a_live_answer_share_one_array(
    connect: Connect, service_url: str, local_store: FileTokenStore
) -> None:
    """as_numpy=True on a real multi-call answer: every prompt is a view of one base array."""
    rollout_id = write_rollout(local_store, calls=5)
    finalized = connect(service_url, as_numpy=True).finalize(record_for(rollout_id))
    output = finalized.record["response"]["output"]
    views = [item["prompt_token_ids"] for item in output if "prompt_token_ids" in item]
    assert len(views) == 5 and all(isinstance(view, np.ndarray) for view in views)
    assert len({id(view.base) for view in views}) == 1


def test_finalize_of_a_missing_capture_is_masked(api: Any) -> None:
    """A rollout with no capture comes back masked and not retirable, not as an error."""
    finalized = api.finalize(record_for("never-captured"))
    assert (finalized.masked, finalized.retirable, finalized.retire) == (True, False, None)
    assert finalized.build is not None
    assert finalized.build["error"].startswith("capture contains no token records")


def test_finalize_uses_the_named_source(api: Any, other_store: FileTokenStore) -> None:
    """finalize(source=...) freezes in that source and says so in the answer."""
    rollout_id = write_rollout(other_store)
    finalized = api.finalize(record_for(rollout_id), source="other")
    assert (finalized.source, finalized.retirable) == ("other", True)
    assert stored_state(other_store, rollout_id).frozen is True


def test_finalize_of_a_large_rollout_round_trips(api: Any, local_store: FileTokenStore) -> None:
    """A multi-MB answer (sent zstd-compressed) decodes to every generated token."""
    rollout_id = write_rollout(local_store, calls=20, new_tokens_per_turn=2000)
    finalized = api.finalize(record_for(rollout_id))
    metrics = finalized.build["metrics"] if finalized.build else {}
    delivered = sum(
        len(item.get("generation_token_ids", ())) for item in finalized.record["response"]["output"]
    )
    assert delivered == metrics["generated_tokens_delivered"] == 20 * 500


def test_retire_drops_the_consumed_snapshot(api: Any, local_store: FileTokenStore) -> None:
    """retire(finalized) returns True and the store keeps only a retired tombstone."""
    rollout_id = write_rollout(local_store)
    finalized = api.finalize(record_for(rollout_id))
    assert api.retire(finalized) is True
    assert stored_state(local_store, rollout_id).retired is True


def test_retire_by_a_stored_retire_object(api: Any, other_store: FileTokenStore) -> None:
    """retire(dict) retires from the `retire` object of an answer stored as a JSON line."""
    rollout_id = write_rollout(other_store)
    line = json.dumps(api.finalize(record_for(rollout_id), source="other").to_answer())
    assert api.retire(json.loads(line)["retire"]) is True
    assert stored_state(other_store, rollout_id).retired is True


def test_retire_by_a_whole_stored_answer(api: Any, local_store: FileTokenStore) -> None:
    """retire(answer) of a whole stored answer retires its snapshot."""
    rollout_id = write_rollout(local_store)
    answer = json.loads(json.dumps(api.finalize(record_for(rollout_id)).to_answer()))
    assert api.retire(answer) is True
    assert stored_state(local_store, rollout_id).retired is True


def test_retire_of_a_masked_build_keeps_the_evidence(api: Any, local_store: FileTokenStore) -> None:
    """A masked Finalized is not retired: retire() is False and the capture stays."""
    rollout_id = write_rollout(local_store)
    mark_incomplete(local_store, rollout_id)
    finalized = api.finalize(record_for(rollout_id))
    assert (finalized.masked, api.retire(finalized)) == (True, False)
    assert stored_state(local_store, rollout_id).retired is False


def test_retire_twice_is_still_true(api: Any, local_store: FileTokenStore) -> None:
    """Repeating a successful retire answers True again (it is safe to retry)."""
    rollout_id = write_rollout(local_store)
    finalized = api.finalize(record_for(rollout_id))
    api.retire(finalized)
    assert api.retire(finalized) is True


def test_run_id_reaches_the_mask_fraction_guard(connect: Connect, tmp_path: Path) -> None:
    """Each run_id is guarded on its own: one run tripping leaves another run free."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    settings = settings_for(
        tmp_path / "a",
        tmp_path / "b",
        token_id_capture={"max_mask_fraction": 0.5, "mask_fraction_min_samples": 2},
    )
    with running_app(create_app(settings)) as base:
        tripped = connect(base, run_id="run-tripped")
        fresh = connect(base, run_id="run-fresh")
        tripped.finalize(record_for("missing-1"))
        with pytest.raises(MaskFractionExceeded, match="run-tripped"):
            tripped.finalize(record_for("missing-2"))
        assert fresh.finalize(record_for("missing-3")).masked is True


def test_context_manager_closes_the_client(service_url: str) -> None:
    """Leaving `with FinalizerClient(...)` closes its connection pool."""
    with FinalizerClient(service_url) as client:
        client.health()
    assert client._http.is_closed


@pytest.mark.anyio
async def test_async_context_manager_closes_the_client(service_url: str) -> None:
    """Leaving `async with AsyncFinalizerClient(...)` closes its connection pool."""
    async with AsyncFinalizerClient(service_url) as client:
        await client.health()
    assert client.closed and client._http.open_loops() == 0


def test_close_twice_is_harmless(connect: Connect, service_url: str) -> None:
    """close() may be called again after the client was closed."""
    client = connect(service_url)
    client.health()
    client.close()
    client.close()
