"""POST /retire, called in-process: the round trip, refusals, and bad bodies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.api.conftest import CaptureWriter, SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import record_for
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app


def _finalize(client: httpx.Client, rollout_id: str) -> dict[str, Any]:
    response = client.post("/finalize", json=record_for(rollout_id))
    response.raise_for_status()
    return response.json()


def test_posting_the_finalize_answer_back_retires_the_snapshot(
    client: httpx.Client, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """finalize -> retire with the whole answer: retired, and the store keeps a tombstone."""
    write_capture("r-1")
    retired = client.post("/retire", json=_finalize(client, "r-1")).json()
    assert (retired, file_store.status("r-1")["retired"]) == ({"retired": True}, True)


def test_retire_drops_the_captured_tokens(
    client: httpx.Client, write_capture: CaptureWriter, capture_dir: Path
) -> None:
    """After retire the rollout's token lines are gone from the capture directory."""
    write_capture("r-1")
    client.post("/retire", json=_finalize(client, "r-1"))
    assert not (capture_dir / "r-1.tokens.jsonl").exists()


def test_retiring_twice_answers_true_again(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """Repeating a successful retire is safe and answers retired: true."""
    write_capture("r-1")
    answer = _finalize(client, "r-1")
    client.post("/retire", json=answer)
    assert client.post("/retire", json=answer).json() == {"retired": True}


def test_minimal_retire_body_is_enough(client: httpx.Client, write_capture: CaptureWriter) -> None:
    """`{"rollout_id", "build"}` alone retires (source defaults to sources.default)."""
    write_capture("r-1")
    answer = _finalize(client, "r-1")
    body = {"rollout_id": answer["rollout_id"], "build": answer["build"]}
    assert client.post("/retire", json=body).json() == {"retired": True}


def test_masked_build_is_not_retired(client: httpx.Client, file_store: FileTokenStore) -> None:
    """A masked build answers retired: false and its frozen evidence stays in the store."""
    answer = _finalize(client, "empty")
    retired = client.post("/retire", json=answer).json()
    assert (retired, file_store.status("empty")["retired"]) == ({"retired": False}, False)


def test_null_build_is_not_retired(client: httpx.Client) -> None:
    """A null build (agent not taking part) answers retired: false."""
    assert client.post("/retire", json={"rollout_id": "r-1", "build": None}).json() == {
        "retired": False
    }


def test_stale_snapshot_is_not_retired(
    client: httpx.Client, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """A build naming another version of the snapshot answers false and retires nothing."""
    write_capture("r-1")
    answer = _finalize(client, "r-1")
    answer["build"]["_capture_snapshot"]["version"] += 1
    retired = client.post("/retire", json=answer).json()
    assert (retired, file_store.status("r-1")["retired"]) == ({"retired": False}, False)


def test_retire_uses_the_named_source(make_settings: SettingsFactory, tmp_path: Path) -> None:
    """A finalize answer from `?source=other`, posted back, retires in that source."""
    other_dir = tmp_path / "other"
    settings = make_settings(sources={"other": {"kind": "file", "dir": str(other_dir)}})
    other = FileTokenStore(other_dir)
    import anyio

    from tests.support.captures import agent_rollout

    async def put_all() -> None:
        for entry in agent_rollout("r-7", calls=2, new_tokens_per_turn=20):
            await other.put(entry)

    anyio.run(put_all)
    with in_process(create_app(settings)) as client:
        answer = client.post("/finalize?source=other", json=record_for("r-7")).json()
        client.post("/retire", json=answer)
    assert other.status("r-7")["retired"] is True


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"build": {}}, "retire body needs `rollout_id` (the id finalize answered)"),
        (
            {"rollout_id": None, "build": {}},
            "retire body needs `rollout_id` (the id finalize answered)",
        ),
        ({"rollout_id": "r-1"}, "retire body needs `build` (the build finalize answered)"),
        ({"rollout_id": "r-1", "build": [1]}, "retire body: `build` must be a JSON object or null"),
        (
            {"rollout_id": "r-1", "build": None, "source": 3},
            "retire body: `source` must be a string naming a configured source",
        ),
    ],
)
def test_malformed_retire_body_is_422(
    client: httpx.Client, body: dict[str, Any], message: str
) -> None:
    """A retire body without a usable rollout_id, build or source answers 422 naming it."""
    response = client.post("/retire", json=body)
    assert (response.status_code, response.json()) == (422, {"error": message})


def test_unsafe_rollout_id_is_422(client: httpx.Client) -> None:
    """A rollout_id that is not a safe store key answers 422 quoting it."""
    response = client.post("/retire", json={"rollout_id": "../x", "build": None})
    assert (response.status_code, "'../x'" in response.json()["error"]) == (422, True)


def test_retire_in_unknown_source_is_404(client: httpx.Client) -> None:
    """A retire naming an unconfigured source answers 404."""
    response = client.post("/retire", json={"rollout_id": "r-1", "build": None, "source": "x"})
    assert (response.status_code, response.json()["error"]) == (
        404,
        "unknown source 'x'; configured sources: local",
    )
