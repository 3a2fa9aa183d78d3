"""Assemble what finalize returns (the build) from a frozen snapshot."""

from __future__ import annotations

from typing import Any

from token_finalizer._constants import FRACTION_DIGITS
from token_finalizer.core.entries import Snapshot
from token_finalizer.core.prefix_merging import BuildFailed, build_forest
from token_finalizer.core.projection import project_response

__all__ = [
    "BUILDER_NAME",
    "EMPTY_CAPTURE_ERROR",
    "build_from_snapshot",
    "mask_reason",
    "snapshot_ref",
]

BUILDER_NAME = "prefix_merging"
EMPTY_CAPTURE_ERROR = "capture contains no token records"


def _fraction(numerator: int, denominator: int) -> float:
    return round(numerator / denominator, FRACTION_DIGITS) if denominator else 0.0


def snapshot_ref(snapshot: Snapshot) -> dict[str, Any]:
    """The exact snapshot a build consumed: what retire must name."""
    return {"snapshot_id": snapshot.snapshot_id, "version": snapshot.version}


def _failed(snapshot: Snapshot, error: str) -> dict[str, Any]:
    metrics: dict[str, Any] = {"n_calls": len(snapshot.entries)}
    if snapshot.incomplete:
        metrics["capture_incomplete"] = True
    return {
        "rollout_id": snapshot.rollout_id,
        "builder": BUILDER_NAME,
        "rebuilt_response": None,
        "mask_sample": True,
        "error": error,
        "metrics": metrics,
        "_capture_snapshot": snapshot_ref(snapshot),
    }


def build_from_snapshot(snapshot: Snapshot, *, model: str = "") -> dict[str, Any]:
    """Rebuild the response of one frozen snapshot; a failure is a masked build, not a raise."""
    if not snapshot.entries:
        return _failed(snapshot, EMPTY_CAPTURE_ERROR)
    try:
        forest = build_forest(snapshot.entries)
        response = project_response(forest.main_chain, rollout_id=snapshot.rollout_id, model=model)
    except BuildFailed as exc:
        return _failed(snapshot, str(exc))
    n_calls = len(snapshot.entries)
    metrics: dict[str, Any] = {
        "n_calls": n_calls,
        "chains": forest.chains,
        "roots": forest.roots,
        "quarantined_calls": forest.quarantined_calls,
        "quarantined_fraction": _fraction(forest.quarantined_calls, n_calls),
        "delivered_fraction": _fraction(
            forest.generated_tokens_delivered, forest.generated_tokens_captured
        ),
        "generated_tokens_captured": forest.generated_tokens_captured,
        "generated_tokens_delivered": forest.generated_tokens_delivered,
        "empty_generation_calls": forest.empty_generation_calls,
    }
    if snapshot.incomplete:
        metrics["capture_incomplete"] = True
    masked = (
        bool(forest.unresolved_retries)
        or forest.roots != 1
        or forest.chains != 1
        or snapshot.incomplete
    )
    return {
        "rollout_id": snapshot.rollout_id,
        "builder": BUILDER_NAME,
        "rebuilt_response": response,
        "metrics": metrics,
        "mask_sample": masked,
        "unresolved_retries": forest.unresolved_retries,
        "_capture_snapshot": snapshot_ref(snapshot),
    }


def mask_reason(build: dict[str, Any] | None) -> str | None:
    """A short, low-cardinality reason for a masked build (None when not masked).

    Used to aggregate: Prometheus labels and the mask-fraction guard's counts.
    """
    if not isinstance(build, dict) or not build.get("mask_sample"):
        return None
    error = build.get("error")
    if error:
        # "<ExceptionType>: <message>" and "malformed rollout id: <detail>" keep their head.
        return str(error).partition(":")[0]
    metrics = build.get("metrics") or {}
    if metrics.get("capture_incomplete"):
        return "capture incomplete"
    if build.get("unresolved_retries"):
        return "unresolved retries"
    if metrics.get("roots") != 1:
        return "multiple roots"
    return "multiple chains"
