"""The http source against a mocked capture store: answers, failures, retries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import respx
import zstandard

from tests.support.captures import make_entry, record_for
from token_finalizer import (
    CaptureRetired,
    InvalidRolloutId,
    SourceUnavailable,
    TokenEntryError,
)
from token_finalizer.core.delivery import finalize_record, retire_rollout_token_capture
from token_finalizer.sources import open_source
from token_finalizer.sources.http import HttpTokenSource

pytestmark = pytest.mark.anyio

BASE = "http://capture-store.test:8100"
FREEZE = "/ng-rollout/r1/training-token-capture/freeze"
DROP = "/ng-rollout/r1/training-token-capture/drop"


def snapshot_body(rollout_id: str = "r1", entries: list[dict] | None = None, **fields: Any) -> dict:
    """A protocol v1 freeze answer."""
    if entries is None:
        entries = [make_entry(rollout_id, "c1", [1, 2, 3], [4, 5])]
    return {
        "rollout_id": rollout_id,
        "entries": entries,
        "incomplete": False,
        "snapshot_id": "snap-1",
        "version": 3,
        **fields,
    }


@pytest.fixture
def store() -> Iterator[respx.MockRouter]:
    """A mocked capture store; requests to routes not set up fail the test."""
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


@pytest.fixture
async def source() -> AsyncIterator[HttpTokenSource]:
    """An http source with one retry, closed after the test."""
    opened = HttpTokenSource(BASE, max_retries=1)
    yield opened
    await opened.close()


# -- freeze: answers -------------------------------------------------------------


async def test_freeze_returns_the_snapshot(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A 200 answer becomes a Snapshot with its identity and numpy token arrays."""
    store.post(FREEZE).respond(200, json=snapshot_body())
    snapshot = await source.freeze("r1")
    entry = snapshot.entries[0]
    assert (snapshot.rollout_id, snapshot.snapshot_id, snapshot.version, snapshot.incomplete) == (
        "r1",
        "snap-1",
        3,
        False,
    )
    assert isinstance(entry.prompt_token_ids, np.ndarray)
    assert entry.prompt_token_ids.tolist() == [1, 2, 3]
    assert entry.generation_token_ids.tolist() == [4, 5]


async def test_freeze_reads_a_zstd_answer(store: respx.MockRouter, source: HttpTokenSource) -> None:
    """A zstd-compressed answer is decoded before parsing."""
    body = zstandard.ZstdCompressor().compress(orjson.dumps(snapshot_body()))
    store.post(FREEZE).respond(200, content=body, headers={"Content-Encoding": "zstd"})
    assert (await source.freeze("r1")).entries[0].generation_token_ids.tolist() == [4, 5]


async def test_freeze_of_an_empty_capture_is_an_empty_snapshot(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """An answer with no entries is a valid, empty snapshot."""
    store.post(FREEZE).respond(200, json=snapshot_body(entries=[]))
    assert (await source.freeze("r1")).entries == ()


async def test_freeze_asks_for_zstd(store: respx.MockRouter, source: HttpTokenSource) -> None:
    """Every request admits zstd, so large snapshots travel compressed."""
    route = store.post(FREEZE).respond(200, json=snapshot_body())
    await source.freeze("r1")
    assert route.calls.last.request.headers["accept-encoding"] == "zstd"


async def test_bearer_token_is_sent(store: respx.MockRouter) -> None:
    """A configured token goes out as `Authorization: Bearer <token>`."""
    route = store.post(FREEZE).respond(200, json=snapshot_body())
    async with HttpTokenSource(BASE, token="s3cret") as source:
        await source.freeze("r1")
    assert route.calls.last.request.headers["authorization"] == "Bearer s3cret"


async def test_no_authorization_header_without_a_token(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """Without a token no Authorization header is sent."""
    route = store.post(FREEZE).respond(200, json=snapshot_body())
    await source.freeze("r1")
    assert "authorization" not in route.calls.last.request.headers


async def test_base_url_path_is_kept(store: respx.MockRouter) -> None:
    """A base URL with a path prefix keeps it in front of the protocol path."""
    route = store.post("/store" + FREEZE).respond(200, json=snapshot_body())
    async with HttpTokenSource(BASE + "/store/") as source:
        await source.freeze("r1")
    assert route.called


# -- freeze: refusals and failures -------------------------------------------------


async def test_409_is_capture_retired_with_the_store_message(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A 409 raises CaptureRetired carrying the store's own message."""
    store.post(FREEZE).respond(409, json={"error": "rollout r1 was retired"})
    with pytest.raises(CaptureRetired, match="rollout r1 was retired"):
        await source.freeze("r1")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 500])
async def test_other_error_statuses_raise_source_unavailable_at_once(
    store: respx.MockRouter, source: HttpTokenSource, status: int
) -> None:
    """4xx and 500 are not retried and raise SourceUnavailable naming the status."""
    route = store.post(FREEZE).respond(status, json={"error": "nope"})
    with pytest.raises(SourceUnavailable, match=f"HTTP {status}: nope"):
        await source.freeze("r1")
    assert route.call_count == 1


async def test_wrong_token_message_says_so(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A 401 says the store refused the bearer token."""
    store.post(FREEZE).respond(401, json={"error": "missing or wrong bearer token"})
    with pytest.raises(SourceUnavailable, match="refused the bearer token"):
        await source.freeze("r1")


@pytest.mark.parametrize("status", [502, 503, 504])
async def test_gateway_statuses_are_retried_then_succeed(
    store: respx.MockRouter, source: HttpTokenSource, status: int
) -> None:
    """502/503/504 followed by a 200 yields the snapshot after one retry."""
    route = store.post(FREEZE).mock(
        side_effect=[httpx.Response(status), httpx.Response(200, json=snapshot_body())]
    )
    assert (await source.freeze("r1")).snapshot_id == "snap-1"
    assert route.call_count == 2


async def test_5xx_after_every_retry_raises_source_unavailable(store: respx.MockRouter) -> None:
    """A store that keeps answering 503 is tried 1 + max_retries times, then unavailable."""
    route = store.post(FREEZE).respond(503, json={"error": "overloaded"})
    async with HttpTokenSource(BASE, max_retries=2) as source:
        with pytest.raises(SourceUnavailable, match="unavailable after 3 attempt"):
            await source.freeze("r1")
    assert route.call_count == 3


async def test_connection_error_is_retried_then_succeeds(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A refused connection followed by an answer yields the snapshot."""
    route = store.post(FREEZE).mock(
        side_effect=[httpx.ConnectError("refused"), httpx.Response(200, json=snapshot_body())]
    )
    assert (await source.freeze("r1")).entries
    assert route.call_count == 2


async def test_unreachable_store_raises_source_unavailable(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A store that never accepts the connection is unavailable, with the cause named."""
    store.post(FREEZE).mock(side_effect=httpx.ConnectError("connection refused"))
    with pytest.raises(
        SourceUnavailable, match=r"did not answer.*ConnectError: connection refused"
    ):
        await source.freeze("r1")


async def test_timeout_raises_source_unavailable(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A store that times out on every attempt is unavailable, saying it timed out."""
    route = store.post(FREEZE).mock(side_effect=httpx.ReadTimeout("timed out"))
    with pytest.raises(SourceUnavailable, match="ReadTimeout"):
        await source.freeze("r1")
    assert route.call_count == 2


async def test_garbage_answer_raises_source_unavailable(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A 200 that is not JSON raises SourceUnavailable, not a parser error."""
    store.post(FREEZE).respond(200, content=b"<html>gateway</html>")
    with pytest.raises(SourceUnavailable, match="not readable JSON"):
        await source.freeze("r1")


async def test_corrupt_zstd_answer_raises_source_unavailable(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A body labelled zstd that does not decode raises SourceUnavailable."""
    store.post(FREEZE).mock(
        side_effect=lambda request: httpx.Response(
            200, stream=httpx.ByteStream(b"not zstd"), headers={"Content-Encoding": "zstd"}
        )
    )
    with pytest.raises(SourceUnavailable, match="zstd"):
        await source.freeze("r1")


async def test_snapshot_of_another_rollout_raises_source_unavailable(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """An answer naming another rollout is refused, naming that rollout."""
    store.post(FREEZE).respond(200, json=snapshot_body("r2"))
    with pytest.raises(SourceUnavailable, match="names rollout 'r2'"):
        await source.freeze("r1")


async def test_entry_of_another_rollout_raises_source_unavailable(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A snapshot holding another rollout's entry is refused."""
    store.post(FREEZE).respond(200, json=snapshot_body(entries=[make_entry("r2", "c1", [1], [2])]))
    with pytest.raises(SourceUnavailable, match="entries of rollout"):
        await source.freeze("r1")


async def test_call_listed_twice_with_different_payloads_raises_source_unavailable(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A snapshot listing one model call twice, with different tokens, is refused."""
    first, second = make_entry("r1", "c1", [1], [2]), make_entry("r1", "c1", [1], [3])
    store.post(FREEZE).respond(200, json=snapshot_body(entries=[first, second]))
    with pytest.raises(SourceUnavailable, match="c1 twice, with different payloads"):
        await source.freeze("r1")


async def test_call_listed_twice_with_the_same_payload_is_two_entries(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A line the store holds twice (a relay re-sent it) reaches the builder twice, as in 0.7."""
    entry = make_entry("r1", "c1", [1], [2])
    store.post(FREEZE).respond(200, json=snapshot_body(entries=[entry, dict(entry)]))
    snapshot = await source.freeze("r1")
    assert [e.model_call_id for e in snapshot.entries] == ["c1", "c1"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("snapshot_id", ""),
        ("version", "3"),
        ("version", True),
        ("version", 2**70),
        ("version", -1),
        ("incomplete", None),
    ],
)
async def test_malformed_snapshot_identity_raises_source_unavailable(
    store: respx.MockRouter, source: HttpTokenSource, field: str, value: Any
) -> None:
    """A snapshot without a usable identity is refused, naming the field."""
    store.post(FREEZE).respond(200, json=snapshot_body(**{field: value}))
    with pytest.raises(SourceUnavailable, match=f"no valid {field}"):
        await source.freeze("r1")


async def test_newer_schema_entry_raises_token_entry_error(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """An entry of a newer schema_version raises TokenEntryError naming the version."""
    entry = {**make_entry("r1", "c1", [1], [2]), "schema_version": 2}
    store.post(FREEZE).respond(200, json=snapshot_body(entries=[entry]))
    with pytest.raises(TokenEntryError, match="schema_version 2 is newer"):
        await source.freeze("r1")


@pytest.mark.parametrize("bad_id", ["..", ".", "a/b", "a%2Fb", "a b", "é", ""])
async def test_bad_ids_are_refused_before_any_request(
    store: respx.MockRouter, source: HttpTokenSource, bad_id: str
) -> None:
    """Freeze and drop refuse an unsafe id with InvalidRolloutId and send nothing."""
    with pytest.raises(InvalidRolloutId):
        await source.freeze(bad_id)
    with pytest.raises(InvalidRolloutId):
        await source.drop(bad_id, snapshot_id="s", version=1)
    assert store.calls.call_count == 0


# -- drop --------------------------------------------------------------------------


async def test_drop_sends_the_snapshot_identity(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """Drop posts snapshot_id and version and returns the store's `dropped`."""
    route = store.post(DROP).respond(200, json={"dropped": True})
    assert await source.drop("r1", snapshot_id="snap-1", version=3) is True
    assert orjson.loads(route.calls.last.request.content) == {"snapshot_id": "snap-1", "version": 3}


async def test_drop_returns_false_when_the_store_moved_on(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """`{"dropped": false}` is returned as False."""
    store.post(DROP).respond(200, json={"dropped": False})
    assert await source.drop("r1", snapshot_id="snap-1", version=3) is False


async def test_drop_is_retried_on_502(store: respx.MockRouter, source: HttpTokenSource) -> None:
    """A 502 before the answer is retried."""
    route = store.post(DROP).mock(
        side_effect=[httpx.Response(502), httpx.Response(200, json={"dropped": True})]
    )
    assert await source.drop("r1", snapshot_id="snap-1", version=3) is True
    assert route.call_count == 2


async def test_drop_answer_without_a_bool_raises_source_unavailable(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """A drop answer that is not `{"dropped": bool}` is refused."""
    store.post(DROP).respond(200, json={"dropped": "yes"})
    with pytest.raises(SourceUnavailable, match="dropped"):
        await source.drop("r1", snapshot_id="snap-1", version=3)


async def test_drop_is_not_retried_on_4xx(store: respx.MockRouter, source: HttpTokenSource) -> None:
    """A 422 on drop is final."""
    route = store.post(DROP).respond(422, json={"error": "version must be an integer"})
    with pytest.raises(SourceUnavailable, match="version must be an integer"):
        await source.drop("r1", snapshot_id="snap-1", version=3)
    assert route.call_count == 1


# -- ping and lifecycle ------------------------------------------------------------


async def test_ping_passes_on_a_healthy_store(
    store: respx.MockRouter, source: HttpTokenSource
) -> None:
    """GET /health answering 200 means reachable."""
    route = store.get("/health").respond(200, json={"status": "ok"})
    await source.ping()
    assert route.called


@pytest.mark.parametrize(
    "answer", [httpx.Response(503), httpx.ConnectError("refused")], ids=["503", "refused"]
)
async def test_ping_raises_when_the_store_is_down(
    store: respx.MockRouter, source: HttpTokenSource, answer: Any
) -> None:
    """A failing /health raises SourceUnavailable, without retrying."""
    route = store.get("/health").mock(side_effect=[answer])
    with pytest.raises(SourceUnavailable):
        await source.ping()
    assert route.call_count == 1


async def test_close_twice_then_calls_fail_cleanly(store: respx.MockRouter) -> None:
    """Closing twice is fine; a freeze afterwards raises SourceUnavailable, sending nothing."""
    source = HttpTokenSource(BASE)
    await source.close()
    await source.close()
    with pytest.raises(SourceUnavailable, match="closed"):
        await source.freeze("r1")
    assert store.calls.call_count == 0


def test_repr_hides_the_token() -> None:
    """The token never shows in the source's repr (it ends up in logs)."""
    assert "s3cret" not in repr(HttpTokenSource(BASE, token="s3cret"))


@pytest.mark.parametrize(
    "options",
    [
        {"url": "capture-store:8100"},
        {"url": BASE, "timeout_s": 0},
        {"url": BASE, "max_retries": -1},
        {"url": BASE, "token": ""},
    ],
)
def test_bad_options_are_refused(options: dict[str, Any]) -> None:
    """A URL without scheme, a non-positive timeout, negative retries or an empty token fail."""
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        HttpTokenSource(**options)


async def test_open_source_builds_an_http_source() -> None:
    """`open_source("http", ...)` with the config keys gives an HttpTokenSource."""
    source = open_source("http", url=BASE, token="t", timeout_s=2.5)
    assert isinstance(source, HttpTokenSource)
    await source.close()


# -- through the finalize path -------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (httpx.ConnectError("refused"), "StoreUnreachable: "),
        (httpx.Response(409, json={"error": "retired"}), "CaptureRetired: "),
        (httpx.Response(200, content=b"garbage"), "SourceUnavailable: "),
        (httpx.Response(200, json=snapshot_body("r2")), "SourceUnavailable: "),
        (
            httpx.Response(
                200,
                json=snapshot_body(
                    entries=[{**make_entry("r1", "c1", [1], [2]), "schema_version": 9}]
                ),
            ),
            "TokenEntryError: ",
        ),
    ],
    ids=["refused", "retired", "garbage", "other-rollout", "newer-schema"],
)
async def test_finalize_masks_every_failure_and_retires_nothing(
    store: respx.MockRouter, answer: Any, reason: str
) -> None:
    """Each failure is a masked build with a readable reason; retire then refuses it."""
    store.post(FREEZE).mock(side_effect=[answer])
    drop = store.post(DROP).respond(200, json={"dropped": True})
    record = record_for("r1")
    async with HttpTokenSource(BASE, max_retries=0) as source:
        built = await finalize_record(record, source)
        build = None if built is None else built.to_dict()
        retired = await retire_rollout_token_capture("r1", source, build)
    assert build is not None
    assert (build["mask_sample"], record["mask_sample"], build["error"].startswith(reason)) == (
        True,
        True,
        True,
    )
    assert (retired, drop.called) == (False, False)
