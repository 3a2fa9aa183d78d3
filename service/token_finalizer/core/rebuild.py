"""Rebuild one frozen snapshot into a Build: arrange the calls, project, decide the mask."""

from __future__ import annotations

from typing import Any

from token_finalizer._constants import FRACTION_DIGITS
from token_finalizer.core.build import Build
from token_finalizer.core.entries import Snapshot
from token_finalizer.core.prefix_merging import BuildFailed, build_forest
from token_finalizer.core.projection import project_response

__all__ = ["BUILDER_NAME", "EMPTY_CAPTURE_ERROR", "MaskReason", "rebuild_snapshot"]

BUILDER_NAME = "prefix_merging"
EMPTY_CAPTURE_ERROR = "capture contains no token records"


class MaskReason:
    """Mask reasons of built responses (failed builds use the head of their error)."""

    CAPTURE_INCOMPLETE = "capture incomplete"
    UNRESOLVED_RETRIES = "unresolved retries"
    MULTIPLE_ROOTS = "multiple roots"
    MULTIPLE_CHAINS = "multiple chains"


def _fraction(numerator: int, denominator: int) -> float:
    return round(numerator / denominator, FRACTION_DIGITS) if denominator else 0.0


def _failed(snapshot: Snapshot, error: str) -> Build:
    metrics: dict[str, Any] = {"n_calls": len(snapshot.entries)}
    if snapshot.incomplete:
        metrics["capture_incomplete"] = True
    return Build.failed(
        snapshot.rollout_id, error, metrics=metrics, builder=BUILDER_NAME, snapshot=snapshot
    )


def rebuild_snapshot(snapshot: Snapshot, *, model: str = "") -> Build:
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
    reason: str | None = None
    if snapshot.incomplete:
        metrics["capture_incomplete"] = True
        reason = MaskReason.CAPTURE_INCOMPLETE
    elif forest.unresolved_retries:
        reason = MaskReason.UNRESOLVED_RETRIES
    elif forest.roots != 1:
        reason = MaskReason.MULTIPLE_ROOTS
    elif forest.chains != 1:
        reason = MaskReason.MULTIPLE_CHAINS
    return Build.built(
        snapshot,
        builder=BUILDER_NAME,
        response=response,
        metrics=metrics,
        mask_reason=reason,
        unresolved_retries=forest.unresolved_retries,
    )
