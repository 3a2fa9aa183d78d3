"""The known prefix of a resolve: how many of the match's ids the client already holds.

docs/store-protocol.md#known-prefix. A prefix counts once its token digest is
the one the client named. Hashing it costs about as much as the rest of a
resolve (some 0.3 ms for 25,000 ids), so the store server remembers the ids
it answered under each digest. A rollout's delta calls grow one append-only
buffer (core/lineage_chains.py): when the new match's ids start at the very
memory of ids answered earlier under that digest, those are the known ids,
and nothing is hashed. Anything else (another buffer, ids since evicted from
the chain cache, a first resolve) is hashed as before.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
import numpy.typing as npt

from token_finalizer._constants import STORE_ANSWERED_IDS
from token_finalizer.core.token_digest import token_digest
from token_finalizer.store_server._requests import KnownPrefix

__all__ = ["AnsweredIds"]

Ids = npt.NDArray[np.integer[Any]]


def _starts_at_same_memory(held: Ids, ids: Ids) -> bool:
    """Whether `held` is a leading view of the same buffer `ids` views (never rewritten)."""
    return (
        held.base is not None
        and held.base is ids.base
        and held.dtype == ids.dtype
        and held.ctypes.data == ids.ctypes.data
        and len(held) <= len(ids)
    )


class AnsweredIds:
    """The ids last answered per (rollout, digest), held weakly, at most `capacity` (LRU)."""

    def __init__(self, capacity: int = STORE_ANSWERED_IDS) -> None:
        self.capacity = capacity
        self._held: OrderedDict[tuple[str, str], weakref.ref[Ids]] = OrderedDict()
        self._lock = threading.Lock()  # large answers are built in worker threads

    def remember(self, rollout_id: str, digest: str, ids: Ids) -> None:
        """`ids` (checked against `digest` by the resolution) were answered for `rollout_id`."""
        if not digest:
            return
        with self._lock:
            self._held[(rollout_id, digest)] = weakref.ref(ids)
            self._held.move_to_end((rollout_id, digest))
            while len(self._held) > self.capacity:
                self._held.popitem(last=False)

    def _held_ids(self, rollout_id: str, digest: str) -> Ids | None:
        with self._lock:
            ref = self._held.get((rollout_id, digest))
        return None if ref is None else ref()

    def known_length(self, rollout_id: str, ids: Ids, known: KnownPrefix | None) -> int | None:
        """How many leading `ids` the client holds: `known.length` once checked, else None."""
        if known is None or known.length > len(ids):
            return None
        held = self._held_ids(rollout_id, known.digest)
        if held is not None and len(held) == known.length and _starts_at_same_memory(held, ids):
            return known.length
        return known.length if token_digest(ids[: known.length]) == known.digest else None
