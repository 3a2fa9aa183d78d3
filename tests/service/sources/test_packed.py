"""Entries packed and deduplicated at rest: invisible to every reader of every store.

See docs/store-protocol.md#packed-at-rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.captures import make_entry
from tests.support.lineage import stamp_lineage
from tests.support.redis import redis_url, unique_prefix
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.core.codec import dumps_entry_line
from token_finalizer.core.entries import TokenEntry
from token_finalizer.sources._entries import entry_payload
from token_finalizer.sources._state import line_digest
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer.sources.redis._lineage import index_arguments

pytestmark = pytest.mark.anyio

KINDS = ("memory", "file", "redis")
ROLLOUT = "r1"


@asynccontextmanager
async def _writers(kind: str, directory: Path) -> AsyncIterator[tuple[Any, Any]]:
    """The store under test and a second writer of the same captures (another process's
    store object; the memory store has only itself)."""
    if kind == "memory":
        store = MemoryTokenStore()
        yield store, store
        return
    if kind == "file":
        yield FileTokenStore(directory), FileTokenStore(directory)
        return
    url = redis_url()
    with unique_prefix(url, "packed") as prefix:
        one, two = RedisTokenStore(url, key_prefix=prefix), RedisTokenStore(url, key_prefix=prefix)
        try:
            yield one, two
        finally:
            await one.close()
            await two.close()


def _chain(calls: int, *, step: int = 30, first_id: int = 1000) -> list[dict[str, Any]]:
    """A full-prompt agent rollout: each prompt is the previous call's ids and more."""
    entries, context, next_id = [], [], first_id
    for index in range(calls):
        context = context + list(range(next_id, next_id + step))
        generation = list(range(next_id + step, next_id + step + 5))
        next_id += step + 5
        entries.append(make_entry(ROLLOUT, f"c{index}", context, generation))
        context = context + generation
    parents = {f"c{i}": f"c{i - 1}" if i else None for i in range(calls)}
    return stamp_lineage(entries, parents)


def _lines(entries: list[dict[str, Any]]) -> tuple[bytes, ...]:
    return tuple(dumps_entry_line(entry) for entry in entries)


async def _round_trip(kind: str, tmp_path: Path, entries: list[dict[str, Any]]) -> None:
    async with _writers(kind, tmp_path / "capture") as (store, _):
        for entry in entries:
            await store.put(entry)
        frozen = await store.freeze_lines(ROLLOUT)
        assert frozen.lines == _lines(entries)
        snapshot = await store.freeze(ROLLOUT)
        # Compared as lines: a NaN log prob is not equal to itself.
        assert [dumps_entry_line(entry.to_dict()) for entry in snapshot.entries] == [
            dumps_entry_line(TokenEntry.from_json(line).to_dict()) for line in _lines(entries)
        ]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_full_prompt_chain_freezes_as_written(kind: str, tmp_path: Path) -> None:
    """A full-prompt chain (kept as references) freezes byte for byte as it was put."""
    await _round_trip(kind, tmp_path, _chain(6))


@pytest.mark.parametrize("kind", KINDS)
async def test_gym_delta_records_freeze_as_written(kind: str, tmp_path: Path) -> None:
    """Gym's own delta records stay delta records, byte for byte."""
    full = _chain(5)
    parents = {f"c{i}": f"c{i - 1}" if i else None for i in range(5)}
    plain = [{k: v for k, v in e.items() if k not in ("parent_resolution",)} for e in full]
    await _round_trip(kind, tmp_path, stamp_lineage(plain, parents, delta=True))


def _shapes() -> list[dict[str, Any]]:
    """One rollout holding every awkward shape after a plain chain."""
    entries = _chain(3)
    parent = entries[-1]
    cumulative = parent["prompt_token_ids"] + parent["generation_token_ids"]

    def child(call_id: str, prompt: list[int], generation: list[int], **kw: Any) -> None:
        entries.append(
            make_entry(
                ROLLOUT,
                call_id,
                prompt,
                generation,
                parent_resolution="resolved",
                parent_call_id="c2",
                **kw,
            )
        )

    child("wide32", [*cumulative, 2**32 + 7], [2**33], log_probs=[-0.1])
    child("wide63", [*cumulative, 2**63 + 5, 2**64 - 1], [2**63], log_probs=[-0.5])
    child("f32", [*cumulative, 1], [2, 3], log_probs=[-0.5, -0.25])
    child("f64", [*cumulative, 1], [2, 3], log_probs=[-0.1, -1e-300])
    child("nonfinite", [*cumulative, 1], [2, 3, 4], log_probs=[float("-inf"), float("nan"), -0.0])
    child("empty", [*cumulative, 9], [], log_probs=[])
    child("elsewhere", [5, 6, *cumulative], [7])
    child("shorter", cumulative[:-3], [7])
    child("intlogprob", [*cumulative, 1], [2], log_probs=[0])
    return entries


@pytest.mark.parametrize("kind", KINDS)
async def test_every_entry_shape_freezes_as_written(kind: str, tmp_path: Path) -> None:
    """Wide ids, f32-exact or not and non-finite log probs, empty generations, prompts
    that do not start with their parent's ids: each freezes byte for byte."""
    await _round_trip(kind, tmp_path, _shapes())


@pytest.mark.parametrize("kind", ["file", "redis"])
async def test_a_parent_written_by_another_writer(kind: str, tmp_path: Path) -> None:
    """Calls put by two store objects in turn (two processes) freeze as written."""
    entries = _chain(6)
    async with _writers(kind, tmp_path / "capture") as (store, other):
        for index, entry in enumerate(entries):
            await (other if index % 2 else store).put(entry)
        assert (await store.freeze_lines(ROLLOUT)).lines == _lines(entries)


@pytest.mark.parametrize("kind", KINDS)
async def test_the_same_payload_again_is_a_replay(kind: str, tmp_path: Path) -> None:
    """A referenced entry put again is a no-op; a different payload for it a conflict."""
    entries = _chain(3)
    async with _writers(kind, tmp_path / "capture") as (store, other):
        for entry in entries:
            await store.put(entry)
        await other.put(entries[2])
        changed = dict(entries[2], generation_log_probs=[-9.0] * 5)
        with pytest.raises(Exception, match="different payload"):
            await other.put(changed)
        assert (await store.freeze_lines(ROLLOUT)).lines == _lines(entries)


async def test_a_full_prompt_chain_is_stored_as_its_suffixes(tmp_path: Path) -> None:
    """The jsonl of a full-prompt chain holds about its distinct ids, not every prompt:
    under twice the floor (distinct ids and generated log probs at 4 bytes each)."""
    entries = _chain(20, step=200)
    store = FileTokenStore(tmp_path / "capture")
    for entry in entries:
        await store.put(entry)
    stored = (tmp_path / "capture" / f"{ROLLOUT}.tokens.jsonl").stat().st_size
    floor = (len(entries[-1]["prompt_token_ids"]) + 5) * 4 + len(entries) * 5 * 4
    assert stored < 2 * floor


async def test_old_plain_lines_read_beside_packed_ones(tmp_path: Path) -> None:
    """A jsonl written by an older version (plain lines) reads, and takes packed lines."""
    entries = _chain(4)
    directory = tmp_path / "capture"
    directory.mkdir()
    old = b"".join(line + b"\n" for line in _lines(entries[:2]))
    (directory / f"{ROLLOUT}.tokens.jsonl").write_bytes(old)
    store = FileTokenStore(directory)
    for entry in entries[2:]:
        await store.put(entry)
    assert (await store.freeze_lines(ROLLOUT)).lines == _lines(entries)


async def test_old_redis_values_read_beside_packed_ones() -> None:
    """Entries stored by an older version (the line itself) read, and take packed ones."""
    entries = _chain(4)
    url = redis_url()
    with unique_prefix(url, "packed-old") as prefix:
        store = RedisTokenStore(url, key_prefix=prefix)
        try:
            for entry in entries[:2]:  # what a 0.4.0 put script stored: the line
                parsed, line = entry_payload(entry)
                arguments = (parsed.model_call_id, line_digest(line), line, b"", 0)
                await store._redis.run(
                    "put", ROLLOUT, (*arguments, *index_arguments(parsed), "", ""), "put"
                )
            raw = redis.Redis.from_url(url)
            values = raw.hvals(store.keys(ROLLOUT)[1])
            raw.close()
            assert all(value.startswith(b"{") for value in values)
            for entry in entries[2:]:
                await store.put(entry)
            assert (await store.freeze_lines(ROLLOUT)).lines == _lines(entries)
        finally:
            await store.close()
