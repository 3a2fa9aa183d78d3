"""Each rollout's last resolved ids, kept so that the next resolve names them.

A model server resolves a rollout's calls in turn, and each call's parent
usually extends the previous one's: call k+1's answer repeats call k's whole
context before its few hundred new ids. The resolver keeps the last match of
every rollout here and sends its digest and length with the next resolve;
a store that finds them to be a prefix of the new match (it hashes that
prefix of the match's ids) answers only the ids after it
(docs/store-protocol.md#known-prefix). So an answer grows with the turn,
not with the context.

Kept under a budget of ids over all rollouts, least recently resolved
dropped first; a match larger than the budget is not kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from token_finalizer_client._constants import RESOLVER_KNOWN_IDS_BUDGET
from token_finalizer_client._fingerprint import HEX_DIGEST

__all__ = ["KnownIds", "KnownIdsCache"]


@dataclass(frozen=True, slots=True)
class KnownIds:
    """One rollout's last resolved ids and the token digest that names them."""

    digest: str
    ids: tuple[int, ...]

    def to_wire(self) -> dict[str, Any]:
        """The resolve request's `known` object."""
        return {"digest": self.digest, "length": len(self.ids)}


class KnownIdsCache:
    """The last match's ids of each rollout, at most `budget` ids in all (LRU)."""

    def __init__(self, budget: int = RESOLVER_KNOWN_IDS_BUDGET) -> None:
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        self.budget = budget
        self.size = 0
        self._by_rollout: OrderedDict[str, KnownIds] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_rollout)

    def get(self, rollout_id: str) -> KnownIds | None:
        """The rollout's kept ids (now the most recently used), or None."""
        known = self._by_rollout.get(rollout_id)
        if known is not None:
            self._by_rollout.move_to_end(rollout_id)
        return known

    def keep(self, rollout_id: str, digest: str, ids: tuple[int, ...]) -> None:
        """Keep `ids` as the rollout's last match, in place of any earlier one.

        Nothing is kept for empty ids, a digest a store would refuse to
        compare (not 64 lowercase hex digits), or more ids than the budget.
        """
        self.forget(rollout_id)
        if not ids or len(ids) > self.budget or not HEX_DIGEST.fullmatch(digest):
            return
        self._by_rollout[rollout_id] = KnownIds(digest, ids)
        self.size += len(ids)
        while self.size > self.budget:
            _, dropped = self._by_rollout.popitem(last=False)
            self.size -= len(dropped.ids)

    def forget(self, rollout_id: str) -> None:
        """Drop the rollout's kept ids, if any."""
        known = self._by_rollout.pop(rollout_id, None)
        if known is not None:
            self.size -= len(known.ids)
