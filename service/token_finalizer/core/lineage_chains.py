"""Materialized cumulative token ids of committed calls, cached under a token budget.

A resolved request is answered with its parent's whole cumulative sequence.
For a delta-encoded rollout that sequence is the delta chain down to a
full-prompt anchor; rebuilding it from the anchor on every call would cost
O(calls x context) per rollout. Instead, the chain of the call last answered
is kept (an LRU over every rollout of a store, bounded in tokens), and the
next answer, which usually continues it, appends only its own delta. Calls
that extend each other share one growing buffer, so a rollout's cached
chains cost about its longest context. See docs/store-protocol.md#lineage-index.

The walk over links follows resolution's rules exactly
(docs/records-and-builds.md#lineage-resolution): a missing parent, a cycle,
or more than MAX_DELTA_DEPTH delta entries between a call and its anchor make
the chain unreconstructable, whichever part of it was cached.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from token_finalizer.core.lineage_fields import CallView
from token_finalizer.core.lineage_index import CallLink, LineageView
from token_finalizer.core.lineage_resolution import MAX_DELTA_DEPTH
from token_finalizer.core.token_ids import WIDE, join_ids

__all__ = [
    "BrokenChain",
    "Chain",
    "ChainCache",
    "ChainSource",
    "ScopedChains",
    "cumulative_length",
    "materialize",
    "remember_committed",
]

Ids = npt.NDArray[np.integer[Any]]

_MIN_CAPACITY = 1024
_NO_IDS: Ids = np.empty(0, dtype=WIDE)


class BrokenChain(ValueError):
    """A delta chain that cannot be rebuilt: a missing parent, a cycle, too many steps."""


class _Buffer:
    """A growing uint64 buffer; chains that extend each other are prefixes of one buffer.

    uint64 holds every valid id exactly, whatever the dtype of the pieces
    written into it (docs/records-and-builds.md#token-ids).
    """

    __slots__ = ("ids", "length", "lock")

    def __init__(self, first: Ids, capacity: int) -> None:
        self.ids = np.empty(max(_MIN_CAPACITY, capacity), dtype=WIDE)
        self.ids[: len(first)] = first
        self.length = len(first)
        self.lock = threading.Lock()

    def extend(self, at: int, pieces: tuple[Ids, ...]) -> Ids | None:
        """Append `pieces` if the buffer still ends at `at`; the new prefix view, else None."""
        with self.lock:
            if self.length != at:
                return None  # another call already continued this buffer: branch off
            end = at + sum(len(piece) for piece in pieces)
            if end > len(self.ids):
                grown = np.empty(max(end, 2 * len(self.ids)), dtype=WIDE)
                grown[:at] = self.ids[:at]
                self.ids = grown  # views handed out earlier keep the old buffer alive
            cursor = at
            for piece in pieces:
                self.ids[cursor : cursor + len(piece)] = piece
                cursor += len(piece)
            self.length = end
            return _read_only(self.ids[:end])


def _read_only(ids: Ids) -> Ids:
    ids.flags.writeable = False
    return ids


@dataclass(frozen=True, slots=True)
class Chain:
    """One call's cumulative ids, with the number of delta entries down to its anchor.

    `verified`: the ids were checked against the call's own digest and cum_len.
    """

    tokens: Ids
    depth: int
    verified: bool = False
    buffer: _Buffer | None = None

    @classmethod
    def anchored(cls, call: CallView) -> Chain:
        """The chain of a full-prompt call: its prompt and generation."""
        pieces = [np.asarray(p) for p in (call.prompt_token_ids, call.generation_token_ids)]
        # join_ids leaves empty pieces out and never mixes int32 with uint64
        # (numpy would make floats of them).
        return cls(_read_only(join_ids(pieces)), depth=0)

    def checked(self) -> Chain:
        """This chain, marked as checked against its call's digest and cum_len."""
        return Chain(self.tokens, self.depth, verified=True, buffer=self.buffer)

    def extended(self, call: CallView) -> Chain:
        """The chain of a delta call whose parent's chain is this one."""
        if self.depth >= MAX_DELTA_DEPTH:
            raise BrokenChain(f"delta chain of {call.model_call_id} exceeds {MAX_DELTA_DEPTH}")
        pieces = (np.asarray(call.prompt_token_ids), np.asarray(call.generation_token_ids))
        tokens = None
        if self.buffer is not None:
            tokens = self.buffer.extend(len(self.tokens), pieces)
        buffer = self.buffer
        if tokens is None:
            size = len(self.tokens) + sum(len(piece) for piece in pieces)
            buffer = _Buffer(self.tokens, 2 * size)
            tokens = buffer.extend(len(self.tokens), pieces)
            assert tokens is not None  # a fresh buffer ends where it was filled
        return Chain(tokens, self.depth + 1, buffer=buffer)


class ChainSource(Protocol):
    """Where resolution finds and keeps the chains of one rollout."""

    def cached(self, call_id: str) -> Chain | None:
        """The call's chain if it is at hand."""
        ...

    def keep(self, call_id: str, chain: Chain) -> None:
        """Remember the call's chain for later answers."""
        ...


def _storage(tokens: Ids) -> Ids:
    """The array whose memory `tokens` occupies: a view's base, else the array itself."""
    base = tokens.base
    return base if isinstance(base, np.ndarray) else tokens


class ChainCache:
    """An LRU of chains over many rollouts, bounded by the tokens their arrays hold.

    Keys are (scope, call id); a scope names one rollout's index (a recreated
    capture gets a new one). Chains that extend each other are views of one
    buffer, so the budget counts each array they occupy once, whole, however
    many cached chains view it: a rollout's delta chains cost about its
    longest context, not the sum of its calls' contexts. Thread-safe: file
    stores resolve in worker threads.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0
        self._chains: OrderedDict[tuple[Hashable, str], Chain] = OrderedDict()
        self._by_scope: dict[Hashable, OrderedDict[str, None]] = {}
        # id of an occupied array -> how many cached chains view it (held alive by them).
        self._viewers: dict[int, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._chains)

    def get(self, scope: Hashable, call_id: str) -> Chain | None:
        """The cached chain, now the most recently used; None on a miss."""
        with self._lock:
            chain = self._chains.get((scope, call_id))
            if chain is not None:
                self._chains.move_to_end((scope, call_id))
                self._by_scope[scope].move_to_end(call_id)
            return chain

    def put(self, scope: Hashable, call_id: str, chain: Chain) -> None:
        """Keep `chain`, evicting the least recently used beyond the budget."""
        size = len(chain.tokens)
        if size > self.max_tokens:
            return
        with self._lock:
            self._drop((scope, call_id))
            self._chains[(scope, call_id)] = chain
            self._by_scope.setdefault(scope, OrderedDict())[call_id] = None
            self._occupy(chain)
            while self.tokens > self.max_tokens:
                self._drop(next(iter(self._chains)))

    def recent(self, scope: Hashable, limit: int) -> dict[str, Chain]:
        """Up to `limit` chains of `scope`, the most recently used first."""
        with self._lock:
            ids = self._by_scope.get(scope)
            picked = [] if ids is None else _last_keys(ids, limit)
            return {call_id: self._chains[(scope, call_id)] for call_id in picked}

    def forget(self, scope: Hashable) -> None:
        """Drop every chain of `scope` (its capture was retired or deleted)."""
        with self._lock:
            for call_id in list(self._by_scope.get(scope, ())):
                self._drop((scope, call_id))

    def _occupy(self, chain: Chain) -> None:
        storage = _storage(chain.tokens)
        viewers = self._viewers.get(id(storage), 0)
        if viewers == 0:
            self.tokens += len(storage)
        self._viewers[id(storage)] = viewers + 1

    def _release(self, chain: Chain) -> None:
        storage = _storage(chain.tokens)
        viewers = self._viewers.pop(id(storage)) - 1
        if viewers:
            self._viewers[id(storage)] = viewers
        else:
            self.tokens -= len(storage)

    def _drop(self, key: tuple[Hashable, str]) -> None:
        chain = self._chains.pop(key, None)
        if chain is None:
            return
        self._release(chain)
        scope, call_id = key
        ids = self._by_scope[scope]
        del ids[call_id]
        if not ids:
            del self._by_scope[scope]


def _last_keys(ids: OrderedDict[str, None], limit: int) -> list[str]:
    """The last `limit` keys of an ordered mapping, last first."""
    picked: list[str] = []
    for call_id in reversed(ids):
        if len(picked) == limit:
            break
        picked.append(call_id)
    return picked


class ScopedChains:
    """A ChainSource over one scope of a ChainCache, with chains pinned for one resolve.

    `pinned` holds chains the caller already looked up (the redis store told its
    script to stop at them): they stay at hand even if the cache evicts them.
    """

    __slots__ = ("_cache", "_pinned", "_scope")

    def __init__(
        self, cache: ChainCache, scope: Hashable, pinned: Mapping[str, Chain] | None = None
    ) -> None:
        self._cache = cache
        self._scope = scope
        self._pinned = dict(pinned or {})

    def cached(self, call_id: str) -> Chain | None:
        """The chain if pinned or cached."""
        chain = self._pinned.get(call_id)
        return chain if chain is not None else self._cache.get(self._scope, call_id)

    def keep(self, call_id: str, chain: Chain) -> None:
        """Cache the chain (and pin it for the rest of this resolve)."""
        self._pinned[call_id] = chain
        self._cache.put(self._scope, call_id, chain)


def _walk(link: CallLink, view: LineageView, chains: ChainSource) -> tuple[list[CallLink], Any]:
    """Delta links from `link` up to a cached chain or a full-prompt anchor (excluded).

    Returns the deltas (nearest first) and what ends the walk: the cached
    Chain or the anchor's CallLink. Raises BrokenChain as resolution would.
    """
    deltas: list[CallLink] = []
    visited: set[str] = set()
    current_id: str = link.call_id
    current: CallLink | None = link
    while True:
        # A cached chain first: a call with a chain was committed in this scope.
        cached = chains.cached(current_id)
        if cached is not None:
            if len(deltas) + cached.depth > MAX_DELTA_DEPTH:
                raise BrokenChain(f"delta chain of {link.call_id} exceeds {MAX_DELTA_DEPTH}")
            return deltas, cached
        if current is None:
            raise BrokenChain(f"delta entry {deltas[-1].call_id} has no parent {current_id!r}")
        if not current.prompt_is_delta:
            return deltas, current
        if current_id in visited:
            raise BrokenChain(f"delta chain of {link.call_id} has a cycle")
        if len(deltas) == MAX_DELTA_DEPTH:
            raise BrokenChain(f"delta chain of {link.call_id} exceeds {MAX_DELTA_DEPTH}")
        visited.add(current_id)
        deltas.append(current)
        if not current.parent_call_id:
            raise BrokenChain(f"delta entry {current_id} names no parent")
        current_id = current.parent_call_id
        current = view.link(current_id)


def cumulative_length(link: CallLink, view: LineageView, chains: ChainSource) -> int:
    """The length of the call's cumulative sequence, from links alone (cum_len first)."""
    if link.cum_len is not None:
        return int(link.cum_len)
    if not link.prompt_is_delta:
        return link.own_length
    deltas, end = _walk(link, view, chains)
    base = len(end.tokens) if isinstance(end, Chain) else end.own_length
    return base + sum(delta.own_length for delta in deltas)


def _read(view: LineageView, call_id: str) -> CallView:
    call = view.call(call_id)
    if call is None:
        raise BrokenChain(f"committed call {call_id} cannot be read back")
    return call


def materialize(link: CallLink, view: LineageView, chains: ChainSource) -> Chain:
    """The call's chain: cached, or rebuilt from the nearest cached ancestor or anchor."""
    deltas, end = _walk(link, view, chains)
    chain = end if isinstance(end, Chain) else Chain.anchored(_read(view, end.call_id))
    for delta in reversed(deltas):
        chain = chain.extended(_read(view, delta.call_id))
    return chain


def remember_committed(call: CallView, link: CallLink, chains: ChainSource) -> None:
    """Cache a just-committed call's chain when it costs no read: a full prompt, or a
    delta whose parent's chain is at hand. Its next resolve then reads nothing."""
    if not link.prompt_is_delta:
        chains.keep(link.call_id, Chain.anchored(call))
        return
    parent = chains.cached(link.parent_call_id) if link.parent_call_id else None
    if parent is not None and parent.depth < MAX_DELTA_DEPTH:
        chains.keep(link.call_id, parent.extended(call))
