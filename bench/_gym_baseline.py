"""A stand-in for NeMo Gym 0.7.0's in-process capture path: its file store and file lineage store.

The released wheel needs Python >= 3.13 and is never installed here, so the
hot-path bench compares our store server against this re-implementation of
the same algorithm and I/O pattern (our code; the wheel was only read to learn
the behaviour, and `bench/_hotpath_wheel.py` runs the real one beside it to
check the stand-in's timings). What the model server pays per call:

- put (in a worker thread): the entry (a pydantic model) dumped to JSON with
  sorted keys and hashed; the rollout's lock file flocked exclusively; the
  state file (call id -> payload digest, indexed size) read; the line
  appended and fsynced; the state rewritten through a temporary file and a
  rename, without fsync.
- begin_call (in a worker thread): the exclusive flock, the state read, the
  call id appended to the intents file and fsynced.
- resolve (in a worker thread): one of 256 striped in-process locks and the
  shared flock; the lines appended since this process last looked, parsed and
  validated into entries and indexed by continuation fingerprint (metadata
  only: each node keeps its line's byte offset); the match chosen by
  fingerprint and context digest; its cumulative ids rebuilt by reading its
  delta chain back to the last one this process rebuilt for the rollout (one
  per rollout, under an 8M-token budget) or to a full-prompt anchor, each line
  parsed and validated again, then the digest checked. An unresolved answer
  also looks for a ledger file under the exclusive flock, as 0.7 does.

Not reproduced: freeze, drop, sweep, recovery from torn tails beyond what
put needs, external staging.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import hashlib
import os
import struct
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from bench._hotpath_workload import ModelCall
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    conversation_digest,
)

__all__ = ["GymStyleEntry", "GymStyleFileStore", "GymStyleLineageStore", "stamp_entry"]

_DIGEST_DOMAIN = b"nemo-gym-tokens"
# Gym's bounds: rollouts whose index is cached, tokens of rebuilt chains kept, lock stripes.
_CACHED_ROLLOUTS = 65_536
_CACHED_TOKENS = 8_000_000
_LOCK_STRIPES = 256
_MAX_CHAIN = 10_000


class ParentStatus(enum.StrEnum):
    ROOT = "root"
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"


def _token_digest(ids: list[int] | tuple[int, ...]) -> str:
    """Token digest v1 the way 0.7 computes it: one struct pack, one SHA-256."""
    if not ids:
        return hashlib.sha256(_DIGEST_DOMAIN).hexdigest()
    packed = struct.pack(">BQ", 1, len(ids)) + struct.pack(f">{len(ids)}Q", *ids)
    return hashlib.sha256(_DIGEST_DOMAIN + packed).hexdigest()


class GymStyleEntry(BaseModel):
    """A TokenEntry with 0.7's field types and checks: validating one costs what it costs there."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = 1
    rollout_id: str
    model_call_id: str
    model: str = ""
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: Any | None = None
    output_items: list[dict[str, Any]] = Field(default_factory=list)
    token_item_index: int | None = None
    response_id: str | None = None
    created_at: float = 0.0
    parent_call_id: str | None = None
    cum_len: int | None = None
    digest: str | None = None
    parent_resolution: ParentStatus | None = None
    continuation_fingerprint: str = ""
    continuation_context_len: int = 0
    continuation_context_digest: str = ""
    parent_resolution_reason: str = ""
    fingerprint_version: int | None = None
    prompt_is_delta: bool = False
    prefix_requested: bool = False
    prefix_supplied: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> GymStyleEntry:
        if self.schema_version != 1:
            raise ValueError(f"schema_version {self.schema_version} is not 1")
        if len(self.generation_token_ids) != len(self.generation_log_probs):
            raise ValueError("one log probability per generated token")
        index = self.token_item_index
        if index is not None and not 0 <= index < len(self.output_items):
            raise ValueError("token_item_index outside output_items")
        if self.parent_resolution == ParentStatus.RESOLVED and not self.parent_call_id:
            raise ValueError("a resolved parent needs its call id")
        if (
            self.parent_resolution in (ParentStatus.ROOT, ParentStatus.UNRESOLVED)
            and self.parent_call_id is not None
        ):
            raise ValueError("a root or unresolved call names no parent")
        if self.prompt_is_delta and (
            self.parent_call_id is None or self.parent_resolution != ParentStatus.RESOLVED
        ):
            raise ValueError("a delta prompt needs a resolved parent")
        return self


@dataclass(frozen=True, slots=True)
class Match:
    model_call_id: str
    cumulative_token_ids: tuple[int, ...]
    digest: str
    prev_len: int = 0


@dataclass(frozen=True, slots=True)
class Resolution:
    status: ParentStatus
    match: Match | None = None
    reason: str = ""


def stamp_entry(call: ModelCall, resolution: Any, delta: bool) -> GymStyleEntry:
    """The entry a 0.7 writer puts for `call`, stamped with `resolution` (any LineageResolution).

    Validated on construction as 0.7 builds it from the response; then the
    continuation fields, a delta prompt when the prompt extends the match's
    ids, the full sequence's cum_len and digest, and the parent decision.
    """
    entry = GymStyleEntry(**call.entry_fields())
    entry.continuation_fingerprint = assistant_fingerprint(
        [*call.request_items, *call.output_items]
    )
    entry.continuation_context_len = len(call.request_items)
    entry.continuation_context_digest = conversation_digest(call.request_items)
    entry.fingerprint_version = FINGERPRINT_VERSION
    status = str(getattr(resolution.status, "value", resolution.status))
    match = resolution.match
    prompt = list(entry.prompt_token_ids)
    cumulative = prompt + list(entry.generation_token_ids)
    if delta and status == "resolved" and match is not None and match.cumulative_token_ids:
        parent = list(match.cumulative_token_ids)
        if len(prompt) >= len(parent) and prompt[: len(parent)] == parent:
            entry.prompt_token_ids = prompt[len(parent) :]
            entry.prompt_is_delta = True
    entry.cum_len = len(cumulative)
    entry.digest = _token_digest(cumulative)
    entry.parent_call_id = match.model_call_id if match is not None else None
    entry.parent_resolution = ParentStatus(status)
    entry.parent_resolution_reason = getattr(resolution, "reason", "") or ""
    return entry


def _fresh_state() -> dict[str, Any]:
    return {
        "frozen": False,
        "retired": False,
        "incomplete": False,
        "snapshot_id": "",
        "version": 0,
        "entry_digests": {},
        "indexed_size": 0,
    }


class GymStyleFileStore:
    """0.7's file store, as far as a model server's put and begin_call reach."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, rollout_id: str, suffix: str) -> Path:
        return self.root / f"{rollout_id}.tokens.{suffix}"

    @contextlib.contextmanager
    def locked(self, rollout_id: str, *, shared: bool = False) -> Iterator[None]:
        with self.path(rollout_id, "lock").open("a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _state(self, rollout_id: str) -> dict[str, Any]:
        path = self.path(rollout_id, "state.json")
        if not path.exists():
            return _fresh_state()
        state = orjson.loads(path.read_bytes())
        if not isinstance(state, dict):
            raise ValueError(f"state of {rollout_id} is not an object")
        return state

    def _write_state(self, rollout_id: str, state: dict[str, Any]) -> None:
        """Atomic replace without fsync: 0.7 rebuilds this index from the lines if it is lost."""
        payload = orjson.dumps(state, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE)
        with tempfile.NamedTemporaryFile(
            dir=self.root, prefix=".tokens-state-", delete=False
        ) as handle:
            temporary = Path(handle.name)
            handle.write(payload)
            handle.flush()
        try:
            os.replace(temporary, self.path(rollout_id, "state.json"))
        finally:
            temporary.unlink(missing_ok=True)

    def _index_tail(self, rollout_id: str, state: dict[str, Any]) -> None:
        """Index lines past `indexed_size` (a writer died between its line and its state)."""
        path = self.path(rollout_id, "jsonl")
        size = path.stat().st_size if path.exists() else 0
        indexed = int(state["indexed_size"])
        if indexed == size:
            return
        with path.open("rb") as handle:
            handle.seek(indexed)
            tail = handle.read()
        digests = state["entry_digests"]
        for line in tail.splitlines():
            payload = line.strip()
            if payload:
                entry = GymStyleEntry.model_validate(orjson.loads(payload))
                digests[entry.model_call_id] = hashlib.sha256(payload).hexdigest()
        state["indexed_size"] = size

    def _append(self, entry: GymStyleEntry) -> None:
        canonical = orjson.dumps(entry.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        digest = hashlib.sha256(canonical).hexdigest()
        rollout_id = entry.rollout_id
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            if state["retired"] or state["frozen"]:
                raise RuntimeError(f"capture {rollout_id} is closed")
            self._index_tail(rollout_id, state)
            known = state["entry_digests"].get(entry.model_call_id)
            if known is not None:
                if known != digest:
                    raise ValueError(f"{entry.model_call_id} was put with another payload")
                return
            with self.path(rollout_id, "jsonl").open("ab") as handle:
                handle.write(canonical + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
                state["indexed_size"] = handle.tell()
            state["entry_digests"][entry.model_call_id] = digest
            state["version"] = int(state["version"]) + 1
            self._write_state(rollout_id, state)

    def _begin(self, rollout_id: str, model_call_id: str) -> None:
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            if state["retired"] or state["frozen"]:
                raise RuntimeError(f"capture {rollout_id} is closed")
            with self.path(rollout_id, "intents").open("ab") as handle:
                handle.write(model_call_id.encode() + b"\n")
                handle.flush()
                os.fsync(handle.fileno())

    async def put(self, entry: GymStyleEntry) -> None:
        await asyncio.to_thread(self._append, entry)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        await asyncio.to_thread(self._begin, rollout_id, model_call_id)


@dataclass(frozen=True, slots=True)
class _Node:
    """What the index keeps of one committed call: no token ids, only where its line starts."""

    call_id: str
    cum_len: int
    digest: str
    offset: int
    context_len: int
    context_digest: str
    parent_call_id: str | None
    prompt_is_delta: bool


@dataclass
class _RolloutIndex:
    cursor: tuple[int, int] | None = None  # (inode, byte offset read through)
    nodes: dict[str, _Node] = field(default_factory=dict)
    by_fingerprint: dict[str, list[str]] = field(default_factory=dict)

    def add(self, entry: GymStyleEntry, offset: int) -> None:
        fingerprint = entry.continuation_fingerprint
        version = entry.fingerprint_version
        if not fingerprint or (version is not None and version != FINGERPRINT_VERSION):
            return
        node = _Node(
            entry.model_call_id,
            entry.cum_len if entry.cum_len is not None else 0,
            entry.digest or "",
            offset,
            entry.continuation_context_len,
            entry.continuation_context_digest,
            entry.parent_call_id,
            entry.prompt_is_delta,
        )
        known = self.nodes.get(node.call_id)
        if known is not None:
            if known != node:
                raise ValueError(f"{node.call_id} is indexed with two payloads")
            return
        self.nodes[node.call_id] = node
        self.by_fingerprint.setdefault(fingerprint, []).append(node.call_id)

    def choose(self, items: list[dict[str, Any]]) -> tuple[ParentStatus, _Node | None, str]:
        fingerprint = assistant_fingerprint(items)
        if not fingerprint:
            return ParentStatus.ROOT, None, ""
        candidates = []
        for call_id in dict.fromkeys(self.by_fingerprint.get(fingerprint, ())):
            node = self.nodes[call_id]
            if (
                node.context_digest
                and len(items) >= node.context_len
                and conversation_digest(items[: node.context_len]) == node.context_digest
            ):
                candidates.append(node)
        identities = {(node.digest, node.cum_len) for node in candidates}
        if len(candidates) > 1 and candidates[0].digest and len(identities) == 1:
            candidates = [min(candidates, key=lambda node: node.call_id)]
        if len(candidates) != 1:
            return ParentStatus.UNRESOLVED, None, "ambiguous" if candidates else "no_match"
        return ParentStatus.RESOLVED, candidates[0], ""


class GymStyleLineageStore:
    """0.7's file lineage store: an incremental, metadata-only index over the store's lines."""

    def __init__(self, store: GymStyleFileStore) -> None:
        self._store = store
        self._indexes: dict[str, _RolloutIndex] = {}
        self._rebuilt: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._rebuilt_tokens = 0
        self._guard = threading.Lock()
        self._stripes = tuple(threading.Lock() for _ in range(_LOCK_STRIPES))

    def _lines_since(self, rollout_id: str, index: _RolloutIndex) -> _RolloutIndex:
        path = self._store.path(rollout_id, "jsonl")
        if not path.exists():
            return _RolloutIndex()
        stat = path.stat()
        inode, offset = index.cursor or (stat.st_ino, 0)
        if inode != stat.st_ino or offset > stat.st_size:
            index, offset = _RolloutIndex(), 0  # the file was replaced: start over
        if offset == stat.st_size:
            return index
        with path.open("rb") as handle:
            handle.seek(offset)
            while line := handle.readline():
                if line.strip():
                    entry = GymStyleEntry.model_validate(orjson.loads(line.strip()))
                    index.add(entry, offset)
                offset = handle.tell()
        index.cursor = (stat.st_ino, offset)
        return index

    def _refreshed(self, rollout_id: str) -> _RolloutIndex:
        with self._guard:
            index = self._indexes.pop(rollout_id, None) or _RolloutIndex()
        index = self._lines_since(rollout_id, index)
        with self._guard:
            self._indexes[rollout_id] = index  # most recently used last
            while len(self._indexes) > _CACHED_ROLLOUTS:
                oldest = next(iter(self._indexes))
                self._indexes.pop(oldest)
                self._forget(oldest)
        return index

    def _forget(self, rollout_id: str) -> None:
        rebuilt = self._rebuilt.pop(rollout_id, None)
        if rebuilt is not None:
            self._rebuilt_tokens -= len(rebuilt[1])

    def _remember(self, rollout_id: str, call_id: str, tokens: tuple[int, ...]) -> None:
        with self._guard:
            self._forget(rollout_id)
            if len(tokens) > _CACHED_TOKENS:
                return
            self._rebuilt[rollout_id] = (call_id, tokens)
            self._rebuilt_tokens += len(tokens)
            while self._rebuilt_tokens > _CACHED_TOKENS:
                self._forget(next(iter(self._rebuilt)))

    def _rebuild(self, rollout_id: str, node: _Node, index: _RolloutIndex) -> tuple[int, ...]:
        """The node's cumulative ids: its delta chain read back to a cached call or an anchor."""
        with self._guard:
            cached = self._rebuilt.get(rollout_id)
        chain: list[_Node] = []
        seen: set[str] = set()
        start: tuple[int, ...] = ()
        current: _Node | None = node
        while current is not None:
            if cached is not None and current.call_id == cached[0]:
                start = cached[1]
                break
            if len(chain) >= _MAX_CHAIN or current.call_id in seen:
                raise ValueError(f"the delta chain of {node.call_id} cannot be rebuilt")
            seen.add(current.call_id)
            chain.append(current)
            if not current.prompt_is_delta:
                break
            current = index.nodes.get(current.parent_call_id or "")
            if current is None:
                raise ValueError(f"a delta parent of {node.call_id} is not indexed")
        tokens = list(start)
        with self._store.path(rollout_id, "jsonl").open("rb") as handle:
            for link in reversed(chain):
                handle.seek(link.offset)
                entry = GymStyleEntry.model_validate(orjson.loads(handle.readline()))
                if entry.model_call_id != link.call_id:
                    raise ValueError(f"the line of {link.call_id} holds {entry.model_call_id}")
                tokens.extend(entry.prompt_token_ids)
                tokens.extend(entry.generation_token_ids)
        if node.digest and _token_digest(tokens) != node.digest:
            raise ValueError(f"the rebuilt ids of {node.call_id} fail their digest")
        rebuilt = tuple(tokens)
        self._remember(rollout_id, node.call_id, rebuilt)
        return rebuilt

    def _ledger_has_match(self, rollout_id: str, items: list[dict[str, Any]]) -> bool:
        """0.7's second chance for an unresolved request: a ledger file beside the lines."""
        if not assistant_fingerprint(items):
            return False
        with self._store.locked(rollout_id):
            return self._store.root.joinpath(f"{rollout_id}.lineage.jsonl").exists()

    def _resolve(self, rollout_id: str, items: list[dict[str, Any]]) -> Resolution:
        stripe = self._stripes[hash(rollout_id) % _LOCK_STRIPES]
        with stripe, self._store.locked(rollout_id, shared=True):
            index = self._refreshed(rollout_id)
            status, node, reason = index.choose(items)
            if node is None:
                resolution = Resolution(status, None, reason)
            else:
                tokens = self._rebuild(rollout_id, node, index)
                resolution = Resolution(status, Match(node.call_id, tokens, node.digest))
        if status == ParentStatus.UNRESOLVED and self._ledger_has_match(rollout_id, items):
            raise NotImplementedError("ledger rows belong to external staging, not reproduced")
        return resolution

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> Resolution:
        return await asyncio.to_thread(self._resolve, rollout_id, request_items)
