"""The committed 0.3.0 / 0.4.0 staged calls (`old_staged/calls.json`, see its generate.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from token_finalizer.core.staging import StagedCallRecord

__all__ = ["CALLS", "IDS", "OLD", "RID", "record_of"]

OLD: dict[str, Any] = json.loads((Path(__file__).parent / "old_staged" / "calls.json").read_text())
RID: str = OLD["rollout_id"]
CALLS: list[dict[str, Any]] = OLD["calls"]
IDS = [call["record"]["model_call_id"] for call in CALLS]


def record_of(call: dict[str, Any]) -> StagedCallRecord:
    """The staged record of one of `CALLS`."""
    return StagedCallRecord.from_json(call["record"])
