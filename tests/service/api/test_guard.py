"""The per-run mask-fraction guard (X-Run-Id), called in-process."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.service.api.conftest import CaptureWriter, SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import record_for
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app

EMPTY = "empty_capture"


@pytest.fixture
def guarded(make_settings: SettingsFactory) -> Iterator[httpx.Client]:
    """A client of a service that refuses a run once more than half of >= 4 records are masked."""
    settings = make_settings(
        token_id_capture={"max_mask_fraction": 0.5, "mask_fraction_min_samples": 4}
    )
    with in_process(create_app(settings)) as client:
        yield client


def _finalize(client: httpx.Client, rollout_id: str, run: str | None) -> httpx.Response:
    headers = {"X-Run-Id": run} if run is not None else {}
    return client.post("/finalize", json=record_for(rollout_id), headers=headers)


def test_masked_calls_below_min_samples_pass(guarded: httpx.Client) -> None:
    """Three masked records (fewer than min samples) all answer 200."""
    statuses = [_finalize(guarded, f"m-{i}", "run-a").status_code for i in range(3)]
    assert statuses == [200, 200, 200]


def test_crossing_call_is_409_with_counts_and_reasons(guarded: httpx.Client) -> None:
    """The call that crosses the threshold answers 409 with finalized, masked and reasons."""
    for i in range(3):
        _finalize(guarded, f"m-{i}", "run-a")
    response = _finalize(guarded, "m-3", "run-a")
    body = response.json()
    assert response.status_code == 409
    assert {k: body[k] for k in ("finalized", "masked", "reasons")} == {
        "finalized": 4,
        "masked": 4,
        "reasons": {EMPTY: 4},
    }
    assert "run-a" in body["error"]


def test_every_later_call_of_the_run_is_409(
    guarded: httpx.Client, write_capture: CaptureWriter
) -> None:
    """After the run tripped, even a perfectly captured rollout answers 409."""
    for i in range(4):
        _finalize(guarded, f"m-{i}", "run-a")
    write_capture("good")
    assert _finalize(guarded, "good", "run-a").status_code == 409


def test_refused_later_call_freezes_nothing(
    guarded: httpx.Client, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """A call refused by a tripped run leaves its capture unfrozen for a later retry."""
    for i in range(4):
        _finalize(guarded, f"m-{i}", "run-a")
    write_capture("good")
    _finalize(guarded, "good", "run-a")
    assert stored_state(file_store, "good").frozen is False


def test_crossing_call_keeps_its_evidence(
    guarded: httpx.Client, file_store: FileTokenStore
) -> None:
    """The crossing call's build happened (frozen) but nothing was retired."""
    for i in range(4):
        _finalize(guarded, f"m-{i}", "run-a")
    status = stored_state(file_store, "m-3")
    assert (status.frozen, status.retired) == (True, False)


def test_other_runs_are_not_affected(guarded: httpx.Client) -> None:
    """Another X-Run-Id, and the default run (no header), still answer 200."""
    for i in range(4):
        _finalize(guarded, f"m-{i}", "run-a")
    statuses = (
        _finalize(guarded, "b-0", "run-b").status_code,
        _finalize(guarded, "d-0", None).status_code,
    )
    assert statuses == (200, 200)


def test_mostly_good_run_passes(guarded: httpx.Client, write_capture: CaptureWriter) -> None:
    """A run with 2 masked of 4 (exactly the fraction, not above it) keeps answering 200."""
    write_capture("g-0")
    write_capture("g-1")
    statuses = [
        _finalize(guarded, rollout_id, "run-a").status_code
        for rollout_id in ["m-0", "g-0", "m-1", "g-1"]
    ]
    assert statuses == [200, 200, 200, 200]


def test_records_without_a_build_do_not_count(make_settings: SettingsFactory) -> None:
    """Records of agents that do not take part are never counted, so they never trip the guard."""
    settings = make_settings(
        token_id_capture={
            "max_mask_fraction": 0.0,
            "mask_fraction_min_samples": 1,
            "all_agents": False,
            "agents": ["someone_else"],
        }
    )
    with in_process(create_app(settings)) as client:
        statuses = [_finalize(client, f"m-{i}", "run-a").status_code for i in range(3)]
    assert statuses == [200, 200, 200]


def test_no_guard_without_max_mask_fraction(client: httpx.Client) -> None:
    """Without max_mask_fraction even an all-masked run keeps answering 200."""
    statuses = {_finalize(client, f"m-{i}", "run-a").status_code for i in range(60)}
    assert statuses == {200}
