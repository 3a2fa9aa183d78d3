"""Protocol v1 freeze and resolve answers, encoded without turning token ids into Python lists.

A file store's snapshot goes out as its stored lines, spliced into the answer
unparsed; any other store's token arrays go out as the numpy arrays it holds,
encoded by orjson in one pass. A resolve answer carries the matched call's
cumulative ids as the numpy array resolution rebuilt. Large answers are built
in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

from token_finalizer._constants import (
    STORE_ENCODE_IN_THREAD_MIN_BYTES,
    STORE_ENCODE_IN_THREAD_MIN_TOKENS,
)
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.lineage_resolution import Resolution, resolve_lineage
from token_finalizer.sources.file import FrozenLines
from token_finalizer.store_server._requests import ResolveRequest
from token_finalizer.web.answers import encoded_response, json_response

__all__ = ["freeze_answer", "resolve_answer"]


def _snapshot_payload(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "rollout_id": snapshot.rollout_id,
        "entries": [entry.to_dict(as_lists=False) for entry in snapshot.entries],
        "incomplete": snapshot.incomplete,
        "snapshot_id": snapshot.snapshot_id,
        "version": snapshot.version,
    }


def _all_finite(snapshot: Snapshot) -> bool:
    return all(bool(np.isfinite(e.generation_log_probs).all()) for e in snapshot.entries)


def _stdlib_answer(payload: dict[str, Any], accept_encoding: str | None) -> Response:
    """The rare snapshot with -inf/NaN log probs: orjson would write them as null.

    The stdlib writes `-Infinity`, as the file store does on disk and as every
    reader of ours (loads_json) accepts, so the value survives the trip.
    """
    for entry in payload["entries"]:
        for key, value in entry.items():
            if isinstance(value, np.ndarray):
                entry[key] = value.tolist()
    return encoded_response(
        json.dumps(payload, separators=(",", ":")).encode(), accept_encoding=accept_encoding
    )


def _snapshot_answer(snapshot: Snapshot, accept_encoding: str | None) -> Response:
    payload = _snapshot_payload(snapshot)
    if not _all_finite(snapshot):
        return _stdlib_answer(payload, accept_encoding)
    return json_response(payload, accept_encoding=accept_encoding)


def _lines_answer(frozen: FrozenLines, accept_encoding: str | None) -> Response:
    """The freeze answer spliced from the stored lines: each already is one TokenEntry's JSON."""
    head = {"rollout_id": frozen.rollout_id}
    tail = {
        "incomplete": frozen.incomplete,
        "snapshot_id": frozen.snapshot_id,
        "version": frozen.version,
    }
    body = b"".join(
        (
            orjson.dumps(head)[:-1],
            b',"entries":[',
            b",".join(frozen.lines),
            b"],",
            orjson.dumps(tail)[1:],
        )
    )
    return encoded_response(body, accept_encoding=accept_encoding)


async def freeze_answer(store: Any, rollout_id: str, accept_encoding: str | None) -> Response:
    """Freeze `rollout_id` in `store` and answer the snapshot (zstd when accepted).

    A store that can hand over its stored lines (FileTokenStore.freeze_lines)
    is answered from them without parsing; any other store's snapshot is
    encoded with orjson straight from its numpy arrays.
    """
    freeze_lines = getattr(store, "freeze_lines", None)
    if freeze_lines is not None:
        frozen: FrozenLines = await freeze_lines(rollout_id)
        if sum(map(len, frozen.lines)) >= STORE_ENCODE_IN_THREAD_MIN_BYTES:
            return await asyncio.to_thread(_lines_answer, frozen, accept_encoding)
        return _lines_answer(frozen, accept_encoding)
    snapshot: Snapshot = await store.freeze(rollout_id)
    tokens = sum(entry.cumulative_length for entry in snapshot.entries)
    if tokens >= STORE_ENCODE_IN_THREAD_MIN_TOKENS:
        # Encoding 5M tokens takes a few hundred ms: keep other writers served meanwhile.
        return await asyncio.to_thread(_snapshot_answer, snapshot, accept_encoding)
    return _snapshot_answer(snapshot, accept_encoding)


def _resolution_payload(resolution: Resolution) -> dict[str, Any]:
    match = resolution.match
    return {
        "status": resolution.status,
        "reason": resolution.reason,
        "match": None
        if match is None
        else {
            "model_call_id": match.model_call_id,
            "cumulative_token_ids": match.cumulative_token_ids,
            "digest": match.digest,
            "prev_len": match.prev_len,
        },
    }


def _resolved_answer(
    entries: tuple[TokenEntry, ...], request: ResolveRequest, accept_encoding: str | None
) -> Response:
    resolution = resolve_lineage(
        entries, request.fingerprint, request.fingerprint_version, request.context_digests
    )
    return json_response(_resolution_payload(resolution), accept_encoding=accept_encoding)


async def resolve_answer(
    store: Any, rollout_id: str, request: ResolveRequest, accept_encoding: str | None
) -> Response:
    """Resolve `request` over the rollout's committed entries, read without freezing.

    The store's `committed_entries` is read-only, so a rollout still being
    written resolves over what its writers were told is stored. An empty
    fingerprint is a root and reads nothing. Rebuilding a long delta chain and
    encoding its ids run in a worker thread.
    """
    entries: tuple[TokenEntry, ...] = ()
    if request.fingerprint:
        entries = await store.committed_entries(rollout_id)
    tokens = sum(entry.cumulative_length for entry in entries)
    if tokens >= STORE_ENCODE_IN_THREAD_MIN_TOKENS:
        return await asyncio.to_thread(_resolved_answer, entries, request, accept_encoding)
    return _resolved_answer(entries, request, accept_encoding)
