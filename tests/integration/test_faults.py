"""The fault matrix: a fault-injecting proxy between the finalizer and a real store server.

For every fault, /finalize answers 200 with a masked record whose
`_ng_token_capture.error` names the cause, the service keeps serving, nothing
is retired, and the capture is still in the store afterwards.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support.captures import agent_rollout, record_for
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.servers import free_port, running_app
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping
from token_finalizer.store_server import create_store_app

_ids = itertools.count()


@dataclass
class Rig:
    """A store server behind a fault proxy, and a finalizer whose source is that proxy."""

    store: FileTokenStore
    proxy: FaultProxy
    finalizer: str


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One store, one proxy, one finalizer (plus a source pointing at a closed port)."""
    store = FileTokenStore(tmp_path_factory.mktemp("store"))
    with running_app(create_store_app(store)) as store_url:
        proxy = FaultProxy(store_url)
        with proxy.running() as proxy_url:
            settings = settings_from_mapping(
                {
                    "sources": {
                        "default": "store",
                        "store": {"kind": "http", "url": proxy_url, "timeout_s": 1.0},
                        "down": {
                            "kind": "http",
                            "url": f"http://127.0.0.1:{free_port()}",
                            "timeout_s": 1.0,
                        },
                    }
                }
            )
            with running_app(create_app(settings)) as finalizer:
                yield Rig(store, proxy, finalizer)


@pytest.fixture
def rollout(rig: Rig) -> Iterator[str]:
    """A fresh 3-call rollout written into the store; the proxy is healthy afterwards."""
    rollout_id = f"fault-{next(_ids)}"

    async def write() -> None:
        for entry in agent_rollout(rollout_id, calls=3, new_tokens_per_turn=50):
            await rig.store.put(entry)

    asyncio.run(write())
    yield rollout_id
    rig.proxy.fault = Fault()


def _finalize(rig: Rig, rollout_id: str, source: str | None = None) -> dict[str, Any]:
    params = {"source": source} if source else None
    answer = httpx.post(
        f"{rig.finalizer}/finalize", json=record_for(rollout_id), params=params, timeout=60
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def _assert_kept_and_serving(rig: Rig, rollout_id: str, answer: dict[str, Any]) -> None:
    retire = httpx.post(f"{rig.finalizer}/retire", json=answer, timeout=30)
    assert retire.json() == {"retired": False}
    status = rig.store.status(rollout_id)
    assert status is not None and status["retired"] is False
    assert (rig.store.directory / f"{rollout_id}.tokens.jsonl").exists()
    assert httpx.get(f"{rig.finalizer}/health", timeout=5).status_code == 200
    rig.proxy.fault = Fault()
    healthy = _finalize(rig, rollout_id)
    assert healthy["build"]["mask_sample"] is False, healthy["build"]


def _masked_error(answer: dict[str, Any]) -> str:
    assert answer["retirable"] is False
    assert answer["record"]["mask_sample"] is True
    return answer["record"]["_ng_token_capture"]["error"]


FAULTS: dict[str, tuple[Callable[[], Fault], str]] = {
    "hang": (lambda: Fault("hang"), "did not answer"),
    "reset mid-body": (lambda: Fault("reset"), "did not answer"),
    "500 always": (lambda: Fault("status", status=500), "HTTP 500"),
    "502 always": (lambda: Fault("status", status=502), "unavailable after"),
    "503 always": (lambda: Fault("status", status=503), "unavailable after"),
    "not JSON": (lambda: Fault("garbage"), "not readable JSON"),
    "409 retired": (lambda: Fault("status", status=409), "CaptureRetired"),
    "another rollout": (
        lambda: Fault("rewrite", rewrite=lambda body: {**body, "rollout_id": "someone-else"}),
        "names rollout 'someone-else'",
    ),
    "newer schema": (
        lambda: Fault(
            "rewrite",
            rewrite=lambda body: {
                **body,
                "entries": [{**e, "schema_version": 99} for e in body["entries"]],
            },
        ),
        "schema_version 99 is newer",
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_masks_keeps_capture_and_service_recovers(rig: Rig, rollout: str, fault: str) -> None:
    """Each store fault becomes a masked record naming the cause; nothing is lost or retired."""
    make, cause = FAULTS[fault]
    rig.proxy.fault = make()
    answer = _finalize(rig, rollout)
    assert cause in _masked_error(answer)
    _assert_kept_and_serving(rig, rollout, answer)


def test_store_down_is_masked(rig: Rig, rollout: str) -> None:
    """A store that refuses connections masks the record with the connection error."""
    answer = _finalize(rig, rollout, source="down")
    assert "did not answer" in _masked_error(answer)
    assert "ConnectError" in _masked_error(answer)
    _assert_kept_and_serving(rig, rollout, answer)


def test_two_503_then_success_goes_through_retries(rig: Rig, rollout: str) -> None:
    """Two 503s then a good answer: the retries succeed and the record is not masked."""
    rig.proxy.fault = Fault("status", status=503, times=2)
    answer = _finalize(rig, rollout)
    assert answer["build"]["mask_sample"] is False
    assert answer["retirable"] is True
    assert rig.proxy.fault.seen == 3


def test_faulty_drop_retires_nothing(rig: Rig, rollout: str) -> None:
    """A retire whose drop keeps failing answers retired: false and leaves the capture."""
    answer = _finalize(rig, rollout)
    assert answer["retirable"] is True
    rig.proxy.fault = Fault("status", status=503)
    retire = httpx.post(f"{rig.finalizer}/retire", json=answer, timeout=60)
    assert retire.json() == {"retired": False}
    assert rig.store.status(rollout)["retired"] is False
    rig.proxy.fault = Fault()
    assert httpx.post(f"{rig.finalizer}/retire", json=answer, timeout=60).json() == {
        "retired": True
    }
