"""What a file store knows of the rollouts it writes: their calls' cumulative ids.

Packing a put as a reference to its parent's ids (sources/_packed.py) needs
those ids; rereading the jsonl for them would make every put O(capture). So
each store keeps, for the rollouts it wrote recently, the ids of the calls
it stored itself, tied to the jsonl's identity and to each call's line
digest: a jsonl replaced, or a parent whose stored digest is not the one
this process wrote, starts afresh (the put is then packed without a
reference). Other processes' calls are not known: their children are stored
without a reference, which is still exact.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

from token_finalizer.core.entries import TokenEntry
from token_finalizer.sources._packed import RolloutIds
from token_finalizer.sources._state import CaptureState

__all__ = ["KnownIds"]

_Identity = tuple[int, int]


class _Known:
    __slots__ = ("digests", "identity", "ids")

    def __init__(self, identity: _Identity | None) -> None:
        self.identity = identity
        self.ids = RolloutIds()
        self.digests: dict[str, str] = {}

    def stored(self, identity: _Identity, call_id: str, digest: str) -> None:
        """The call's line is in the jsonl `identity` now."""
        self.identity = identity
        self.digests[call_id] = digest


def _identity(path: Path) -> _Identity | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


class KnownIds:
    """Per rollout, the ids this store wrote; the least recently written dropped first."""

    def __init__(self, max_rollouts: int) -> None:
        self.max_rollouts = max_rollouts
        self._rollouts: OrderedDict[str, _Known] = OrderedDict()
        self._lock = threading.Lock()

    def forget(self, rollout_id: str) -> None:
        """Drop what is known of a rollout (removed, or a put that did not land)."""
        with self._lock:
            self._rollouts.pop(rollout_id, None)

    def for_put(
        self, rollout_id: str, jsonl: Path, state: CaptureState, entry: TokenEntry
    ) -> _Known:
        """What is known of the rollout, checked against its jsonl (under its lock)."""
        identity = _identity(jsonl)
        with self._lock:
            known = self._rollouts.get(rollout_id)
            parent = entry.parent_call_id
            if (
                known is None
                or known.identity != identity
                or (
                    parent is not None
                    and parent in known.digests
                    and state.entry_digests.get(parent) != known.digests[parent]
                )
            ):
                known = self._rollouts[rollout_id] = _Known(identity)
            self._rollouts.move_to_end(rollout_id)
            while len(self._rollouts) > self.max_rollouts:
                self._rollouts.popitem(last=False)
            return known
