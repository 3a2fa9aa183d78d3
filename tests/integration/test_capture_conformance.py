"""Captures NeMo Gym 0.7 reads its own way, read the same way here, directly and over the wire.

Three behaviours, each through the file store directly and through a real
`store serve` process and the `http` source (the redis backend too where a
redis store can hold the case):

- a capture line stored twice (a relay that re-sent it) counts twice in
  `n_calls`, the build otherwise unchanged; the expected metrics are what
  NeMo Gym 0.7.0 reports for the same capture (computed by running it);
- a line of `schema_version` 0 fails the freeze with 0.7's own message;
- a model call id holding `:`, `/`, `%`, spaces or non-ASCII letters is
  written, announced and frozen unchanged.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.captures import make_entry
from tests.support.lineage import stamp_lineage
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.servers import free_port, running_process
from token_finalizer.core.delivery import finalize_record
from token_finalizer.sources.file.store import FileTokenStore
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer_client import BadRequestError, HttpTokenSink

pytestmark = pytest.mark.anyio

# What NeMo Gym 0.7.0's consumer reports for `_two_calls` with c1's line stored twice
# (`trajectories_for_rollout` over its own file store, run once to compute these).
GYM_METRICS_OF_A_LINE_STORED_TWICE = {
    "chains": 1,
    "delivered_fraction": 1.0,
    "empty_generation_calls": 0,
    "generated_tokens_captured": 2,
    "generated_tokens_delivered": 2,
    "n_calls": 3,
    "parent_link_failures": {},
    "quarantined_calls": 0,
    "quarantined_fraction": 0.0,
    "roots": 1,
    "terminal_attribution": {
        "call_id": None,
        "chain": "",
        "method": "none",
        "reason": "no_response_object",
    },
    "unresolved_parent_calls": 0,
}
GYM_SCHEMA_ZERO_MESSAGE = (
    "token record is schema_version 0, below the supported minimum 1. Pre-lineage records "
    "were never written in production; regenerate the rollout with a current writer."
)
ENGINE_CALL_IDS = ["chatcmpl-7f3a:0", "agent:3/call-7", "50%2F done", "..", "é-調用"]


def _two_calls(rollout_id: str) -> list[dict[str, Any]]:
    """A root and its resolved child, stamped as a 0.7 writer stamps them."""
    calls = [
        make_entry(rollout_id, "c1", [1, 2], [3], log_probs=[-0.5], created_at=1.0),
        make_entry(rollout_id, "c2", [1, 2, 3, 4], [5], log_probs=[-0.25], created_at=2.0),
    ]
    return stamp_lineage(calls, {"c1": None, "c2": "c1"})


def _append_line(directory: Path, rollout_id: str, line: bytes) -> None:
    """What a relay does: one more line at the end of the capture file, behind the store."""
    with (directory / f"{rollout_id}.tokens.jsonl").open("ab") as handle:
        handle.write(line + b"\n")


def _first_line(directory: Path, rollout_id: str) -> bytes:
    return (directory / f"{rollout_id}.tokens.jsonl").read_bytes().split(b"\n")[0]


@pytest.fixture
def rid() -> str:
    return f"conf-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`store serve --dir D` on a free port: its URL and D."""
    directory = tmp_path_factory.mktemp("conformance")
    port = free_port()
    with running_process(
        ["store", "serve", "--port", str(port), "--dir", str(directory)], port=port
    ):
        yield f"http://127.0.0.1:{port}", directory


@pytest.fixture(scope="module", params=["file", "redis"])
def store_url(request: pytest.FixtureRequest, served_dir: tuple[str, Path]) -> Iterator[str]:
    """The file store server above, then `store serve --redis URL --key-prefix P`."""
    if request.param == "file":
        yield served_dir[0]
        return
    url, port = find_redis_url(), free_port()
    serve = ["store", "serve", "--port", str(port), "--redis", url]
    with (
        unique_prefix(url, "conformance") as prefix,
        running_process([*serve, "--key-prefix", prefix], port=port),
    ):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
async def source(served_dir: tuple[str, Path]) -> AsyncIterator[HttpTokenSource]:
    opened = HttpTokenSource(served_dir[0])
    yield opened
    await opened.close()


# -- a line stored twice ------------------------------------------------------------------


async def test_a_line_stored_twice_gives_gyms_metrics_from_the_file_store(
    tmp_path: Path, rid: str
) -> None:
    """Read directly: `n_calls` 3 for two calls, one of them twice, and 0.7's other metrics."""
    store = FileTokenStore(tmp_path)
    for call in _two_calls(rid):
        await store.put(call)
    _append_line(tmp_path, rid, _first_line(tmp_path, rid))
    build = await finalize_record({"_ng_rollout_id": rid}, store)
    assert build is not None
    assert (dict(build.metrics), build.mask_sample) == (GYM_METRICS_OF_A_LINE_STORED_TWICE, False)


async def test_a_line_stored_twice_gives_gyms_metrics_through_the_store_server(
    served_dir: tuple[str, Path], source: HttpTokenSource, rid: str
) -> None:
    """Frozen by `store serve` and read by the http source: the same metrics as 0.7's."""
    url, directory = served_dir
    async with HttpTokenSink(url=url) as sink:
        for call in _two_calls(rid):
            await sink.put(call)
    _append_line(directory, rid, _first_line(directory, rid))
    build = await finalize_record({"_ng_rollout_id": rid}, source)
    assert build is not None
    assert (dict(build.metrics), build.mask_sample) == (GYM_METRICS_OF_A_LINE_STORED_TWICE, False)


# -- schema_version below 1 -----------------------------------------------------------------


def _schema_zero_line(rollout_id: str) -> bytes:
    return orjson.dumps(make_entry(rollout_id, "c0", [9], [8], schema_version=0))


async def test_schema_version_zero_fails_the_freeze_in_gyms_words_from_the_file_store(
    tmp_path: Path, rid: str
) -> None:
    """A capture holding a version-0 line: masked `freeze_failed`, with 0.7's message."""
    store = FileTokenStore(tmp_path)
    await store.put(_two_calls(rid)[0])
    _append_line(tmp_path, rid, _schema_zero_line(rid))
    build = await finalize_record({"_ng_rollout_id": rid}, store)
    assert build is not None and build.mask_reason is not None
    assert (str(build.mask_reason), build.error) == (
        "freeze_failed",
        f"TokenEntryError: {GYM_SCHEMA_ZERO_MESSAGE}",
    )


async def test_schema_version_zero_fails_the_freeze_through_the_store_server(
    served_dir: tuple[str, Path], source: HttpTokenSource, rid: str
) -> None:
    """The same capture served by `store serve`: the same masked build, nothing retirable."""
    url, directory = served_dir
    async with HttpTokenSink(url=url) as sink:
        await sink.put(_two_calls(rid)[0])
    _append_line(directory, rid, _schema_zero_line(rid))
    build = await finalize_record({"_ng_rollout_id": rid}, source)
    assert build is not None and build.mask_reason is not None
    assert (str(build.mask_reason), build.error, build.retirable) == (
        "freeze_failed",
        f"TokenEntryError: {GYM_SCHEMA_ZERO_MESSAGE}",
        False,
    )


async def test_schema_version_zero_is_refused_when_put(store_url: str, rid: str) -> None:
    """A writer putting a version-0 entry is told at once (422), naming the version."""
    async with HttpTokenSink(url=store_url) as sink:
        with pytest.raises(BadRequestError, match="schema_version 0, below the supported"):
            await sink.put(make_entry(rid, "c0", [9], [8], schema_version=0))


# -- model call ids engines use -----------------------------------------------------------


@pytest.mark.parametrize("call_id", ENGINE_CALL_IDS)
async def test_engine_call_ids_travel_unchanged_through_the_store_server(
    store_url: str, rid: str, call_id: str
) -> None:
    """Announced, put and frozen over HTTP (file and redis): the id comes back as written,
    and its announcement matches its entry."""
    async with HttpTokenSink(url=store_url) as sink, HttpTokenSource(store_url) as source:
        await sink.begin_call(rid, call_id)
        await sink.put(make_entry(rid, call_id, [1, 2], [3]))
        snapshot = await source.freeze(rid)
    assert ([e.model_call_id for e in snapshot.entries], snapshot.incomplete) == ([call_id], False)


async def test_an_engine_call_id_marked_failed_makes_the_capture_incomplete(
    store_url: str, rid: str
) -> None:
    """`mark_incomplete` with such an id is stored: the frozen capture is incomplete."""
    async with HttpTokenSink(url=store_url) as sink, HttpTokenSource(store_url) as source:
        await sink.put(make_entry(rid, "agent:3/call-1", [1, 2], [3]))
        await sink.mark_incomplete(rid, "agent:3/call-2")
        snapshot = await source.freeze(rid)
    assert snapshot.incomplete is True
