"""The redundant-capture route of a real finalizer: a record's own ids never retire masked evidence.

A harness that posts a record already carrying token ids gets a retire ticket
for the frozen capture only when that capture's own build is clean, or
delivers exactly the ids the record carries. Otherwise a made-up id would buy
the deletion of a capture that, finalized, would have been masked.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.support.captures import make_entry, record_for
from tests.support.servers import running_app
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping

RETIRE_KEY = "redundant-capture-test-key-0123456789abcdef"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FileTokenStore]]:
    """A finalizer under uvicorn over one capture directory: its URL and the store."""
    directory: Path = tmp_path_factory.mktemp("redundant")
    settings = settings_from_mapping(
        {
            "sources": {"local": {"kind": "file", "dir": str(directory)}},
            "retire": {"key": RETIRE_KEY},
        },
        env={},
    )
    with running_app(create_app(settings)) as url:
        yield url, FileTokenStore(directory)


def _write(store: FileTokenStore, rollout_id: str, *, masked: bool) -> None:
    """One chain c1 -> c2, or (masked) two unrelated roots, whose build is `multiple_roots`."""
    second = [8, 9] if masked else [1, 2, 3, 7]

    async def write() -> None:
        await store.put(make_entry(rollout_id, "c1", [1, 2], [3]))
        await store.put(make_entry(rollout_id, "c2", second, [4]))

    anyio.run(write)


def _carrying(rollout_id: str, prompt: list[int], generation: list[int]) -> dict[str, Any]:
    record = record_for(rollout_id)
    record["response"]["output"][0].update(
        prompt_token_ids=prompt, generation_token_ids=generation, generation_log_probs=[-0.5]
    )
    return record


def _finalize_over(
    served: tuple[str, FileTokenStore], name: str, *, masked: bool, generation: list[int]
) -> tuple[str, httpx.Response]:
    """Write a capture (`_write`), then finalize a record carrying [1, 2] + `generation`."""
    url, store = served
    rollout_id = f"{name}-{uuid.uuid4().hex[:8]}"
    _write(store, rollout_id, masked=masked)
    record = _carrying(rollout_id, [1, 2], generation)
    return rollout_id, httpx.post(f"{url}/finalize", json=record, timeout=30)


def test_a_made_up_id_over_a_masked_capture_gets_no_ticket(
    served: tuple[str, FileTokenStore],
) -> None:
    """No ticket; the answer's retire object retires nothing; the capture stays frozen."""
    url, store = served
    rollout_id, answer = _finalize_over(served, "made-up", masked=True, generation=[7])
    body = answer.json()
    assert (answer.status_code, body["retirable"], body["retire"]) == (200, False, None)
    assert httpx.post(f"{url}/retire", json=body, timeout=30).json().get("retired") is not True
    state = stored_state(store, rollout_id)
    assert state is not None and (state.frozen, state.retired) == (True, False)


def test_a_record_over_a_clean_capture_still_retires_it(
    served: tuple[str, FileTokenStore],
) -> None:
    """The capture's own build is clean: a ticket, and the retire drops the capture."""
    url, _ = served
    _, answer = _finalize_over(served, "clean", masked=False, generation=[7])
    body = answer.json()
    assert (body["retirable"], body["build"]["_redundant_capture"]) == (True, True)
    assert httpx.post(f"{url}/retire", json=body["retire"], timeout=30).json() == {"retired": True}


def test_a_record_carrying_its_masked_captures_ids_retires_it(
    served: tuple[str, FileTokenStore],
) -> None:
    """The record carries exactly the main chain of its (masked) capture: a ticket."""
    _, answer = _finalize_over(served, "same", masked=True, generation=[3])
    assert answer.json()["retirable"] is True
