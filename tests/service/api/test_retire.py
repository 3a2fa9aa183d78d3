"""POST /retire, called in-process: the round trip, refusals, and bad bodies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.service.api.conftest import CaptureWriter, SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import agent_rollout, record_for
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.service.tickets import TicketSigner


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
    assert (retired, stored_state(file_store, "r-1").retired) == ({"retired": True}, True)


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


def test_bare_retire_object_is_enough(client: httpx.Client, write_capture: CaptureWriter) -> None:
    """The answer's `retire` object alone retires (the whole answer is not needed)."""
    write_capture("r-1")
    ticket = _finalize(client, "r-1")["retire"]
    assert client.post("/retire", json=ticket).json() == {"retired": True}


def test_masked_build_is_not_retired(client: httpx.Client, file_store: FileTokenStore) -> None:
    """A masked answer posted back is 422 (not retirable) and its frozen evidence stays."""
    answer = _finalize(client, "empty")
    response = client.post("/retire", json=answer)
    assert (response.status_code, stored_state(file_store, "empty").retired) == (422, False)
    assert response.json()["error"].startswith("this finalize answer is not retirable")


def test_null_build_is_not_retired(make_settings: SettingsFactory) -> None:
    """An answer with a null build (agent not taking part) has no ticket: 422."""
    settings = make_settings(token_id_capture={"enabled": False})
    with in_process(create_app(settings)) as client:
        answer = _finalize(client, "r-1")
        response = client.post("/retire", json=answer)
    assert (answer["build"], answer["retire"], response.status_code) == (None, None, 422)


def test_stale_snapshot_is_not_retired(
    client: httpx.Client, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """A genuine ticket for a snapshot the store moved past answers 409 and retires nothing."""
    write_capture("r-1")
    answer = _finalize(client, "r-1")
    anyio.run(file_store.mark_incomplete, "r-1", "late")
    response = client.post("/retire", json=answer)
    assert (response.status_code, response.json()["retired"]) == (409, False)
    assert stored_state(file_store, "r-1").retired is False


def test_retire_uses_the_named_source(make_settings: SettingsFactory, tmp_path: Path) -> None:
    """A finalize answer from `?source=other`, posted back, retires in that source."""
    other_dir = tmp_path / "other"
    settings = make_settings(sources={"other": {"kind": "file", "dir": str(other_dir)}})
    other = FileTokenStore(other_dir)

    async def put_all() -> None:
        for entry in agent_rollout("r-7", calls=2, new_tokens_per_turn=20):
            await other.put(entry)

    anyio.run(put_all)
    with in_process(create_app(settings)) as client:
        answer = client.post("/finalize?source=other", json=record_for("r-7")).json()
        client.post("/retire", json=answer)
    assert stored_state(other, "r-7").retired is True


_TICKET = {
    "rollout_id": "r-1",
    "source": "local",
    "snapshot_id": "0" * 32,
    "version": 3,
    "ticket": "0" * 64,
}


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in _TICKET.items() if k != key}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            _without("rollout_id"),
            "retire needs `rollout_id` (post the finalize answer's `retire` object)",
        ),
        (
            {**_TICKET, "rollout_id": None},
            "retire needs `rollout_id` (post the finalize answer's `retire` object)",
        ),
        (_without("source"), "retire needs `source` (post the finalize answer's `retire` object)"),
        (
            _without("snapshot_id"),
            "retire needs `snapshot_id` (post the finalize answer's `retire` object)",
        ),
        (
            _without("version"),
            "retire needs `version` (post the finalize answer's `retire` object)",
        ),
        (_without("ticket"), "retire needs `ticket` (post the finalize answer's `retire` object)"),
        ({**_TICKET, "version": "3"}, "retire: `version` must be a JSON integer, got '3'"),
        ({**_TICKET, "version": True}, "retire: `version` must be a JSON integer, got True"),
        ({**_TICKET, "version": 3.5}, "retire: `version` must be a JSON integer, got 3.5"),
        ({**_TICKET, "source": 3}, "retire: `source` must be a JSON string, got 3"),
        ({"retire": [1]}, "retire: `retire` must be the object finalize answered"),
    ],
)
def test_malformed_retire_body_is_422(
    client: httpx.Client, body: dict[str, Any], message: str
) -> None:
    """A retire body without a usable ticket field answers 422 naming it."""
    response = client.post("/retire", json=body)
    assert (response.status_code, response.json()) == (422, {"error": message})


def test_v1_retire_body_is_422(client: httpx.Client) -> None:
    """The v1 body `{rollout_id, build}` carries no ticket: 422, nothing retired."""
    response = client.post("/retire", json={"rollout_id": "r-1", "build": None})
    assert response.status_code == 422


_KEY = "retire-test-key-0123456789abcdefgh"


def _signed(rollout_id: str, source: str) -> dict[str, Any]:
    """A genuine ticket under the key `_KEY`, for a snapshot no store holds."""
    return TicketSigner(_KEY.encode()).issue(rollout_id, source, "0" * 32, 1)


def test_unsafe_rollout_id_is_422(make_settings: SettingsFactory) -> None:
    """A genuine ticket whose rollout_id is not a safe store key answers 422 quoting it."""
    with in_process(create_app(make_settings(retire={"key": _KEY}))) as client:
        response = client.post("/retire", json=_signed("../x", "local"))
    assert (response.status_code, "'../x'" in response.json()["error"]) == (422, True)


def test_retire_in_unknown_source_is_404(make_settings: SettingsFactory) -> None:
    """A genuine ticket naming a source this service does not configure answers 404."""
    with in_process(create_app(make_settings(retire={"key": _KEY}))) as client:
        response = client.post("/retire", json=_signed("r-1", "x"))
    assert (response.status_code, response.json()["error"]) == (
        404,
        "unknown source 'x'; configured sources: local",
    )
