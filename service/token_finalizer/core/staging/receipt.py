"""The receipt policy: from a frozen manifest and the finished record to a ``RolloutReceipt``.

NeMo Gym 0.7.0 ships no receipt builder; this is ours (docs/staging.md#receipt-policy):

1. Any failure row poisons the rollout: ``failure_reason`` is the first
   failure's reason (commit order). Attribution still runs, so the receipt
   says which call it would have been.
2. The terminal is the row the witnesses attribute (``attribute_rows``). The
   method becomes ``terminal_selection``: explicit and declared ->
   ``declared``, ``response_id`` -> ``response_id``, content -> ``content``.
3. A declared response id that cannot be attributed (no row, several
   different rows, or witnesses that disagree with it) poisons:
   ``terminal_selection:<why>`` with selection ``declared``. A harness that
   said which response it kept never gets another one trained.
4. Otherwise, with no witness or disagreeing witnesses, the parent-link walk
   (``select_terminal_call``) picks the terminal (``heuristic``); when it
   cannot, ``terminal_selection:<walk reason>`` poisons.

``terminal_attribution_reason`` is the witnesses' reason trail (informative).

``ReceiptPolicy.NEMO_RL`` selects three of NeMo RL's choices instead
(docs/staging.md#nemo-rls-receipt-policy): a failure row of an uncommitted
call (``request_finished_without_staged_coordinates``) does not poison, a
selection failure is the bare reason (``missing_terminal_row`` for a declared
terminal that is not attributed, the walk's own reason otherwise), and the
explicit ``_ng_terminal_model_call_id`` is not read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from token_finalizer.core.staging.attribution import attribute_rows, select_terminal_call
from token_finalizer.core.staging.manifest import RolloutManifest, RolloutReceipt

__all__ = [
    "SELECTION_FAILURE_PREFIX",
    "UNCOMMITTED_CALL_REASON",
    "ReceiptPolicy",
    "build_receipt",
    "selection_of_method",
]

SELECTION_FAILURE_PREFIX = "terminal_selection:"
# Gym's failure reason for a call admitted and served but never committed.
UNCOMMITTED_CALL_REASON = "request_finished_without_staged_coordinates"
# NeMo RL's failure reason for a declared terminal no manifest row matches.
_NEMO_RL_MISSING_TERMINAL = "missing_terminal_row"
_EXPLICIT_KEY = "_ng_terminal_model_call_id"


class ReceiptPolicy(StrEnum):
    """Whose receipt policy `build_receipt` applies (a staging source's `receipt_policy`)."""

    TOKEN_FINALIZER = "token_finalizer"  # ours, the default
    NEMO_RL = "nemo_rl"  # NeMo RL's BlackboxFinalizer, where it differs cheaply


_SELECTION_OF_METHOD = {
    "explicit": "declared",
    "declared": "declared",
    "response_id": "response_id",
    "content": "content",
}


def selection_of_method(method: str) -> str:
    """The receipt's ``terminal_selection`` for an attribution method."""
    return _SELECTION_OF_METHOD[method]


def build_receipt(
    manifest: RolloutManifest,
    record: Mapping[str, Any],
    *,
    policy: ReceiptPolicy = ReceiptPolicy.TOKEN_FINALIZER,
) -> RolloutReceipt:
    """The receipt of ``manifest`` for the finished ``record`` (the body finalize received).

    The record supplies the scored ``response``, the declared
    ``terminal_response_id``, the explicit ``_ng_terminal_model_call_id`` and
    the ``reward`` (kept when it is a finite number, else null). ``policy``
    selects ours or NeMo RL's choices (the module docstring).
    """
    nemo_rl = policy is ReceiptPolicy.NEMO_RL
    if nemo_rl and _EXPLICIT_KEY in record:
        record = {key: value for key, value in record.items() if key != _EXPLICIT_KEY}
    rows = manifest.records
    attribution = attribute_rows(rows, record)
    terminal: str | None = None
    selection: str
    failure: str | None = None
    if attribution.call_id is not None:
        terminal = attribution.call_id
        selection = selection_of_method(attribution.method)
    elif attribution.declared:
        selection = "declared"
        failure = (
            _NEMO_RL_MISSING_TERMINAL if nemo_rl else SELECTION_FAILURE_PREFIX + attribution.failure
        )
    else:
        selection = "heuristic"
        walk = select_terminal_call(rows)
        if walk.call_id is not None:
            terminal = walk.call_id
        else:
            failure = walk.reason if nemo_rl else SELECTION_FAILURE_PREFIX + walk.reason
    poisoning = [
        failed
        for failed in manifest.failures
        if not (nemo_rl and failed.reason == UNCOMMITTED_CALL_REASON)
    ]
    if poisoning:
        failure = poisoning[0].reason
    return RolloutReceipt(
        rollout_id=manifest.rollout_id,
        reward=_reward(record.get("reward")),
        terminal_model_call_id=terminal,
        manifest=rows,
        capture_poisoned=failure is not None,
        failure_reason=failure,
        terminal_selection=selection,
        terminal_attribution_reason=attribution.reason or None,
    )


def _reward(value: object) -> float | None:
    if type(value) in (int, float):
        assert isinstance(value, int | float)
        try:
            reward = float(value)
        except OverflowError:
            return None
        return reward if math.isfinite(reward) else None
    return None
