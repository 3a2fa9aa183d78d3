"""HttpLineageResolver on its own: what it sends, how it reads answers, and that it never raises.

The store is played by httpx.MockTransport, advertising every feature of
the store server (`tests.support.capabilities`; what it sends to a store
that advertises less is test_resolver_capabilities.py; the wire tests against real
store servers are tests/service/store_server/test_resolve.py and
tests/integration/test_gym_transport_conformance.py).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import json
import logging
import sys
import types
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import zstandard

from tests.client.test_cumulative import compact
from tests.support.capabilities import advertising
from tests.support.servers import free_port
from token_finalizer_client import (
    HttpLineageResolver,
    LineageMatch,
    LineageResolution,
    ResolutionStatus,
)
from token_finalizer_client.protocol import assistant_fingerprint, context_digests

pytestmark = pytest.mark.anyio

URL = "http://store.test"
ITEMS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "And tomorrow?"},
]
MATCH = {"model_call_id": "call-1", "cumulative_token_ids": [1, 2, 3], "digest": "d", "prev_len": 3}
RESOLVED = {"status": "resolved", "reason": "", "match": MATCH}
# A match without its ids, to carry them in the compact form.
COMPACT_MATCH = {"model_call_id": "call-1", "digest": "d", "prev_len": 3}

Handler = Callable[[httpx.Request], httpx.Response]


def _resolver(handler: Handler, **options: Any) -> HttpLineageResolver:
    transport = httpx.MockTransport(advertising(handler))
    return HttpLineageResolver(url=URL, transport=transport, **options)


def _answering(body: Any, status: int = 200) -> tuple[Handler, list[httpx.Request]]:
    """A handler answering `body` to every request, and the requests it received."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=body)

    return handle, seen


async def _resolve(handler: Handler, items: Any = ITEMS, rollout_id: str = "r1") -> Any:
    resolver = _resolver(handler)
    try:
        return await resolver.resolve(rollout_id, items)
    finally:
        await resolver.close()


def _lookup_error(resolution: LineageResolution) -> bool:
    return (resolution.status, resolution.reason, resolution.match) == (
        "unresolved",
        "lookup_error",
        None,
    )


# -- what it sends ---------------------------------------------------------------------------------


async def test_request_carries_fingerprint_and_prefix_digests() -> None:
    """The body is version 2, the items' assistant fingerprint and the digest of every prefix."""
    handler, seen = _answering(RESOLVED)
    await _resolve(handler)
    (request,) = seen
    assert (request.method, request.url.path) == (
        "POST",
        "/ng-rollout/r1/training-token-capture/lineage/resolve",
    )
    assert json.loads(request.content) == {
        "fingerprint_version": 2,
        "fingerprint": assistant_fingerprint(ITEMS),
        "context_digests": context_digests(ITEMS),
    }


async def test_request_asks_for_the_compact_token_form() -> None:
    """Every resolve asks for the match's ids as base64 (`?tokens=compact`)."""
    handler, seen = _answering(RESOLVED)
    await _resolve(handler)
    assert dict(seen[0].url.params) == {"tokens": "compact"}


async def test_request_asks_for_zstd_and_sends_the_token() -> None:
    """Every resolve accepts zstd answers and carries the bearer token."""
    handler, seen = _answering(RESOLVED)
    resolver = _resolver(handler, token="s3cret")
    await resolver.resolve("r1", ITEMS)
    await resolver.close()
    assert "zstd" in seen[0].headers["accept-encoding"]
    assert seen[0].headers["authorization"] == "Bearer s3cret"


async def test_root_sends_no_request() -> None:
    """Items without a model-authored turn are a root, answered without asking the store."""
    handler, seen = _answering(RESOLVED)
    resolution = await _resolve(handler, [{"role": "user", "content": "hi"}])
    assert (resolution.status, resolution.reason, resolution.match, seen) == ("root", "", None, [])


async def test_the_next_resolve_names_the_last_match_as_known() -> None:
    """After a match, the rollout's next resolve sends its digest and length as `known`."""
    first = {**COMPACT_MATCH, "digest": "e" * 64, **compact([1, 2, 3])}
    handler, seen = _answering({"status": "resolved", "reason": "", "match": first})
    async with _resolver(handler) as resolver:
        await resolver.resolve("r1", ITEMS)
        await resolver.resolve("r1", ITEMS)
        await resolver.resolve("r2", ITEMS)
    bodies = [json.loads(request.content) for request in seen]
    assert ["known" in body for body in bodies] == [False, True, False]
    assert bodies[1]["known"] == {"digest": "e" * 64, "length": 3}


async def test_ids_after_the_known_prefix_are_rebuilt_whole() -> None:
    """An answer carrying only the ids after the known ones gives the whole cumulative ids."""
    answers = iter(
        [
            {**COMPACT_MATCH, "digest": "e" * 64, **compact([1, 2, 3])},
            {**COMPACT_MATCH, "prev_len": 5, "digest": "f" * 64, **compact([4, 5], offset=3)},
        ]
    )

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"status": "resolved", "reason": "", "match": next(answers)}
        )

    async with _resolver(handle) as resolver:
        await resolver.resolve("r1", ITEMS)
        resolution = await resolver.resolve("r1", ITEMS)
    assert resolution.match is not None and resolution.match.cumulative_token_ids == (1, 2, 3, 4, 5)


# -- how it reads answers ---------------------------------------------------------------------


async def test_resolved_answer_becomes_a_match() -> None:
    """A resolved answer gives the match with its token ids as a tuple of ints."""
    resolution = await _resolve(_answering(RESOLVED)[0])
    assert resolution == LineageResolution(
        ResolutionStatus.RESOLVED, LineageMatch("call-1", (1, 2, 3), "d", 3), ""
    )


@pytest.mark.parametrize(
    ("ids", "encoding"),
    [([1, 2, 3], "u32le"), ([5, 2**63 + 5, 2**64 - 1], "u64le")],
    ids=["u32le", "u64le"],
)
async def test_compact_answer_becomes_the_same_match(ids: list[int], encoding: str) -> None:
    """A match in the compact form gives the same LineageMatch as the plain form would."""
    match = {**COMPACT_MATCH, "prev_len": len(ids), **compact(ids, encoding)}
    answer = {**RESOLVED, "match": match}
    resolution = await _resolve(_answering(answer)[0])
    assert resolution.match == LineageMatch("call-1", tuple(ids), "d", len(ids))


async def test_a_long_reason_is_shortened() -> None:
    """A store's reason of a million characters is kept to a short prefix."""
    answer = {"status": "unresolved", "reason": "x" * 1_000_000, "match": None}
    resolution = await _resolve(_answering(answer)[0])
    assert resolution.reason.startswith("x" * 200) and len(resolution.reason) < 300


async def test_unresolved_answer_keeps_its_reason() -> None:
    """An unresolved answer keeps the store's reason (no_match, ambiguous)."""
    answer = {"status": "unresolved", "reason": "ambiguous", "match": None}
    resolution = await _resolve(_answering(answer)[0])
    assert (resolution.status, resolution.reason, resolution.match) == (
        "unresolved",
        "ambiguous",
        None,
    )


async def test_zstd_answer_is_decoded() -> None:
    """A zstd-encoded answer (a long match) is read like a plain one."""
    tokens = list(range(20_000))
    match = {**MATCH, "cumulative_token_ids": tokens, "prev_len": len(tokens)}
    body = json.dumps({**RESOLVED, "match": match}).encode()

    def handle(request: httpx.Request) -> httpx.Response:
        headers = {"Content-Encoding": "zstd", "Content-Type": "application/json"}
        return httpx.Response(200, content=zstandard.compress(body), headers=headers)

    resolution = await _resolve(handle)
    assert resolution.match is not None and resolution.match.cumulative_token_ids == tuple(tokens)


async def test_status_equals_plain_strings() -> None:
    """The status compares equal to "root"/"resolved"/"unresolved" and has a .value."""
    resolution = await _resolve(_answering(RESOLVED)[0])
    assert resolution.status == "resolved" and resolution.status.value == "resolved"


async def test_status_is_gyms_enum_when_gym_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """With nemo_gym's records module loaded, the status is its ParentResolutionStatus member."""

    class ParentResolutionStatus(enum.StrEnum):
        ROOT = "root"
        RESOLVED = "resolved"
        UNRESOLVED = "unresolved"

    records = types.ModuleType("nemo_gym.token_id_capture.records")
    records.ParentResolutionStatus = ParentResolutionStatus  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nemo_gym.token_id_capture.records", records)
    resolved = await _resolve(_answering(RESOLVED)[0])
    failed = await _resolve(_answering({}, status=500)[0])
    assert resolved.status is ParentResolutionStatus.RESOLVED
    assert failed.status is ParentResolutionStatus.UNRESOLVED


# -- it never raises -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, {"error": "internal error"}),
        (503, {"error": "backing store unavailable"}),
        (422, {"error": "unsupported fingerprint_version"}),
        (401, {"error": "missing bearer token"}),
        (404, {"error": "no such path"}),
        (200, "not json at all"),
        (200, ["a", "list"]),
        (200, {"status": "maybe", "reason": "", "match": None}),
        (200, {"status": "resolved", "reason": "", "match": None}),
        (200, {"status": "root", "reason": "", "match": MATCH}),
        (200, {"status": "unresolved", "reason": 7, "match": None}),
        (200, {**RESOLVED, "match": {**MATCH, "cumulative_token_ids": [1, True]}}),
        (200, {**RESOLVED, "match": {**MATCH, "cumulative_token_ids": [1, -2]}}),
        (200, {**RESOLVED, "match": {**MATCH, "cumulative_token_ids": [1.5]}}),
        (200, {**RESOLVED, "match": {**MATCH, "cumulative_token_ids": "123"}}),
        (200, {**RESOLVED, "match": {**MATCH, "prev_len": None}}),
        (200, {**RESOLVED, "match": {**MATCH, "prev_len": 2}}),
        (200, {**RESOLVED, "match": {**MATCH, "model_call_id": ""}}),
        (200, {**RESOLVED, "match": {**MATCH, "digest": 5}}),
        (200, {**RESOLVED, "match": {**MATCH, **compact([1, 2, 3])}}),
        (200, {**RESOLVED, "match": {**COMPACT_MATCH, **compact([1, 2, 3], length=4)}}),
        (200, {**RESOLVED, "match": {**COMPACT_MATCH, **compact([1, 2]), "prev_len": 3}}),
    ],
    ids=[
        "500",
        "503",
        "422",
        "401",
        "404",
        "not-json",
        "not-an-object",
        "unknown-status",
        "resolved-without-match",
        "root-with-match",
        "reason-not-text",
        "bool-token",
        "negative-token",
        "float-token",
        "tokens-not-a-list",
        "no-prev-len",
        "prev-len-not-the-length",
        "empty-call-id",
        "digest-not-text",
        "compact-and-plain",
        "compact-length-not-the-data",
        "compact-prev-len-not-the-length",
    ],
)
async def test_refusals_and_garbage_are_lookup_errors(status: int, body: Any) -> None:
    """Any answer but a well-formed 200 resolution is unresolved with reason lookup_error."""

    def handle(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, content=body.encode())
        return httpx.Response(status, json=body)

    assert _lookup_error(await _resolve(handle))


async def test_unreachable_store_is_a_lookup_error() -> None:
    """Nothing listening on the store's port: unresolved, lookup_error (after the retries)."""
    resolver = HttpLineageResolver(url=f"http://127.0.0.1:{free_port()}", timeout=2.0)
    resolution = await resolver.resolve("r1", ITEMS)
    await resolver.close()
    assert _lookup_error(resolution)


async def test_timeout_is_a_lookup_error() -> None:
    """A store that does not answer in time: unresolved, lookup_error."""

    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    assert _lookup_error(await _resolve(handle))


async def test_transient_unavailability_is_retried() -> None:
    """A 503 followed by an answer resolves: the call went through the retry policy."""
    answers = iter(
        [httpx.Response(503, json={"error": "busy"}), httpx.Response(200, json=RESOLVED)]
    )
    resolution = await _resolve(lambda request: next(answers))
    assert resolution.status == "resolved"


async def test_unfingerprintable_items_are_a_lookup_error_without_a_request() -> None:
    """An assistant turn whose content is a number cannot be hashed: lookup_error, nothing sent."""
    handler, seen = _answering(RESOLVED)
    items = [{"role": "user", "content": "q"}, {"role": "assistant", "content": 5}]
    assert _lookup_error(await _resolve(handler, items)) and seen == []


async def test_bad_rollout_id_is_a_lookup_error_without_a_request() -> None:
    """A rollout id breaking the store id rule: lookup_error, nothing sent."""
    handler, seen = _answering(RESOLVED)
    assert _lookup_error(await _resolve(handler, rollout_id="a/b")) and seen == []


async def test_closed_resolver_answers_lookup_error() -> None:
    """After close, a resolve is a lookup_error (and closing again is harmless)."""
    resolver = _resolver(_answering(RESOLVED)[0])
    await resolver.close()
    await resolver.close()
    assert _lookup_error(await resolver.resolve("r1", ITEMS))


async def test_failed_lookup_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A failed lookup leaves one warning naming the rollout."""
    with caplog.at_level(logging.WARNING, logger="token_finalizer_client"):
        await _resolve(_answering({"error": "x"}, status=500)[0])
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert "'r1'" in caplog.records[0].getMessage()


async def test_cancellation_is_not_swallowed() -> None:
    """Cancelling a resolve in flight cancels it (only failures become unresolved)."""
    started = asyncio.Event()

    class Hanging(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    resolver = HttpLineageResolver(url=URL, transport=Hanging())
    task = asyncio.create_task(resolver.resolve("r1", ITEMS))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await resolver.close()


@pytest.mark.parametrize(
    ("status", "match"),
    [(ResolutionStatus.RESOLVED, None), (ResolutionStatus.ROOT, LineageMatch("c", (1,), "d", 1))],
    ids=["resolved-without-match", "root-with-match"],
)
def test_resolution_keeps_match_exactly_for_resolved(
    status: ResolutionStatus, match: LineageMatch | None
) -> None:
    """A resolution carries a match exactly when it is resolved (Gym's own invariant)."""
    with pytest.raises(ValueError, match="match"):
        LineageResolution(status, match)


# -- NeMo Gym 0.7's LineageResolver shape -------------------------------------------------------


def test_built_from_keyword_arguments_like_the_sink() -> None:
    """Gym builds it as `HttpLineageResolver(**lineage_store_kwargs)`; positional use is refused."""
    kwargs: dict[str, Any] = {"url": URL, "token": "t", "timeout": 3.0, "max_retries": 1}
    resolver = HttpLineageResolver(**kwargs)
    assert (resolver.url, resolver.max_retries) == (URL, 1)
    with pytest.raises(TypeError):
        HttpLineageResolver(URL)  # type: ignore[misc]


def test_protocol_methods_have_gyms_shape() -> None:
    """resolve and close are coroutines; is_process_shared is a plain method answering True."""
    resolver = HttpLineageResolver(url=URL)
    assert inspect.iscoroutinefunction(resolver.resolve)
    assert inspect.iscoroutinefunction(resolver.close)
    assert resolver.is_process_shared() is True


def test_repr_hides_the_token() -> None:
    """The repr names the store, never the bearer token."""
    assert "s3cret" not in repr(HttpLineageResolver(url=URL, token="s3cret"))


@pytest.mark.parametrize(
    "options",
    [{"url": "ftp://store"}, {"url": URL, "timeout": 0}, {"url": URL, "token": ""}],
    ids=["not-http", "zero-timeout", "empty-token"],
)
def test_bad_configuration_fails_at_construction(options: dict[str, Any]) -> None:
    """A wrong url, timeout or token fails when the model server starts, not per call."""
    with pytest.raises(ValueError):  # noqa: PT011 - each message names its own option
        HttpLineageResolver(**options)
