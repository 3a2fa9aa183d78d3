"""The cumulative ids of the calls a sink put itself, to send the next prompt as a delta.

A full-prompt writer repeats the whole context in every call's prompt. When a
call's parent is one this sink put, the prompt starts with the parent's
cumulative ids (prompt + generation), which the store already holds: the sink
sends the parent's id, the prefix length and its token digest, and the suffix
(docs/store-protocol.md#delta-put). Kept under a budget of ids over all
rollouts, least recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict

from token_finalizer_client._constants import SINK_SENT_IDS_BUDGET

__all__ = ["SentIds"]


class SentIds:
    """(rollout id, call id) -> the call's cumulative ids, at most `budget` ids (LRU)."""

    def __init__(self, budget: int = SINK_SENT_IDS_BUDGET) -> None:
        self.budget = budget
        self.size = 0
        self._calls: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()

    def get(self, rollout_id: str, call_id: str) -> tuple[int, ...] | None:
        """The call's ids (now the most recently used), or None."""
        ids = self._calls.get((rollout_id, call_id))
        if ids is not None:
            self._calls.move_to_end((rollout_id, call_id))
        return ids

    def keep(self, rollout_id: str, call_id: str, ids: tuple[int, ...]) -> None:
        """Keep a call's ids (nothing when empty or over the budget)."""
        self.forget(rollout_id, call_id)
        if not ids or len(ids) > self.budget:
            return
        self._calls[(rollout_id, call_id)] = ids
        self.size += len(ids)
        while self.size > self.budget:
            _, dropped = self._calls.popitem(last=False)
            self.size -= len(dropped)

    def forget(self, rollout_id: str, call_id: str) -> None:
        ids = self._calls.pop((rollout_id, call_id), None)
        if ids is not None:
            self.size -= len(ids)
