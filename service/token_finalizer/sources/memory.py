"""An in-process capture store, for tests and for embedding in one process."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.errors import CaptureConflict
from token_finalizer.core.identity import check_store_id
from token_finalizer.sources._entries import entry_payload, same_payload
from token_finalizer.sources._state import CaptureState, PutDecision, line_digest

__all__ = ["MemoryTokenStore"]


@dataclass(slots=True)
class _Rollout:
    state: CaptureState = field(default_factory=CaptureState)
    entries: dict[str, TokenEntry] = field(default_factory=dict)
    lines: dict[str, bytes] = field(default_factory=dict)
    intents: set[str] = field(default_factory=set)
    failed_calls: list[str] = field(default_factory=list)


class MemoryTokenStore:
    """TokenSource and TokenSink over a dict, with the file store's semantics."""

    def __init__(self) -> None:
        self._rollouts: dict[str, _Rollout] = {}
        # A plain lock: every method is short and never awaits while holding it.
        self._lock = threading.Lock()

    def _rollout(self, rollout_id: str) -> _Rollout:
        return self._rollouts.setdefault(check_store_id(rollout_id), _Rollout())

    async def put(self, entry: TokenEntry | Mapping[str, Any]) -> None:
        parsed, line = entry_payload(entry)
        digest = line_digest(line)
        with self._lock:
            rollout = self._rollout(parsed.rollout_id)
            rollout.state.check_writable(parsed.rollout_id)
            decision = rollout.state.decide_put(parsed.model_call_id, digest)
            stored = rollout.lines.get(parsed.model_call_id)
            if (
                decision is PutDecision.CONFLICT
                and stored is not None
                and same_payload(stored, line)
            ):
                return  # the same payload, serialized by another encoder
            if decision is PutDecision.SAME:
                return
            if decision is PutDecision.CONFLICT:
                rollout.state.mark_incomplete(parsed.rollout_id)
                rollout.failed_calls.append(parsed.model_call_id)
                raise CaptureConflict(
                    f"model call {parsed.model_call_id} of rollout {parsed.rollout_id} "
                    "was already stored with a different payload"
                )
            rollout.entries[parsed.model_call_id] = parsed
            rollout.lines[parsed.model_call_id] = line
            rollout.state.record_put(parsed.model_call_id, digest)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        if model_call_id:
            check_store_id(model_call_id, what="model_call_id")
        with self._lock:
            rollout = self._rollout(rollout_id)
            rollout.state.mark_incomplete(rollout_id)
            if model_call_id:
                rollout.failed_calls.append(model_call_id)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        check_store_id(model_call_id, what="model_call_id")
        with self._lock:
            rollout = self._rollout(rollout_id)
            rollout.state.check_writable(rollout_id)
            rollout.intents.add(model_call_id)

    async def freeze(self, rollout_id: str) -> Snapshot:
        with self._lock:
            rollout = self._rollout(rollout_id)
            rollout.state.freeze(rollout_id)
            state = rollout.state
            missing = rollout.intents - rollout.entries.keys()
            return Snapshot(
                rollout_id=rollout_id,
                entries=tuple(rollout.entries.values()),
                incomplete=state.incomplete or bool(missing),
                snapshot_id=str(state.snapshot_id),
                version=state.version,
            )

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        check_store_id(rollout_id)
        with self._lock:
            rollout = self._rollouts.get(rollout_id)
            if rollout is None or not rollout.state.names(snapshot_id, version):
                return False
            if not rollout.state.retired:
                rollout.state.retired = True
                rollout.entries.clear()
                rollout.intents.clear()
                rollout.failed_calls.clear()
            return True

    async def committed_entries(self, rollout_id: str) -> tuple[TokenEntry, ...]:
        """The rollout's stored entries in put order, read without freezing (lineage resolution).

        A retired or unknown rollout has none; nothing is created or changed.
        """
        check_store_id(rollout_id)
        with self._lock:
            rollout = self._rollouts.get(rollout_id)
            if rollout is None or rollout.state.retired:
                return ()
            return tuple(rollout.entries.values())

    def status(self, rollout_id: str) -> dict[str, Any] | None:
        """The stored state of one rollout, or None when nothing is stored."""
        with self._lock:
            rollout = self._rollouts.get(check_store_id(rollout_id))
            return None if rollout is None else rollout.state.to_dict()

    async def ping(self) -> None:
        """Always reachable."""

    async def close(self) -> None:
        """Nothing to release."""
