"""HttpStagingSink packs its token columns only for a store advertising `packed_stage`.

The store is the staging stand-in (`staging_stand_in`), whose advertised
features the tests change; docs/store-protocol.md#extensions-and-capabilities.
"""

from __future__ import annotations

from typing import Any

from tests.client.staged_calls import vector_records
from tests.client.staging_stand_in import StagingStoreStandIn
from token_finalizer_client import HttpStagingSink
from token_finalizer_client._json import loads

URL = "http://store.test"
CLEAN = vector_records("clean_chain")
C1 = CLEAN["rollout-clean-chain/c1"]["record"]
C2 = CLEAN["rollout-clean-chain/c2"]["record"]


def _keys(store: StagingStoreStandIn) -> list[set[str]]:
    return [set(loads(seen.content)) for seen in store.requests]


def _sink(store: StagingStoreStandIn) -> Any:
    return HttpStagingSink(URL, transport=store.transport())


def test_a_store_without_capabilities_gets_the_columns_as_lists() -> None:
    """No /capabilities (404): the record carries its columns, no `columns` key is sent."""
    store = StagingStoreStandIn()
    store.features = None
    with _sink(store) as sink:
        result = sink.stage(C1)
    assert (result.ok, _keys(store)) == (True, [{"attachments", "record"}])
    assert store.requests[0].body["record"] == C1


def test_a_store_advertising_other_features_gets_lists() -> None:
    """A partial list without packed_stage: lists."""
    store = StagingStoreStandIn()
    store.features = ["compact_resolve", "packed_freeze"]
    with _sink(store) as sink:
        sink.stage(C1)
    assert _keys(store) == [{"attachments", "record"}]


def test_the_store_is_asked_once_for_every_stage() -> None:
    """Two stages, one probe."""
    store = StagingStoreStandIn()
    with _sink(store) as sink:
        sink.stage(C1)
        sink.stage(C2)
    assert (store.probes, _keys(store)) == (1, [{"attachments", "record", "columns"}] * 2)


def test_a_refused_packed_stage_asks_again_and_stages_lists() -> None:
    """Packed refused (422) by a store that no longer advertises it: the call goes as lists."""
    store = StagingStoreStandIn()
    with _sink(store) as sink:
        sink.stage(C1)
        store.answer_next(422, {"error": "unknown key columns", "check": "invalid_record"})
        store.features = None  # an older store answers now
        result = sink.stage(C2)
    assert (result.ok, store.probes) == (True, 2)
    assert _keys(store)[1:] == [{"attachments", "record", "columns"}, {"attachments", "record"}]


def test_a_custody_refusal_is_not_sent_twice() -> None:
    """A 422 from a store still advertising packed_stage stands: one stage, the check named."""
    store = StagingStoreStandIn()
    with _sink(store) as sink:
        store.answer_next(422, {"error": "chain_hash_mismatch: no", "check": "chain_hash_mismatch"})
        result = sink.stage(C1)
    assert (result.ok, len(store.requests), result.error) == (
        False,
        1,
        "chain_hash_mismatch: no",
    )
