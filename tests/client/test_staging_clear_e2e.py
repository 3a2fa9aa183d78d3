"""`HttpStagingSink.clear(keys)` against the real store server on loopback: memory, file, Redis.

A trainer that consumed a rollout's staged calls deletes exactly those keys
(dead branches included), with a finalizer token, through the store's
`staged_clear` extension (docs/staging.md#clearing-staged-calls). A store
that does not advertise it (the independent v1 store of the tests) gets no
clear request, and the caller is told so.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.client.staged_calls import staged_chain
from tests.support.servers import running_app
from tests.support.store_servers import STORE_KINDS, served_store
from tests.support.v1_store import V1Store
from token_finalizer.store_server.roles import StoreTokens
from token_finalizer_client import (
    ConflictError,
    HttpStagingSink,
    HttpStagingSource,
    PermissionDeniedError,
    UnsupportedFeatureError,
)

WRITER, FINALIZER = "writer-token", "finalizer-token"


@pytest.fixture(scope="module", params=STORE_KINDS)
def store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A store server with writer and finalizer tokens over a memory, file, then redis store."""
    tokens = StoreTokens(writer=(WRITER,), finalizer=(FINALIZER,))
    directory = tmp_path_factory.mktemp("staging-clear-e2e")
    with served_store(request.param, directory, "staging-clear-e2e", tokens=tokens) as url:
        yield url


@pytest.fixture
def writer(store_url: str) -> Iterator[HttpStagingSink]:
    """The inference worker's sink (writer token)."""
    with HttpStagingSink(store_url, token=WRITER) as opened:
        yield opened


@pytest.fixture
def cleaner(store_url: str) -> Iterator[HttpStagingSink]:
    """The trainer's sink, for clearing (finalizer token)."""
    with HttpStagingSink(store_url, token=FINALIZER) as opened:
        yield opened


@pytest.fixture
def source(store_url: str) -> Iterator[HttpStagingSource]:
    """The trainer's source (finalizer token)."""
    with HttpStagingSource(store_url, token=FINALIZER) as opened:
        yield opened


def _staged(writer: HttpStagingSink, calls: int = 3) -> list[str]:
    """A fresh rollout of `calls` chained calls, staged; their staging keys."""
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    keys = []
    for record in staged_chain(rollout_id, calls):
        result = writer.stage(record)
        assert result.ok, result.error
        keys.append(result.staging_key)
    return keys


def _held(source: HttpStagingSource, keys: list[str]) -> list[bool]:
    """Per key, whether the store still holds its staged call."""
    held = []
    for key in keys:
        try:
            source.fetch([key])
        except KeyError:
            held.append(False)
        else:
            held.append(True)
    return held


def test_clear_with_the_finalizer_token_deletes_exactly_the_named_keys(
    writer: HttpStagingSink, cleaner: HttpStagingSink, source: HttpStagingSource
) -> None:
    """Keys of two rollouts in one call: the named ones go, every other stays fetchable."""
    first, second = _staged(writer), _staged(writer, 2)
    cleaner.clear([first[0], first[2], second[1]])
    assert _held(source, first + second) == [False, True, False, True, False]


def test_clear_deletes_a_dead_branch(
    writer: HttpStagingSink, cleaner: HttpStagingSink, source: HttpStagingSource
) -> None:
    """A call no ledger row names (a retry's dead branch, an orphan) is cleared like any other."""
    keys = _staged(writer)
    cleaner.clear(keys[1:])
    assert _held(source, keys) == [True, False, False]


def test_clear_with_the_writer_token_is_refused(
    writer: HttpStagingSink, source: HttpStagingSource
) -> None:
    """A model server's or worker's token cannot delete: 403, nothing deleted."""
    keys = _staged(writer)
    with pytest.raises(PermissionDeniedError) as refused:
        writer.clear(keys)
    assert refused.value.status_code == 403
    assert _held(source, keys) == [True, True, True]


def test_clear_is_idempotent(
    writer: HttpStagingSink, cleaner: HttpStagingSink, source: HttpStagingSource
) -> None:
    """The same keys again, and keys never staged, are no error."""
    keys = _staged(writer)
    cleaner.clear(keys[:1])
    cleaner.clear([*keys[:1], keys[0].split("/")[0] + "/never-staged", "r-unknown/c0"])
    assert _held(source, keys) == [False, True, True]


def test_a_key_that_is_not_a_staging_key_is_a_value_error_before_any_request(
    writer: HttpStagingSink, cleaner: HttpStagingSink, source: HttpStagingSource
) -> None:
    """The bad key is named, and the good key before it is not cleared: nothing was sent."""
    keys = _staged(writer)
    with pytest.raises(ValueError, match="no-slash-here"):
        cleaner.clear([keys[0], "no-slash-here"])
    assert _held(source, keys) == [True, True, True]


def test_the_store_names_a_call_id_it_refuses(store_url: str) -> None:
    """Sent by hand (the client checks first): a call id with a control character is a 422."""
    response = httpx.post(
        f"{store_url}/ng-rollout/r-any/training-token-capture/staged/clear",
        json={"keys": ["c0", "bad\u0001id"]},
        headers={"Authorization": f"Bearer {FINALIZER}"},
        timeout=10,
    )
    assert response.status_code == 422
    assert "bad\\x01id" in response.json()["error"]


def test_a_cleared_call_cannot_be_staged_again(
    writer: HttpStagingSink, cleaner: HttpStagingSink
) -> None:
    """Staging the cleared record again is refused (409): write-once holds across a clear."""
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    (record,) = staged_chain(rollout_id, 1)
    assert writer.stage(record).ok
    cleaner.clear([f"{rollout_id}/c0"])
    result = writer.stage(record)
    assert not result.ok and result.error.startswith("HTTP 409") and "cleared" in result.error


def test_clear_of_a_frozen_rollout_is_a_conflict(
    writer: HttpStagingSink, cleaner: HttpStagingSink, store_url: str
) -> None:
    """A frozen rollout's calls go with its retire, not one by one: 409."""
    keys = _staged(writer)
    rollout_id = keys[0].split("/")[0]
    httpx.post(
        f"{store_url}/ng-rollout/{rollout_id}/training-token-capture/freeze",
        headers={"Authorization": f"Bearer {FINALIZER}"},
        timeout=10,
    ).raise_for_status()
    with pytest.raises(ConflictError, match="frozen"):
        cleaner.clear(keys)


def test_a_store_without_the_extension_gets_no_clear_and_the_caller_is_told() -> None:
    """The v1 store (no /capabilities): UnsupportedFeatureError naming staged_clear, no request."""
    store = V1Store()
    with (
        running_app(store.app()) as url,
        HttpStagingSink(url) as sink,
        pytest.raises(UnsupportedFeatureError, match="staged_clear") as refused,
    ):
        sink.clear(["r-1/c0"])
    assert refused.value.feature == "staged_clear"
    assert not [seen for seen in store.seen if "clear" in seen[1]]
