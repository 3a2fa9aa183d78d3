"""The capture state machine every local store shares.

    open ──put/mark_incomplete──▶ open ──freeze──▶ frozen ──drop(matching)──▶ retired

A put is idempotent for the same payload and refused for a different one;
every mutation bumps `version`, and the first freeze mints the `snapshot_id`,
so `(snapshot_id, version)` names exactly one immutable snapshot.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from token_finalizer.core.errors import CaptureFrozen, CaptureRetired

__all__ = ["CaptureState", "PutDecision", "line_digest"]


class PutDecision(Enum):
    NEW = "new"
    SAME = "same"
    CONFLICT = "conflict"


def line_digest(line: bytes) -> str:
    """sha256 hex of one stored entry line, newline excluded."""
    return hashlib.sha256(line).hexdigest()


@dataclass(slots=True)
class CaptureState:
    """Mirror of `R.tokens.state.json` (unknown keys are kept on rewrite)."""

    frozen: bool = False
    retired: bool = False
    incomplete: bool = False
    snapshot_id: str | None = None
    version: int = 0
    entry_digests: dict[str, str] = field(default_factory=dict)
    indexed_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = (
        "frozen",
        "retired",
        "incomplete",
        "snapshot_id",
        "version",
        "entry_digests",
        "indexed_size",
    )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaptureState:
        return cls(
            frozen=bool(data.get("frozen", False)),
            retired=bool(data.get("retired", False)),
            incomplete=bool(data.get("incomplete", False)),
            snapshot_id=data.get("snapshot_id"),
            version=int(data.get("version", 0)),
            entry_digests=dict(data.get("entry_digests") or {}),
            indexed_size=int(data.get("indexed_size", 0)),
            extra={k: v for k, v in data.items() if k not in cls._KEYS},
        )

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.extra)
        data.update({key: getattr(self, key) for key in self._KEYS})
        return data

    def check_writable(self, rollout_id: str) -> None:
        if self.retired:
            raise CaptureRetired(f"rollout {rollout_id} was retired; its capture is closed")
        if self.frozen:
            raise CaptureFrozen(f"rollout {rollout_id} is frozen; no call may be added")

    def decide_put(self, model_call_id: str, digest: str) -> PutDecision:
        existing = self.entry_digests.get(model_call_id)
        if existing is None:
            return PutDecision.NEW
        return PutDecision.SAME if existing == digest else PutDecision.CONFLICT

    def record_put(self, model_call_id: str, digest: str) -> None:
        self.entry_digests[model_call_id] = digest
        self.version += 1

    def mark_incomplete(self, rollout_id: str) -> None:
        if self.retired:
            raise CaptureRetired(f"rollout {rollout_id} was retired; its capture is closed")
        self.incomplete = True
        self.version += 1

    def freeze(self, rollout_id: str) -> bool:
        """Freeze once; True when this call changed the state."""
        if self.retired:
            raise CaptureRetired(f"rollout {rollout_id} was retired; it cannot be frozen again")
        if self.frozen:
            return False
        self.frozen = True
        self.snapshot_id = uuid.uuid4().hex
        self.version += 1
        return True

    def names(self, snapshot_id: str, version: int) -> bool:
        """Whether the stored state is still exactly that frozen snapshot."""
        return self.frozen and self.snapshot_id == snapshot_id and self.version == version
