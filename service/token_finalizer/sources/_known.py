"""What a store knows of the rollouts it writes: their calls' cumulative ids.

Packing a put as a reference to its parent's ids (sources/_packed.py) needs
those ids; rereading the capture for them would make every put O(capture).
So each store keeps, for the rollouts it wrote recently, the ids of the
calls it stored itself, tied to an identity of the capture (the file store:
the jsonl's device and inode) and to each call's line digest: a capture
replaced, or a parent whose stored digest is not the one this process wrote,
starts afresh (the put is then packed without a reference; the redis put
script checks the parent's digest itself). Other processes' calls are not
known: their children are stored without a reference, which is still exact.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.token_ids import Ids
from token_finalizer.sources._packed import RolloutIds

__all__ = ["KnownIds"]

_Identity = tuple[int, int] | None


class _Known:
    """One rollout's ids and the digests of the calls they were learnt from."""

    __slots__ = ("digests", "identity", "ids")

    def __init__(self, identity: _Identity) -> None:
        self.identity = identity
        self.ids = RolloutIds()
        self.digests: dict[str, str] = {}

    def stored(self, identity: _Identity, call_id: str, digest: str) -> None:
        """The call's line is in the jsonl `identity` now."""
        self.identity = identity
        self.digests[call_id] = digest


class KnownIds:
    """Per rollout, the ids this store wrote; the least recently written dropped first."""

    def __init__(self, max_rollouts: int) -> None:
        self.max_rollouts = max_rollouts
        self._rollouts: OrderedDict[str, _Known] = OrderedDict()
        self._lock = threading.Lock()

    def ids_of(self, rollout_id: str, call_id: str) -> Ids | None:
        """The cumulative ids this store wrote for a call, or None."""
        with self._lock:
            known = self._rollouts.get(rollout_id)
            if known is None or call_id not in known.digests:
                return None
            return known.ids.get(call_id)

    def forget(self, rollout_id: str) -> None:
        """Drop what is known of a rollout (removed, or a put that did not land)."""
        with self._lock:
            self._rollouts.pop(rollout_id, None)

    def for_put(
        self,
        rollout_id: str,
        identity: _Identity,
        stored_digests: Mapping[str, str] | None,
        entry: TokenEntry,
    ) -> _Known:
        """What is known of the rollout, checked against the capture's identity and (when
        given) the digests it holds."""
        with self._lock:
            known = self._rollouts.get(rollout_id)
            parent = entry.parent_call_id
            if (
                known is None
                or known.identity != identity
                or (
                    stored_digests is not None
                    and parent is not None
                    and parent in known.digests
                    and stored_digests.get(parent) != known.digests[parent]
                )
            ):
                known = self._rollouts[rollout_id] = _Known(identity)
            self._rollouts.move_to_end(rollout_id)
            while len(self._rollouts) > self.max_rollouts:
                self._rollouts.popitem(last=False)
            return known
