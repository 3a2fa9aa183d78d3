"""Token-capture finalizer: freeze, rebuild and retire the exact tokens of RL agent rollouts."""

from __future__ import annotations

from token_finalizer.core.build import Build, BuildKind, SnapshotRef
from token_finalizer.core.delivery import (
    MASK_SAMPLE_KEY,
    TOKEN_CAPTURE_KEY,
    capture_build_can_retire,
    finalize_record,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
    rollout_carries_token_ids,
)
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.errors import (
    CaptureConflict,
    CaptureCorrupt,
    CaptureError,
    CaptureFrozen,
    CaptureRetired,
    InvalidRolloutId,
    SourceUnavailable,
    TokenEntryError,
)
from token_finalizer.core.identity import check_store_id, rollout_id_of
from token_finalizer.core.protocols import TokenSink, TokenSource
from token_finalizer.core.rebuild import rebuild_snapshot
from token_finalizer.sources import FileTokenStore, MemoryTokenStore, open_source

__version__ = "0.4.0"

__all__ = [
    "MASK_SAMPLE_KEY",
    "TOKEN_CAPTURE_KEY",
    "Build",
    "BuildKind",
    "CaptureConflict",
    "CaptureCorrupt",
    "CaptureError",
    "CaptureFrozen",
    "CaptureRetired",
    "FileTokenStore",
    "InvalidRolloutId",
    "MemoryTokenStore",
    "Snapshot",
    "SnapshotRef",
    "SourceUnavailable",
    "TokenEntry",
    "TokenEntryError",
    "TokenSink",
    "TokenSource",
    "__version__",
    "capture_build_can_retire",
    "check_store_id",
    "finalize_record",
    "finalize_rollout_token_capture",
    "open_source",
    "rebuild_snapshot",
    "retire_rollout_token_capture",
    "rollout_carries_token_ids",
    "rollout_id_of",
]
