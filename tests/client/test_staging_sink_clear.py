"""What `HttpStagingSink.clear(keys)` sends, and when it sends nothing.

See docs/staging.md#clearing-staged-calls.

The store is the staging stand-in (`staging_stand_in`): its advertised
features and canned answers are the tests' to set. The clear itself, on
every store, is tested against the real store server in
test_staging_clear_e2e.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.client.staging_stand_in import StagingStoreStandIn
from token_finalizer.store_server.capabilities import STORE_FEATURES
from token_finalizer_client import (
    HttpStagingSink,
    InvalidAnswerError,
    NotFoundError,
    UnsupportedFeatureError,
)

URL = "http://store.test"


def _sink(store: StagingStoreStandIn) -> Any:
    return HttpStagingSink(URL, transport=store.transport())


def test_one_request_per_rollout_names_its_call_ids_once_in_order() -> None:
    """Keys of two rollouts: a POST staged/clear each, the call ids (slashes kept) in the body."""
    store = StagingStoreStandIn()
    store.answer_next(200, {"cleared": 2})
    store.answer_next(200, {"cleared": 1})
    with _sink(store) as sink:
        sink.clear(["r-1/agent/2", "r-2/c0", "r-1/c1", "r-1/agent/2"])
    sent = [
        (seen.method, seen.segments[1], seen.segments[3:], seen.body) for seen in store.requests
    ]
    assert sent == [
        ("POST", "r-1", ("staged", "clear"), {"keys": ["agent/2", "c1"]}),
        ("POST", "r-2", ("staged", "clear"), {"keys": ["c0"]}),
    ]


def test_no_key_sends_nothing() -> None:
    """An empty list is a no-op: the store is not even asked for its features."""
    store = StagingStoreStandIn()
    with _sink(store) as sink:
        sink.clear([])
    assert (store.requests, store.probes) == ([], 0)


def test_one_string_instead_of_a_list_is_a_type_error() -> None:
    """A bare key would be read letter by letter: refused before anything is sent."""
    store = StagingStoreStandIn()
    with _sink(store) as sink, pytest.raises(TypeError, match="not one string"):
        sink.clear("r-1/c0")
    assert (store.requests, store.probes) == ([], 0)


@pytest.mark.parametrize("key", ["no-slash", "bad id/c0", "r-1/", "r-1/c\n0", 7])
def test_a_key_that_is_not_a_staging_key_is_a_value_error_naming_it(key: Any) -> None:
    """Checked before the store is asked anything; the message shows the key."""
    store = StagingStoreStandIn()
    with _sink(store) as sink, pytest.raises(ValueError, match="staging key") as refused:
        sink.clear(["r-1/c0", key])
    assert repr(key) in str(refused.value)
    assert (store.requests, store.probes) == ([], 0)


def test_a_store_advertising_other_features_gets_no_clear() -> None:
    """Without `staged_clear` advertised: UnsupportedFeatureError, no clear request."""
    store = StagingStoreStandIn()
    store.features = [feature for feature in STORE_FEATURES if feature != "staged_clear"]
    with _sink(store) as sink, pytest.raises(UnsupportedFeatureError, match="staged_clear"):
        sink.clear(["r-1/c0"])
    assert store.requests == []


def test_a_store_replaced_by_an_older_one_is_asked_again_and_the_caller_told() -> None:
    """A 404 to the clear after the store stopped advertising it: asked again, then refused."""
    store = StagingStoreStandIn()
    store.answer_next(200, {"cleared": 1})
    with _sink(store) as sink:
        sink.clear(["r-1/c0"])
        store.features = []  # an older store answers at the same address now
        with pytest.raises(UnsupportedFeatureError):
            sink.clear(["r-1/c1"])
    assert store.probes == 2


def test_a_404_from_a_store_that_still_advertises_is_raised() -> None:
    """Asked again once; still advertised, so the store's 404 stands."""
    store = StagingStoreStandIn()  # advertises staged_clear but serves no such route
    with _sink(store) as sink, pytest.raises(NotFoundError):
        sink.clear(["r-1/c0"])
    assert store.probes == 2


@pytest.mark.parametrize("answer", [{}, {"cleared": "1"}, {"cleared": True}, {"cleared": 2}])
def test_an_answer_that_is_not_a_count_is_refused(answer: dict[str, Any]) -> None:
    """`cleared` must be an int from 0 to the number of call ids sent."""
    store = StagingStoreStandIn()
    store.answer_next(200, answer)
    with _sink(store) as sink, pytest.raises(InvalidAnswerError):
        sink.clear(["r-1/c0"])
