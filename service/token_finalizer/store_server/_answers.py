"""Protocol v1 freeze and resolve answers, encoded without turning token ids into Python lists.

A snapshot goes out as its stored lines, spliced into the answer unparsed. A
resolve answer carries the matched call's cumulative ids as the numpy array
resolution rebuilt, encoded by orjson in one pass, or, when the client asks
with `tokens=compact`, as the little-endian bytes of the ids in base64
(docs/store-protocol.md#compact-cumulative-ids): one buffer copy instead of
one decimal number per token on both sides; of those, only the ids after a
prefix the client named and already holds, once that prefix's digest is
checked (docs/store-protocol.md#known-prefix). Large answers are built in a
worker thread.

A staging rollout (docs/staging.md#protocol) freezes into its manifest and
the staged base snapshots of its records, in manifest order, spliced from
their stored JSON; it resolves over its ledger rows, the match carrying the
staging chain and chain hash instead of token ids.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from starlette.responses import Response

from token_finalizer._constants import (
    STORE_ENCODE_IN_THREAD_MIN_BYTES,
    STORE_ENCODE_IN_THREAD_MIN_TOKENS,
)
from token_finalizer.core.codec import loads_exact_json
from token_finalizer.core.errors import CaptureCorrupt
from token_finalizer.core.lineage_resolution import Resolution
from token_finalizer.core.staging import (
    PACK_ERRORS,
    LedgerResolution,
    StagingRecordError,
    pack_columns,
)
from token_finalizer.sources._packed import is_packed
from token_finalizer.sources.base import (
    CaptureStore,
    FrozenLines,
    LineageQuery,
    ParsedStagedCall,
    StagedLines,
    StagedSnapshotLine,
)
from token_finalizer.store_server._known_prefix import AnsweredIds
from token_finalizer.store_server._requests import KnownPrefix
from token_finalizer.web.answers import encoded_response, json_response

__all__ = ["compact_ids", "freeze_answer", "resolve_answer"]

_U32_LIMIT = 2**32


def _compact_entry(value: bytes) -> bytes:
    """One stored value in a compact freeze answer: a packed record as a JSON string of its
    standard base64, a plain line as it is (docs/store-protocol.md#compact-freeze)."""
    if is_packed(value):
        return b'"' + base64.b64encode(value) + b'"'
    return value


def _lines_answer(
    frozen: FrozenLines, accept_encoding: str | None, compact: bool = False
) -> Response:
    """The freeze answer spliced from the stored lines: each already is one TokenEntry's JSON
    (`compact`: the stored values, packed records in base64)."""
    lines = frozen.lines
    if compact:
        stored = [value for value in lines if is_packed(value) or value.strip()]
        lines = tuple(map(_compact_entry, stored))
        if all(map(is_packed, stored)):
            # Records are zstd-compressed already: another pass would cost the store
            # milliseconds to save little (like compact resolve answers).
            accept_encoding = None
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
            b",".join(lines),
            b"],",
            orjson.dumps(tail)[1:],
        )
    )
    return encoded_response(body, accept_encoding=accept_encoding)


def _plain_snapshot(line: StagedSnapshotLine) -> bytes:
    """A stored base snapshot as JSON (a parsed call: its base, without extras)."""
    if isinstance(line, bytes):
        return line
    try:
        base = line.base()
    except StagingRecordError as error:  # torn packed columns
        where = f"staged call {line.record.get('model_call_id')!r}"
        raise CaptureCorrupt(f"{where}: unreadable token columns ({error})") from None
    return orjson.dumps(base, option=orjson.OPT_SERIALIZE_NUMPY)


def _packed_snapshot(line: StagedSnapshotLine) -> bytes:
    """A stored base snapshot with its token columns packed (docs/staging.md#packed-columns).

    A parsed call (the file store's) brings its extras along as `extras`,
    and columns stored packed go out as they are. A snapshot that does not
    pack exactly is answered plain: the reader takes either form, and judges
    a broken one.
    """
    try:
        if isinstance(line, ParsedStagedCall):
            return orjson.dumps(line.packed(), option=orjson.OPT_SERIALIZE_NUMPY)
        record = loads_exact_json(line, allow_non_finite=True)
        if not isinstance(record, dict):
            return line
        return orjson.dumps(pack_columns(record))
    except PACK_ERRORS:  # loads_exact_json's errors are ValueErrors too
        return _plain_snapshot(line)


def _staged_answer(
    frozen: FrozenLines, staged: StagedLines, accept_encoding: str | None, packed: bool
) -> Response:
    """A staging rollout's freeze answer: the manifest, then each record's staged snapshot."""
    head = {
        "rollout_id": frozen.rollout_id,
        "kind": "staged",
        "snapshot_id": frozen.snapshot_id,
        "version": frozen.version,
        "incomplete": False,
        "entries": [],
        "manifest": staged.manifest.to_json(),
    }
    snapshots = b",".join(
        b"null" if line is None else _packed_snapshot(line) if packed else _plain_snapshot(line)
        for line in staged.snapshots
    )
    pieces = [orjson.dumps(head)[:-1], b',"snapshots":[', snapshots, b"]}"]
    # Packed columns go as they are, like compact resolve answers: base64 of
    # fixed-width images, which zstd would spend more time on (some 20 ms for
    # a 400-call rollout) than a loopback or LAN hop takes to carry them.
    return encoded_response(pieces, accept_encoding=None if packed else accept_encoding)


async def freeze_answer(
    store: CaptureStore,
    rollout_id: str,
    accept_encoding: str | None,
    *,
    packed_columns: bool = False,
    compact_entries: bool = False,
) -> Response:
    """Freeze `rollout_id` in `store` and answer the snapshot (zstd when accepted).

    The answer is spliced from the stored lines without parsing them; a large
    one is assembled and compressed in a worker thread. With
    `packed_columns`, a staging rollout's snapshots carry their token
    columns packed (each stored snapshot parsed once for it); with
    `compact_entries`, a token rollout's entries go as stored: packed
    records unexpanded (docs/store-protocol.md#compact-freeze).
    """
    frozen = await store.freeze_lines(rollout_id, stored=compact_entries)
    staged = frozen.staged
    if staged is not None:
        # A parsed snapshot (the file store's) counts as large: it is encoded here.
        size = sum(
            len(line) if isinstance(line, bytes) else STORE_ENCODE_IN_THREAD_MIN_BYTES
            for line in staged.snapshots
            if line is not None
        )
        if size >= STORE_ENCODE_IN_THREAD_MIN_BYTES:
            return await asyncio.to_thread(
                _staged_answer, frozen, staged, accept_encoding, packed_columns
            )
        return _staged_answer(frozen, staged, accept_encoding, packed_columns)
    if sum(map(len, frozen.lines)) >= STORE_ENCODE_IN_THREAD_MIN_BYTES:
        return await asyncio.to_thread(_lines_answer, frozen, accept_encoding, compact_entries)
    return _lines_answer(frozen, accept_encoding, compact_entries)


def compact_ids(ids: npt.NDArray[np.integer[Any]]) -> dict[str, Any]:
    """`{"encoding", "length", "data"}`: the ids as u32 (all below 2**32) or u64, little-endian,
    in standard base64."""
    # Arrays of int32 (the narrow dtype of docs/records-and-builds.md#token-ids)
    # hold nothing past 2**31: only a wider array needs the scan for its maximum.
    wide = ids.dtype.itemsize > 4 and len(ids) > 0 and int(ids.max()) >= _U32_LIMIT
    raw = np.ascontiguousarray(ids, dtype="<u8" if wide else "<u4").tobytes()
    return {
        "encoding": "u64le" if wide else "u32le",
        "length": len(ids),
        "data": base64.b64encode(raw).decode("ascii"),
    }


def _compact_tokens(ids: npt.NDArray[np.integer[Any]], offset: int | None) -> dict[str, Any]:
    if offset is None:
        return compact_ids(ids)
    return {**compact_ids(ids[offset:]), "offset": offset}


def _resolution_payload(
    resolution: Resolution, *, compact: bool, offset: int | None
) -> dict[str, Any]:
    match = resolution.match
    if match is None:
        return {"status": resolution.status, "reason": resolution.reason, "match": None}
    ids = match.cumulative_token_ids
    tokens: dict[str, Any] = (
        {"cumulative_tokens": _compact_tokens(ids, offset)}
        if compact
        else {"cumulative_token_ids": ids}
    )
    return {
        "status": resolution.status,
        "reason": resolution.reason,
        "match": {
            "model_call_id": match.model_call_id,
            **tokens,
            "digest": match.digest,
            "prev_len": match.prev_len,
        },
    }


def _ledger_payload(resolution: LedgerResolution) -> dict[str, Any]:
    match = resolution.match
    return {
        "status": resolution.status,
        "reason": resolution.reason,
        "match": None if match is None else match.to_json(),
    }


def _encoded(
    resolution: Resolution,
    compact: bool,
    offset: Callable[[npt.NDArray[np.integer[Any]]], int | None],
    accept_encoding: str | None,
) -> Response:
    # The compact ids are already dense (base64 of fixed-width integers): zstd
    # would spend about a millisecond per answer on the model server's hot path
    # to save a few percent of bytes on a loopback or LAN hop, so they go as they are.
    match = resolution.match
    known = None if match is None or not compact else offset(match.cumulative_token_ids)
    return json_response(
        _resolution_payload(resolution, compact=compact, offset=known),
        accept_encoding=None if compact else accept_encoding,
    )


async def resolve_answer(
    store: CaptureStore,
    rollout_id: str,
    query: LineageQuery,
    accept_encoding: str | None,
    *,
    compact: bool = False,
    known: KnownPrefix | None = None,
    answered: AnsweredIds,
) -> Response:
    """Resolve `query` over the rollout's committed calls, read without freezing.

    A rollout still being written resolves over what its writers were told is
    stored. With `compact`, the match carries `cumulative_tokens` instead of
    `cumulative_token_ids` (only the ids after `known`, when those are a
    prefix of the match's; `answered` remembers what was answered, to take a
    known prefix without hashing it). An answer carrying many token ids is
    encoded in a worker thread. A staging rollout resolves over its ledger rows.
    """
    resolution = await store.resolve_lineage(rollout_id, query)
    match = resolution.match
    if match is None:
        # Only a rollout without token entries can hold ledger rows (each kind
        # refuses the other, docs/staging.md#storage): a match over entries
        # answers without the ledger lookup, one store round trip fewer on
        # the model server's hot path.
        ledger = await store.resolve_ledger(rollout_id, query)
        if ledger is not None:
            return json_response(_ledger_payload(ledger), accept_encoding=accept_encoding)

    def offset(ids: npt.NDArray[np.integer[Any]]) -> int | None:
        return answered.known_length(rollout_id, ids, known)

    if match is not None:
        answered.remember(rollout_id, match.digest, match.cumulative_token_ids)
    if match is not None and len(match.cumulative_token_ids) >= STORE_ENCODE_IN_THREAD_MIN_TOKENS:
        return await asyncio.to_thread(_encoded, resolution, compact, offset, accept_encoding)
    return _encoded(resolution, compact, offset, accept_encoding)
