"""Retire tickets: only a ticket this service's key signed retires, and only its exact snapshot.

A finalize answer's `retire` object is the proof that a clean build consumed
one snapshot. Editing it, grafting it onto another rollout, replaying it after
the store moved on, or presenting one signed under another key retires
nothing; masked builds (evidence) never get one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from tests.service.api.conftest import CaptureWriter, SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import make_entry, record_for
from tests.support.stores import stored_state
from token_finalizer import CaptureFrozen, FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.service.tickets import TicketSigner
from token_finalizer.settings import Settings, settings_from_mapping

KEY = "retire-key-of-the-tests-0123456789"


@pytest.fixture
def keyed(make_settings: SettingsFactory) -> Iterator[httpx.Client]:
    """A client of an app configured with `retire.key` = KEY (the usual deployment)."""
    with in_process(create_app(make_settings(retire={"key": KEY}))) as client:
        yield client


@pytest.fixture
def ticket(keyed: httpx.Client, write_capture: CaptureWriter) -> dict[str, Any]:
    """The `retire` object of a clean build of capture r-1, finalized by `keyed`."""
    write_capture("r-1")
    answer: dict[str, Any] = _finalize(keyed, "r-1")["retire"]
    return answer


def _finalize(client: httpx.Client, rollout_id: str) -> dict[str, Any]:
    response = client.post("/finalize", json=record_for(rollout_id))
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


def _write_two_roots(store: FileTokenStore, rollout_id: str) -> None:
    """A capture that freezes fine but builds masked (multiple_roots): a snapshot, no ticket."""

    async def put_all() -> None:
        await store.put(make_entry(rollout_id, "a", [1, 2], [3], created_at=1.0))
        await store.put(make_entry(rollout_id, "b", [7, 8], [9], created_at=2.0))

    anyio.run(put_all)


def _kept(store: FileTokenStore, rollout_id: str) -> bool:
    """Whether the rollout's capture is still in the store (not retired, data files present)."""
    status = stored_state(store, rollout_id)
    jsonl = store.directory / f"{rollout_id}.tokens.jsonl"
    return status is not None and status.retired is False and jsonl.exists()


# -- genuine tickets ---------------------------------------------------------------------


def test_valid_ticket_retires(
    keyed: httpx.Client, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """The `retire` object of a clean build retires exactly its snapshot."""
    write_capture("r-1")
    response = keyed.post("/retire", json=_finalize(keyed, "r-1")["retire"])
    assert (response.status_code, response.json()) == (200, {"retired": True})
    assert stored_state(file_store, "r-1").retired is True


def test_valid_ticket_retires_again(keyed: httpx.Client, ticket: dict[str, Any]) -> None:
    """Presenting a ticket whose snapshot is already retired answers true again (idempotent)."""
    keyed.post("/retire", json=ticket)
    response = keyed.post("/retire", json=ticket)
    assert (response.status_code, response.json()) == (200, {"retired": True})


# -- masked builds: evidence, never retired -------------------------------------------------


def test_masked_build_answer_retires_nothing(
    keyed: httpx.Client, file_store: FileTokenStore
) -> None:
    """A masked build's answer (a frozen snapshot, but no ticket) posted back retires nothing."""
    _write_two_roots(file_store, "masked")
    answer = _finalize(keyed, "masked")
    assert (answer["build"]["mask_reason"], answer["retire"]) == ("multiple_roots", None)
    assert keyed.post("/retire", json=answer).status_code == 422
    assert _kept(file_store, "masked")


def test_stripped_mask_sample_cannot_retire(
    keyed: httpx.Client, file_store: FileTokenStore
) -> None:
    """A masked answer edited to look clean (mask marks stripped) still has no ticket: 422."""
    _write_two_roots(file_store, "masked")
    answer = _finalize(keyed, "masked")
    build = {k: v for k, v in answer["build"].items() if k not in ("mask_sample", "mask_reason")}
    record = {k: v for k, v in answer["record"].items() if k != "mask_sample"}
    edited = {**answer, "record": record, "build": {**build, "mask_sample": False}}
    response = keyed.post("/retire", json={**edited, "retirable": True})
    assert response.status_code == 422
    assert _kept(file_store, "masked")


def test_ticket_grafted_from_another_rollout_is_403(
    keyed: httpx.Client, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """A clean rollout's ticket re-pointed at a masked rollout's snapshot is 403."""
    write_capture("clean")
    _write_two_roots(file_store, "masked")
    ticket = _finalize(keyed, "clean")["retire"]
    masked = _finalize(keyed, "masked")
    grafted = {**ticket, "rollout_id": "masked", **masked["build"]["_capture_snapshot"]}
    response = keyed.post("/retire", json={**masked, "retire": grafted})
    assert response.status_code == 403
    assert (_kept(file_store, "masked"), _kept(file_store, "clean")) == (True, True)


@pytest.mark.parametrize(
    ("field", "edit"),
    [
        ("snapshot_id", lambda value: "f" * len(value)),
        ("version", lambda value: value + 1),
        ("version", lambda value: value - 1),
        ("rollout_id", lambda value: value + "-other"),
        ("source", lambda value: value + "-other"),
        ("ticket", lambda value: ("0" if value[0] != "0" else "1") + value[1:]),
    ],
)
def test_edited_ticket_is_403(
    keyed: httpx.Client,
    ticket: dict[str, Any],
    file_store: FileTokenStore,
    field: str,
    edit: Any,
) -> None:
    """A ticket with any field edited does not verify: 403, and nothing is retired."""
    response = keyed.post("/retire", json={**ticket, field: edit(ticket[field])})
    assert response.status_code == 403
    assert "does not verify" in response.json()["error"]
    assert _kept(file_store, "r-1")


def test_ticket_from_another_key_is_403(
    keyed: httpx.Client, ticket: dict[str, Any], file_store: FileTokenStore
) -> None:
    """A ticket for the real snapshot, signed under another key, is 403."""
    fields = {k: ticket[k] for k in ("rollout_id", "source", "snapshot_id", "version")}
    forged = TicketSigner(b"not-the-service-key").issue(**fields)
    assert keyed.post("/retire", json=forged).status_code == 403
    assert _kept(file_store, "r-1")


# -- the store moved on: a genuine ticket that is stale ----------------------------------------


def test_ticket_replayed_after_mark_incomplete_is_409(
    keyed: httpx.Client, ticket: dict[str, Any], file_store: FileTokenStore
) -> None:
    """After a mark_incomplete the ticket's version is gone: 409, retired false, capture kept."""
    anyio.run(file_store.mark_incomplete, "r-1", "call-late")
    response = keyed.post("/retire", json=ticket)
    assert (response.status_code, response.json()["retired"]) == (409, False)
    assert _kept(file_store, "r-1")


def test_ticket_replayed_after_a_new_line_is_409(
    keyed: httpx.Client, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """A line the store indexes after the ticket was issued moves the version: the old one is 409.

    The line is what a writer that crashed after its append leaves behind; the
    next freeze indexes it. The fresh answer's ticket then retires.
    """
    entries = write_capture("r-1")
    old = _finalize(keyed, "r-1")["retire"]
    last = entries[-1]
    late = make_entry(
        "r-1", "late", [*last["prompt_token_ids"], *last["generation_token_ids"], 5], [6]
    )
    with open(file_store.directory / "r-1.tokens.jsonl", "ab") as handle:
        handle.write(orjson.dumps(late) + b"\n")
    new = _finalize(keyed, "r-1")["retire"]
    assert new["version"] > old["version"]
    response = keyed.post("/retire", json=old)
    assert (response.status_code, response.json()["retired"]) == (409, False)
    assert _kept(file_store, "r-1")
    assert keyed.post("/retire", json=new).json() == {"retired": True}


def test_refused_late_put_leaves_the_ticket_valid(
    keyed: httpx.Client, ticket: dict[str, Any], file_store: FileTokenStore
) -> None:
    """A put refused because the capture is frozen changes nothing: the ticket still retires."""
    with pytest.raises(CaptureFrozen):
        anyio.run(file_store.put, make_entry("r-1", "late", [1], [2]))
    assert keyed.post("/retire", json=ticket).json() == {"retired": True}


# -- keys across replicas --------------------------------------------------------------------


def _across_replicas(
    make_settings: SettingsFactory, key_a: str | None, key_b: str | None
) -> httpx.Response:
    """Two apps ("replicas") over the same capture directory, with the given retire keys:
    r-1 finalized on the first, its ticket presented to the second; the second's answer."""

    def settings(key: str | None) -> Settings:
        return make_settings(retire={"key": key}) if key else make_settings()

    with in_process(create_app(settings(key_a))) as a, in_process(create_app(settings(key_b))) as b:
        return b.post("/retire", json=_finalize(a, "r-1")["retire"])


def test_replicas_sharing_a_key_accept_each_others_tickets(
    make_settings: SettingsFactory, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """A ticket minted by one replica retires on another configured with the same key."""
    write_capture("r-1")
    response = _across_replicas(make_settings, KEY, KEY)
    assert (response.status_code, response.json()) == (200, {"retired": True})
    assert stored_state(file_store, "r-1").retired is True


def test_replicas_with_different_keys_refuse_each_others_tickets(
    make_settings: SettingsFactory, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """A ticket minted under one key is 403 on a replica configured with another key."""
    write_capture("r-1")
    response = _across_replicas(make_settings, KEY, KEY + "-rotated")
    assert response.status_code == 403
    assert _kept(file_store, "r-1")


def test_missing_retire_key_logs_a_warning(
    make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Without `retire.key` the app warns at start-up that tickets are per-process."""
    caplog.set_level(logging.WARNING, logger="token_finalizer.service.tickets")
    with in_process(create_app(make_settings())):
        pass
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and "retire.key" in r.message
    ]
    assert len(warnings) == 1


def test_configured_retire_key_logs_no_warning(
    make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """With `retire.key` set nothing is logged about the key."""
    caplog.set_level(logging.WARNING, logger="token_finalizer.service.tickets")
    with in_process(create_app(make_settings(retire={"key": KEY}))):
        pass
    assert not [r for r in caplog.records if "retire.key" in r.message]


def test_without_retire_key_the_apps_own_tickets_retire(
    client: httpx.Client, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """Without `retire.key` (a per-process key) the same app still retires its own tickets."""
    write_capture("r-1")
    response = client.post("/retire", json=_finalize(client, "r-1")["retire"])
    assert (response.status_code, response.json()) == (200, {"retired": True})


def test_without_retire_key_replicas_refuse_each_others_tickets(
    make_settings: SettingsFactory, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """Two apps with no `retire.key` each sign with their own random key: 403 across them."""
    write_capture("r-1")
    response = _across_replicas(make_settings, None, None)
    assert response.status_code == 403
    assert _kept(file_store, "r-1")


def test_retire_key_from_the_configuration_is_used(
    capture_dir: Path, write_capture: CaptureWriter
) -> None:
    """A ticket verifies against `retire.key` as configured: one minted offline with it retires."""
    write_capture("r-1")
    settings = settings_from_mapping(
        {
            "sources": {"local": {"kind": "file", "dir": str(capture_dir)}},
            "retire": {"key": "${RETIRE_KEY}"},
        },
        env={"RETIRE_KEY": KEY},
    )
    with in_process(create_app(settings)) as client:
        ticket = _finalize(client, "r-1")["retire"]
        fields = {k: ticket[k] for k in ("rollout_id", "source", "snapshot_id", "version")}
        assert ticket == TicketSigner(KEY.encode()).issue(**fields)
        assert client.post("/retire", json=ticket).json() == {"retired": True}
