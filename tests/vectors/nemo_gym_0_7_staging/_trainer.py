"""The trainer side of a staged rollout: receipt, fetch, verify, extras check (generator only).

NeMo Gym 0.7.0 ships no receipt builder; ``build_receipt`` is the finalizer's
policy, written down in the vectors' README: any failure row poisons the
receipt with the first failure's reason; the terminal comes from Gym's
``resolve_terminal`` over the manifest rows, else (when no id was declared)
from ``select_terminal_call``; a terminal that cannot be chosen poisons with
``terminal_selection:<reason>``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from _harness import StagingStore, dump
from _reference import Gym

__all__ = ["SELECTION_OF_METHOD", "build_receipt", "finalize", "outcome_of", "row_json"]

Json = Any

# resolve_terminal's method -> RolloutReceipt.terminal_selection.
SELECTION_OF_METHOD = {
    "explicit": "declared",
    "declared": "declared",
    "response_id": "response_id",
    "content": "content",
    "content_output": "content",
    "content_cumulative": "content",
}


def attribution_json(attribution: Any) -> Json:
    return {
        "model_call_id": attribution.model_call_id,
        "method": attribution.method,
        "reason": attribution.reason,
    }


def build_receipt(gym: Gym, rollout_id: str, manifest: Json, record: Json) -> dict[str, Any]:
    """The receipt for one finalize request, with the terminal-choice steps that made it."""
    rows = [gym.staged.CallRecord.model_validate(row) for row in manifest["records"]]
    explicit = record.get("_ng_terminal_model_call_id")
    declared = record.get("terminal_response_id")
    response = record.get("response")
    attribution = gym.terminal.resolve_terminal(
        rows,
        response if isinstance(response, dict) else None,
        str(explicit) if explicit else None,
        declared_response_id=str(declared) if declared else None,
    )
    steps: dict[str, Any] = {"attribution": attribution_json(attribution), "heuristic": None}
    selection_failure: str | None = None
    if attribution.model_call_id is not None:
        terminal = attribution.model_call_id
        selection = SELECTION_OF_METHOD[attribution.method]
    elif declared:
        terminal, selection = None, "declared"
        selection_failure = "terminal_selection:" + attribution.reason.split(",")[-1]
    else:
        chosen = gym.selection.select_terminal_call(rows)
        steps["heuristic"] = {
            "terminal_model_call_id": chosen.terminal_model_call_id,
            "reason": chosen.reason,
        }
        terminal, selection = chosen.terminal_model_call_id, "heuristic"
        if terminal is None:
            selection_failure = f"terminal_selection:{chosen.reason}"
    failures = manifest["failures"]
    failure_reason = failures[0]["reason"] if failures else selection_failure
    receipt = gym.staged.RolloutReceipt(
        rollout_id=rollout_id,
        reward=record.get("reward"),
        terminal_model_call_id=terminal,
        manifest=rows,
        capture_poisoned=failure_reason is not None,
        failure_reason=failure_reason,
        terminal_selection=selection,
        terminal_attribution_reason=attribution.reason or None,
    )
    return {"steps": steps, "receipt": receipt}


def row_json(row: Any) -> Json:
    plain = dataclasses.asdict(row)
    plain["link_spans"] = [list(span) for span in row.link_spans]
    return plain


def outcome_of(gym: Gym, receipt: Any, snapshots: list[Any]) -> dict[str, Any]:
    """``{"row": ...}`` or ``{"error": {"class", "code", "detail"}}`` of verify_and_linearize."""
    try:
        row = gym.rebuild.verify_and_linearize(receipt, snapshots)
    except gym.rebuild.ReceiptVerificationError as error:
        text = str(error)
        prefix = f"{error.code}: "
        return {
            "error": {
                "class": type(error).__name__,
                "code": error.code,
                "detail": text[len(prefix) :] if text.startswith(prefix) else text,
            }
        }
    except TypeError as error:
        return {"error": {"class": "TypeError", "code": None, "detail": str(error)}}
    return {"row": row_json(row)}


def finalize(gym: Gym, store: StagingStore, rollout_id: str, manifest: Json, record: Json) -> Json:
    """Receipt, fetch in manifest order, verify and linearize, then check the extras."""
    built = build_receipt(gym, rollout_id, manifest, record)
    receipt = built["receipt"]
    keys = [row.staging_key for row in receipt.manifest]
    snapshots = store.fetch(keys)
    outcome = outcome_of(gym, receipt, snapshots)
    expected: dict[str, Any] = {
        **built["steps"],
        "receipt": dump(receipt),
        "fetched_keys": keys,
        **outcome,
    }
    if "row" in outcome:
        key_of = {row.model_call_id: row.staging_key for row in receipt.manifest}
        checks = []
        for commitment in outcome["row"]["extras_commitments"]:
            call_id = commitment["model_call_id"]
            actual = gym.digest.compute_extras_digest(store.extras(key_of[call_id]))
            checks.append(
                {
                    "model_call_id": call_id,
                    "committed": commitment["extras_digest"],
                    "fetched": actual,
                    "ok": actual == commitment["extras_digest"],
                }
            )
        expected["extras_check"] = checks
    return expected
