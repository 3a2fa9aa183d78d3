"""Our clients and the finalizer's `http` source against a store that knows protocol v1 only.

The store (`tests/support/v1_store.py`) was written from docs/store-protocol.md
alone, serves no `/capabilities` (404) and routes no query parameter, so
every extension sent to it would fail. Through it, under uvicorn on
loopback: the golden scenarios of tests/vectors/nemo_gym_0_7/builder.json
(the ones `test_rebuild_vectors.py` checks in process) finalize to NeMo Gym
0.7's builds and retire; a freeze that answers 503 once is retried; the
sink and the resolver write and resolve in plain v1.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.service.core.test_rebuild_vectors import _SAME_AS_REFERENCE, _plain
from tests.support.captures import agent_rollout, record_for
from tests.support.servers import running_app
from tests.support.v1_store import V1Store
from tests.support.vectors import case_ids
from token_finalizer.api import create_app
from token_finalizer.core.delivery import (
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
)
from token_finalizer.settings import settings_from_mapping
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer_client import HttpLineageResolver, HttpTokenSink

pytestmark = pytest.mark.anyio


def _storable(case: dict[str, Any]) -> bool:
    """Whether a store can hold the case: never two payloads of one call (a put refuses it)."""
    first: dict[str, dict[str, Any]] = {}
    return all(first.setdefault(e["model_call_id"], e) == e for e in case["entries"])


# The golden scenarios a store can hold (all but duplicate_conflict).
_GOLDEN = [case for case in _SAME_AS_REFERENCE if _storable(case)]


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[V1Store, str]]:
    """The v1 store under uvicorn, and its URL."""
    store = V1Store()
    with running_app(store.app()) as url:
        yield store, url


@pytest.fixture
def store(served: tuple[V1Store, str]) -> V1Store:
    """The served store, emptied for the test."""
    served[0].captures.clear()
    served[0].seen.clear()
    served[0].fail_next_freezes = 0
    return served[0]


@pytest.fixture
async def source(served: tuple[V1Store, str]) -> AsyncIterator[HttpTokenSource]:
    """The finalizer's http source for the v1 store (no waits between retries in tests)."""
    opened = HttpTokenSource(served[1], max_retries=2)
    yield opened
    await opened.close()


def _record(case: dict[str, Any]) -> dict[str, Any]:
    """The case's record, naming rollout `r` (a copy: finalize rewrites its output)."""
    return {**copy.deepcopy(case["record"]), "_ng_rollout_id": "r"}


def _extensions_sent(store: V1Store) -> list[tuple[str, str, str]]:
    """Every request that went beyond plain v1: a query string, or a path v1 lacks."""
    v1_paths = ("/health", "/ng-rollout/")
    return [
        (method, path, query)
        for method, path, query, _ in store.seen
        if query or not path.startswith(v1_paths)
    ]


@pytest.mark.parametrize("case", _GOLDEN, ids=case_ids(_GOLDEN))
async def test_golden_scenario_finalizes_to_gyms_build(
    store: V1Store, source: HttpTokenSource, case: dict[str, Any]
) -> None:
    """Through the v1 store, each scenario's build equals NeMo Gym 0.7's."""
    store.seed("r", copy.deepcopy(case["entries"]))
    build = await finalize_rollout_token_capture(_record(case), source)
    assert build is not None
    build.pop("_capture_snapshot", None)
    build.pop("mask_reason", None)
    assert _plain(build) == case["reference"]["build"]


@pytest.mark.parametrize("case", _GOLDEN, ids=case_ids(_GOLDEN))
async def test_golden_scenario_retires_exactly_when_clean(
    store: V1Store, source: HttpTokenSource, case: dict[str, Any]
) -> None:
    """A clean build's capture is dropped by the v1 store; a masked one stays as evidence."""
    store.seed("r", copy.deepcopy(case["entries"]))
    build = await finalize_rollout_token_capture(_record(case), source)
    retired = await retire_rollout_token_capture("r", source, build)
    capture = store.captures["r"]
    assert (retired, capture.retired, bool(capture.entries)) == (
        not case["reference"]["build"]["mask_sample"],
        retired,
        not retired,
    )


async def test_nothing_beyond_v1_reaches_the_store(store: V1Store, source: HttpTokenSource) -> None:
    """A finalize and a retire send the v1 store plain v1 only (after one capabilities probe)."""
    store.seed("r", copy.deepcopy(_GOLDEN[0]["entries"]))
    build = await finalize_rollout_token_capture(_record(_GOLDEN[0]), source)
    await retire_rollout_token_capture("r", source, build)
    assert _extensions_sent(store) == [("GET", "/capabilities", "")]


def test_a_freeze_blip_is_retried_and_the_rollout_retires(
    store: V1Store, served: tuple[V1Store, str]
) -> None:
    """The first freeze answers 503, the retry 200: finalized and retired through /finalize."""
    for entry in agent_rollout("blip-1", calls=3, new_tokens_per_turn=10):
        store.seed("blip-1", [dict(entry)])
    store.fail_next_freezes = 1
    settings = settings_from_mapping(
        {"sources": {"default": "v1", "v1": {"kind": "http", "url": served[1]}}}, env={}
    )
    with running_app(create_app(settings)) as finalizer:
        answer = httpx.post(f"{finalizer}/finalize", json=record_for("blip-1"), timeout=30).json()
        retired = httpx.post(f"{finalizer}/retire", json=answer["retire"], timeout=30)
    freezes = [seen for seen in store.seen if seen[1].endswith("/freeze")]
    assert (len(freezes), answer["build"]["mask_sample"], answer["retirable"]) == (2, False, True)
    assert (retired.status_code, store.captures["blip-1"].retired) == (200, True)


async def test_the_sink_and_the_resolver_speak_plain_v1(
    store: V1Store, served: tuple[V1Store, str]
) -> None:
    """A model server's writes and resolves reach the v1 store, and resolve its entries."""
    entries = agent_rollout("w-1", calls=2, new_tokens_per_turn=5)
    async with HttpTokenSink(url=served[1]) as sink:
        await sink.begin_call("w-1", entries[0]["model_call_id"])
        for entry in entries:
            await sink.put(entry)
    stored = store.captures["w-1"].entries
    assert [entry["model_call_id"] for entry in stored] == [e["model_call_id"] for e in entries]
    items = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a reply nobody captured"},
        {"role": "user", "content": "and?"},
    ]
    async with HttpLineageResolver(url=served[1]) as resolver:
        resolution = await resolver.resolve("w-1", items)
    resolves = [keys for _, path, _, keys in store.seen if path.endswith("/lineage/resolve")]
    assert (resolution.status, resolution.reason) == ("unresolved", "no_match")
    assert resolves == [("fingerprint_version", "fingerprint", "context_digests")]
    assert _extensions_sent(store) == [("GET", "/capabilities", "")]
