"""The fault matrix: a fault-injecting proxy between the finalizer and a real store server.

A fault that says something is wrong with the capture (a store error, garbage,
a retired capture, another rollout's snapshot, a newer schema) makes /finalize
answer 200 with a masked record (mask_reason `freeze_failed`, `retire` null)
whose `_ng_token_capture.error` names the cause. A store that cannot be
reached (no answer, a reset, 502/503, refused connections) makes it answer
503 + Retry-After (`on_unreachable: retry`, the default), or a masked record
with mask_reason `store_unreachable` (`on_unreachable: mask`). Either way the
service keeps serving, nothing is retired, and the capture is still in the
store afterwards.
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
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping
from token_finalizer.store_server import create_store_app

_ids = itertools.count()


@dataclass
class Rig:
    """A store server behind a fault proxy, and a finalizer whose sources use that proxy."""

    store: FileTokenStore
    proxy: FaultProxy
    finalizer: str


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One store, one proxy, one finalizer.

    Sources: `store` (the proxy, on_unreachable: retry), `store-mask` (the proxy,
    on_unreachable: mask), `down` and `down-mask` (a closed port, each mode).
    """
    store = FileTokenStore(tmp_path_factory.mktemp("store"))
    closed = f"http://127.0.0.1:{free_port()}"
    with running_app(create_store_app(store)) as store_url:
        proxy = FaultProxy(store_url)
        with proxy.running() as proxy_url:

            def http(url: str, mode: str) -> dict[str, Any]:
                return {"kind": "http", "url": url, "timeout_s": 1.0, "on_unreachable": mode}

            settings = settings_from_mapping(
                {
                    "sources": {
                        "default": "store",
                        "store": http(proxy_url, "retry"),
                        "store-mask": http(proxy_url, "mask"),
                        "down": http(closed, "retry"),
                        "down-mask": http(closed, "mask"),
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


def _post_finalize(rig: Rig, rollout_id: str, source: str | None = None) -> httpx.Response:
    params = {"source": source} if source else None
    return httpx.post(
        f"{rig.finalizer}/finalize", json=record_for(rollout_id), params=params, timeout=60
    )


def _finalize(rig: Rig, rollout_id: str, source: str | None = None) -> dict[str, Any]:
    answer = _post_finalize(rig, rollout_id, source)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def _assert_kept_and_serving(rig: Rig, rollout_id: str, answer: dict[str, Any] | None) -> None:
    """Nothing retired (a masked answer cannot be), capture kept, a healthy finalize works."""
    if answer is not None:
        assert answer["retire"] is None
        retire = httpx.post(f"{rig.finalizer}/retire", json=answer, timeout=30)
        assert retire.status_code == 422, retire.text
    status = stored_state(rig.store, rollout_id)
    assert status is not None and status.retired is False
    assert (rig.store.directory / f"{rollout_id}.tokens.jsonl").exists()
    assert httpx.get(f"{rig.finalizer}/health", timeout=5).status_code == 200
    rig.proxy.fault = Fault()
    healthy = _finalize(rig, rollout_id)
    assert healthy["build"]["mask_sample"] is False, healthy["build"]


def _masked_error(answer: dict[str, Any], reason: str) -> str:
    assert answer["retirable"] is False
    assert answer["record"]["mask_sample"] is True
    assert answer["record"]["_ng_token_capture"]["mask_reason"] == reason
    assert answer["build"]["mask_reason"] == reason
    error: str = answer["record"]["_ng_token_capture"]["error"]
    return error


# Faults that say something about the capture: masked whatever `on_unreachable` says.
MASKING_FAULTS: dict[str, tuple[Callable[[], Fault], str]] = {
    "500 always": (lambda: Fault("status", status=500), "HTTP 500"),
    "not JSON": (lambda: Fault("garbage"), "not readable JSON"),
    "409 retired": (lambda: Fault("status", status=409), "CaptureRetired"),
    "another rollout": (
        lambda: Fault("rewrite", rewrite=lambda body: {**body, "rollout_id": "someone-else"}),
        "names rollout 'someone-else'",
    ),
    "newer schema": (
        lambda: Fault(
            "rewrite",
            # A compact freeze answers packed records (strings): each becomes an
            # entry of the newer schema, as a plain entry is stamped with it.
            rewrite=lambda body: {
                **body,
                "entries": [
                    {**e, "schema_version": 99} if isinstance(e, dict) else {"schema_version": 99}
                    for e in body["entries"]
                ],
            },
        ),
        "schema_version 99 is newer",
    ),
}

# Faults where the store was not reached (or said it cannot serve now).
UNREACHABLE_FAULTS: dict[str, tuple[Callable[[], Fault], str]] = {
    "hang": (lambda: Fault("hang"), "within"),
    "reset mid-body": (lambda: Fault("reset"), "did not answer"),
    "502 always": (lambda: Fault("status", status=502), "HTTP 502"),
    "503 always": (lambda: Fault("status", status=503), "HTTP 503"),
}


@pytest.mark.parametrize("source", ["store", "store-mask"])
@pytest.mark.parametrize("fault", list(MASKING_FAULTS))
def test_capture_fault_masks_keeps_capture_and_service_recovers(
    rig: Rig, rollout: str, fault: str, source: str
) -> None:
    """Each capture fault becomes a masked record naming the cause; nothing is lost or retired."""
    make, cause = MASKING_FAULTS[fault]
    rig.proxy.fault = make()
    answer = _finalize(rig, rollout, source)
    assert cause in _masked_error(answer, "freeze_failed")
    _assert_kept_and_serving(rig, rollout, answer)


@pytest.mark.parametrize("fault", list(UNREACHABLE_FAULTS))
def test_unreachable_store_is_503_keeps_capture_and_service_recovers(
    rig: Rig, rollout: str, fault: str
) -> None:
    """An unreachable store answers 503 + Retry-After naming the source and the cause."""
    make, cause = UNREACHABLE_FAULTS[fault]
    rig.proxy.fault = make()
    response = _post_finalize(rig, rollout)
    assert (response.status_code, "Retry-After" in response.headers) == (503, True), response.text
    body = response.json()
    assert (body["source"], cause in body["error"]) == ("store", True), body
    _assert_kept_and_serving(rig, rollout, None)


@pytest.mark.parametrize("fault", list(UNREACHABLE_FAULTS))
def test_unreachable_store_with_on_unreachable_mask_is_masked(
    rig: Rig, rollout: str, fault: str
) -> None:
    """With `on_unreachable: mask` an unreachable store masks the record (store_unreachable)."""
    make, cause = UNREACHABLE_FAULTS[fault]
    rig.proxy.fault = make()
    answer = _finalize(rig, rollout, source="store-mask")
    assert cause in _masked_error(answer, "store_unreachable")
    _assert_kept_and_serving(rig, rollout, answer)


def test_store_down_is_503(rig: Rig, rollout: str) -> None:
    """A store that refuses connections answers 503 + Retry-After with the connection error."""
    response = _post_finalize(rig, rollout, source="down")
    assert (response.status_code, "Retry-After" in response.headers) == (503, True), response.text
    assert "ConnectError" in response.json()["error"]
    _assert_kept_and_serving(rig, rollout, None)


def test_store_down_with_on_unreachable_mask_is_masked(rig: Rig, rollout: str) -> None:
    """With `on_unreachable: mask` a refused connection masks the record with its error."""
    answer = _finalize(rig, rollout, source="down-mask")
    assert "ConnectError" in _masked_error(answer, "store_unreachable")
    _assert_kept_and_serving(rig, rollout, answer)


def test_two_503_then_success_goes_through_retries(rig: Rig, rollout: str) -> None:
    """Two 503s then a good answer: the retries succeed and the record is not masked."""
    rig.proxy.fault = Fault("status", status=503, times=2)
    answer = _finalize(rig, rollout)
    assert answer["build"]["mask_sample"] is False
    assert answer["retirable"] is True
    assert rig.proxy.fault.seen == 3


def test_faulty_drop_retires_nothing(rig: Rig, rollout: str) -> None:
    """A retire whose drop keeps failing answers 503 + Retry-After and leaves the capture."""
    answer = _finalize(rig, rollout)
    assert answer["retirable"] is True
    rig.proxy.fault = Fault("status", status=503)
    retire = httpx.post(f"{rig.finalizer}/retire", json=answer, timeout=60)
    assert (retire.status_code, "Retry-After" in retire.headers) == (503, True), retire.text
    assert stored_state(rig.store, rollout).retired is False
    rig.proxy.fault = Fault()
    assert httpx.post(f"{rig.finalizer}/retire", json=answer, timeout=60).json() == {
        "retired": True
    }
