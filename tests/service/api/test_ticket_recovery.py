"""A ticket signed under a process's own key dies with it; finalizing again recovers it.

Without `retire.key` each process signs with a random key, so after a
restart its tickets answer 403. Nothing is lost: the capture stays frozen,
and a second finalize answers the same snapshot with a ticket the new
process verifies (docs/finalizer-api.md#post-retire).
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.service.api.conftest import CaptureWriter, SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import record_for
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app


def _finalize(client: httpx.Client, rollout_id: str) -> dict[str, Any]:
    response = client.post("/finalize", json=record_for(rollout_id))
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


def test_finalizing_again_after_a_restart_gives_the_same_snapshot_a_new_ticket(
    make_settings: SettingsFactory, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """The restarted process refuses the old ticket, re-finalizes the same snapshot, retires it."""
    write_capture("r-1")
    with in_process(create_app(make_settings())) as before_restart:
        old = _finalize(before_restart, "r-1")["retire"]
    with in_process(create_app(make_settings())) as after_restart:
        refused = after_restart.post("/retire", json=old)
        new = _finalize(after_restart, "r-1")["retire"]
        retired = after_restart.post("/retire", json=new)
    snapshot = ("snapshot_id", "version")
    assert refused.status_code == 403
    assert ([new[k] for k in snapshot], new["ticket"] != old["ticket"]) == (
        [old[k] for k in snapshot],
        True,
    )
    assert (retired.json(), stored_state(file_store, "r-1").retired) == ({"retired": True}, True)
