"""A growing token sequence that calls extending each other share.

A delta-encoded rollout stores each call's prompt as the suffix after its
parent. Rebuilding every full prompt as its own array would cost
O(calls x context) memory; instead, a run of calls that extend each other
appends to one buffer, and each call's full sequence is a view of its
prefix. Digests of those views are hashed from one big-endian conversion of
the buffer (core/digest_batch.py). See docs/records-and-builds.md#l2-delta-materialization.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from token_finalizer.core.token_digest import InvalidTokenIds
from token_finalizer.core.token_ids import NARROW, WIDE, out_of_range_message

__all__ = ["Tape"]

_MIN_CAPACITY = 1024

Ids = npt.NDArray[np.integer[Any]]


class Tape:
    """An append-only token buffer; `view(n)` is the first n tokens, zero copy.

    The buffer follows the core's dtype rule (core/token_ids.py): int32 until
    an id needs uint64, then uint64 from there on.
    """

    __slots__ = ("_ids", "length")

    def __init__(self, first: Ids) -> None:
        self._ids: Ids = np.empty(max(_MIN_CAPACITY, 2 * len(first)), dtype=NARROW)
        self.length = 0
        self.append(first)

    def append(self, ids: Ids) -> None:
        """Add `ids` (non-negative) at the end, growing geometrically.

        Views handed out before a growth keep the old buffer alive and stay
        valid: the tokens they show never change.
        """
        end = self.length + len(ids)
        dtype = self._ids.dtype
        if len(ids) and ids.dtype != NARROW:
            # Anything but int32 goes into uint64, which holds every valid id exactly.
            if ids.dtype.kind == "i" and int(ids.min()) < 0:
                raise InvalidTokenIds(out_of_range_message(int(ids.min())))
            dtype = WIDE
        if end > len(self._ids) or dtype != self._ids.dtype:
            grown = np.empty(max(end, 2 * len(self._ids)), dtype=dtype)
            grown[: self.length] = self._ids[: self.length]
            self._ids = grown
        self._ids[self.length : end] = ids
        self.length = end

    def view(self, length: int) -> Ids:
        """The first `length` tokens (a read-only view)."""
        out = self._ids[:length]
        out.flags.writeable = False
        return out
