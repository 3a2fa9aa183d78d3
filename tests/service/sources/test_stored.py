"""The compact freeze reads the very entries the plain freeze reads, over every entry shape.

Direct freezes (memory, file, redis) read stored values without writing their
lines; the `http` source asks a store server for the compact form and reads
references + suffixes. Each is compared with the plain read (the canonical
lines parsed as before) entry by entry: every field, every array's values and
dtype. See docs/store-protocol.md#compact-freeze.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import respx

from bench.compact_freeze import without_compact_freeze
from tests.service.sources.test_packed import ROLLOUT, _chain, _lines, _shapes, _writers
from tests.support.captures import make_entry
from tests.support.lineage import stamp_lineage
from tests.support.staging_stores import Conversation
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.errors import SourceUnavailable
from token_finalizer.sources._entries import parse_capture
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer.store_server import create_store_app

pytestmark = pytest.mark.anyio

KINDS = ("memory", "file", "redis")
URL = "http://capture-store.test"


def _comparable(value: Any) -> Any:
    """`value` with every numpy array (at any depth) as (dtype, bit pattern): NaNs compare."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, np.ascontiguousarray(value).tobytes())
    if isinstance(value, dict):
        return {key: _comparable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [type(value).__name__, *map(_comparable, value)]
    return value


def _fields(entry: TokenEntry) -> dict[str, Any]:
    """Every field of an entry, comparable."""
    return {f.name: _comparable(getattr(entry, f.name)) for f in dataclasses.fields(entry)}


def assert_same_snapshot(compact: Snapshot, plain: Snapshot) -> None:
    """The two snapshots hold the same entries, field for field and dtype for dtype."""
    assert [_fields(entry) for entry in compact.entries] == [
        _fields(entry) for entry in plain.entries
    ]
    rest = ("rollout_id", "incomplete", "snapshot_id", "version", "staged")
    assert [getattr(compact, name) for name in rest] == [getattr(plain, name) for name in rest]


def _gym_delta(calls: int) -> list[dict[str, Any]]:
    full = _chain(calls)
    parents = {f"c{i}": f"c{i - 1}" if i else None for i in range(calls)}
    plain = [{k: v for k, v in e.items() if k != "parent_resolution"} for e in full]
    return stamp_lineage(plain, parents, delta=True)


def _wide_sibling() -> list[dict[str, Any]]:
    """A call whose sibling widened the ids both extend (a u64 tape) though it holds none."""
    entries = _chain(2)
    parent = entries[-1]
    cumulative = parent["prompt_token_ids"] + parent["generation_token_ids"]
    for call_id, extra_id in (("wide", 2**40), ("narrow", 77)):
        entries.append(
            make_entry(
                ROLLOUT,
                call_id,
                [*cumulative, extra_id],
                [extra_id],
                parent_resolution="resolved",
                parent_call_id="c1",
            )
        )
    entries.append(
        make_entry(
            ROLLOUT,
            "grandchild",
            [*cumulative, 77, 77, 5],
            [6],
            parent_resolution="resolved",
            parent_call_id="narrow",
        )
    )
    return entries


def _nested_token_keys() -> list[dict[str, Any]]:
    """Entries whose other fields hold token keys too (an output item, an `entries` list)."""
    entries = _chain(3)
    item = {"type": "message", "prompt_token_ids": [1, 2], "generation_token_ids": [3]}
    entries[1] = dict(entries[1], output_items=[item])
    entries[2] = dict(entries[2], entries=[{"prompt_token_ids": [4, 5]}])
    return entries


SHAPES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "full-chain": lambda: _chain(8),
    "gym-delta": lambda: _gym_delta(6),
    "every-shape": _shapes,
    "wide-sibling": _wide_sibling,
    "nested-token-keys": _nested_token_keys,
}


async def _plain_read(store: Any) -> Snapshot:
    """The snapshot as every reader read it before: the canonical lines, parsed."""
    frozen = await store.freeze_lines(ROLLOUT)
    return Snapshot(
        rollout_id=ROLLOUT,
        entries=parse_capture(frozen.lines, ROLLOUT, "the capture"),
        incomplete=frozen.incomplete,
        snapshot_id=frozen.snapshot_id,
        version=frozen.version,
    )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_direct_freeze_reads_what_the_lines_read(
    kind: str, shape: str, tmp_path: Path
) -> None:
    """A store's own freeze (stored values read directly) equals the lines parsed."""
    entries = SHAPES[shape]()
    async with _writers(kind, tmp_path / "capture") as (store, _):
        for entry in entries:
            await store.put(entry)
        assert_same_snapshot(await store.freeze(ROLLOUT), await _plain_read(store))


def _recording(app: Any, queries: list[bytes]) -> Any:
    """The app, noting the query of every freeze it serves."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/freeze"):
            queries.append(scope["query_string"])
        await app(scope, receive, send)

    return wrapped


@asynccontextmanager
async def _sources(store: Any) -> AsyncIterator[tuple[HttpTokenSource, HttpTokenSource]]:
    """Two http sources over one store server: one freezing compact (every freeze it
    sends checked to ask `entries=compact`), one plain."""
    app = create_store_app(store)
    queries: list[bytes] = []
    compact = HttpTokenSource(URL, transport=httpx.ASGITransport(app=_recording(app, queries)))
    plain = HttpTokenSource(URL, transport=httpx.ASGITransport(app=without_compact_freeze(app)))
    try:
        yield compact, plain
    finally:
        await compact.close()
        await plain.close()
    assert queries and all(b"entries=compact" in query for query in queries)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_compact_remote_freeze_reads_what_a_plain_one_reads(
    kind: str, shape: str, tmp_path: Path
) -> None:
    """Over the store server, the compact freeze's snapshot equals the plain freeze's."""
    entries = SHAPES[shape]()
    async with _writers(kind, tmp_path / "capture") as (store, _):
        for entry in entries:
            await store.put(entry)
        async with _sources(store) as (compact, plain):
            assert_same_snapshot(await compact.freeze(ROLLOUT), await plain.freeze(ROLLOUT))


async def test_the_compact_answer_carries_records_not_lines() -> None:
    """`freeze?entries=compact` answers the chain's entries as base64 records, far smaller
    than the lines, uncompressed."""
    store = MemoryTokenStore()
    for entry in _chain(30, step=200):
        await store.put(entry)
    path = f"/ng-rollout/{ROLLOUT}/training-token-capture/freeze"
    transport = httpx.ASGITransport(app=create_store_app(store))
    async with httpx.AsyncClient(transport=transport, base_url=URL) as client:
        compact = await client.post(path, params={"entries": "compact"})
        plain = await client.post(path)
    entries = compact.json()["entries"]
    assert all(isinstance(entry, str) for entry in entries)
    assert len(entries) == 30
    assert "content-encoding" not in compact.headers
    assert len(compact.content) * 10 < len(plain.content)


async def test_an_unknown_entries_form_is_refused() -> None:
    """`entries=` other than plain or compact is a 422 naming the forms."""
    transport = httpx.ASGITransport(app=create_store_app(MemoryTokenStore()))
    async with httpx.AsyncClient(transport=transport, base_url=URL) as client:
        answer = await client.post(
            f"/ng-rollout/{ROLLOUT}/training-token-capture/freeze", params={"entries": "x"}
        )
    assert (answer.status_code, "plain, compact" in answer.json()["error"]) == (422, True)


async def test_old_plain_lines_beside_records_read_alike(tmp_path: Path) -> None:
    """A jsonl of an older version's plain lines, then records referring to them: the
    compact freezes (direct and remote) read what the plain ones read."""
    entries = _chain(6)
    directory = tmp_path / "capture"
    directory.mkdir()
    old = b"".join(line + b"\n" for line in _lines(entries[:3]))
    (directory / f"{ROLLOUT}.tokens.jsonl").write_bytes(old)
    store = FileTokenStore(directory)
    for entry in entries[3:]:
        await store.put(entry)
    plain = await _plain_read(store)
    assert_same_snapshot(await store.freeze(ROLLOUT), plain)
    async with _sources(store) as (compact, plain_source):
        remote = await compact.freeze(ROLLOUT)
        assert_same_snapshot(remote, await plain_source.freeze(ROLLOUT))
    assert_same_snapshot(remote, plain)


async def test_a_staged_rollout_freezes_alike_compact_or_plain() -> None:
    """A staging rollout's snapshot is the same whether the freeze asked compact or not."""
    store = MemoryTokenStore()
    chat = Conversation(ROLLOUT)
    chat.add("c1", extras={"routed_experts": [[[3, 4]]]})
    chat.add("c2")
    for record, row in zip(chat.records, chat.rows, strict=True):
        await store.stage(record)
        await store.record_ledger_row(ROLLOUT, row)
    async with _sources(store) as (compact, plain):
        first, second = await compact.freeze(ROLLOUT), await plain.freeze(ROLLOUT)
    assert first.staged is not None
    assert_same_snapshot(first, second)


async def test_a_torn_record_in_a_compact_answer_is_the_store_s_fault() -> None:
    """A string entry that is no packed record makes the freeze SourceUnavailable, naming it."""
    body = {
        "rollout_id": ROLLOUT,
        "entries": ["bm90IGEgcmVjb3Jk"],
        "incomplete": False,
        "snapshot_id": "s",
        "version": 1,
    }

    with respx.mock(base_url=URL, assert_all_called=False) as mocked:
        mocked.get("/capabilities").respond(
            200, json={"protocol": 1, "features": ["compact_freeze"]}
        )
        mocked.post(f"/ng-rollout/{ROLLOUT}/training-token-capture/freeze").respond(200, json=body)
        source = HttpTokenSource(URL)
        try:
            with pytest.raises(
                SourceUnavailable, match=r"unreadable packed entry \(entries\[0\]\)"
            ):
                await source.freeze(ROLLOUT)
        finally:
            await source.close()
