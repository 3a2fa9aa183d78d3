"""The build of an externally staged rollout: receipt, verification, extras, verdict.

A frozen staging rollout (`Snapshot.staged`) is never rebuilt into the
record: NeMo Gym's external staging leaves `response.output` as it was
served (`rebuild_response: false`) and trains on the verified row instead
(docs/staging.md#finalize-and-retire). For one finished record:

1. `build_receipt(manifest, record)`: our receipt policy picks the record's
   terminal call (or poisons the rollout);
2. every manifest record must have its staged call (our check,
   `staged_record_missing`) unless the receipt is poisoned, whose verdict
   the reference verifier gives before it reads any snapshot;
3. `verify_and_linearize(receipt, snapshots)`: the reference's checks, order
   and codes;
4. the extras of the verified chain, fetched from the source, must hash to
   the row's commitments (`check_extras`).

The first failure masks the build with its code as `mask_reason`; the
outcome then carries no row. A verified row of a record that arrived
already marked `mask_sample` is kept in the outcome, but the build is
masked (`record_masked`), so it is never retired, as a rebuilt one would be.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from token_finalizer._constants import BUILD_IN_THREAD_MIN_TOKENS
from token_finalizer.core.build import MASK_SAMPLE_KEY, Build, MaskReason
from token_finalizer.core.entries import Snapshot
from token_finalizer.core.errors import StoreUnreachable, describe_exception
from token_finalizer.core.protocols import ExtrasSource
from token_finalizer.core.staged_outcome import StagedFailure, StagedOutcome
from token_finalizer.core.staging import (
    LinearizedRow,
    ReceiptPolicy,
    ReceiptVerificationError,
    RolloutReceipt,
    StagedCallBaseSnapshot,
    StagedCapture,
    StagingRecordError,
    build_receipt,
    check_extras,
    verify_and_linearize,
)

__all__ = ["STAGED_RECORD_MISSING", "build_staged"]

logger = logging.getLogger(__name__)

#: Our code for a manifest record whose staged call the store does not hold.
STAGED_RECORD_MISSING = str(MaskReason.STAGED_RECORD_MISSING)
_SHOWN_MISSING = 5  # call ids named in the detail; the count says the rest


async def build_staged(
    snapshot: Snapshot,
    record: Mapping[str, Any],
    extras: ExtrasSource | None,
    *,
    terminal_attribution: bool = True,
    receipt_policy: ReceiptPolicy = ReceiptPolicy.TOKEN_FINALIZER,
) -> Build:
    """The build of a frozen staging rollout for `record` (never raises, but StoreUnreachable).

    `extras` reads the chain's extras (None: a source that cannot, so any
    chain fails `missing_extras`). `terminal_attribution=False` leaves the
    record's witnesses out of the receipt: the parent-link walk alone picks
    the terminal. `receipt_policy` is ours or NeMo RL's (docs/staging.md#receipt-policy).
    StoreUnreachable from the extras read is raised: the caller decides
    between a 503 and a masked build.
    """
    staged = snapshot.staged
    if staged is None:
        raise ValueError(f"rollout {snapshot.rollout_id} was not staged externally")
    witnesses = record if terminal_attribution else {"reward": record.get("reward")}
    receipt: RolloutReceipt | None = None
    row: LinearizedRow | None = None
    try:
        receipt = _receipt(staged, witnesses, receipt_policy)
        row = await _verified(receipt, staged)
        await _check_extras(snapshot.rollout_id, row, staged.extras, extras)
    except ReceiptVerificationError as error:
        outcome = StagedOutcome(receipt=receipt, row=None, error=StagedFailure.of(error))
        return Build.staged_rollout(
            snapshot, outcome, metrics=_metrics(staged, receipt, None), mask_reason=_reason(error)
        )
    outcome = StagedOutcome(receipt=receipt, row=row, error=None)
    masked = MaskReason.RECORD_MASKED if record.get(MASK_SAMPLE_KEY) else None
    return Build.staged_rollout(
        snapshot, outcome, metrics=_metrics(staged, receipt, row), mask_reason=masked
    )


def _receipt(
    staged: StagedCapture, record: Mapping[str, Any], policy: ReceiptPolicy
) -> RolloutReceipt:
    try:
        return build_receipt(staged.manifest, record, policy=policy)
    except StagingRecordError:
        # The only rule a manifest can break on its way into a receipt is one row per
        # call id (stores write once per call id; a ledger edited by hand may not):
        # answered as the reference verifier answers such a receipt.
        failures = staged.manifest.failures
        if failures:
            raise ReceiptVerificationError("rollout_failed", failures[0].reason) from None
        raise ReceiptVerificationError(
            "duplicate_manifest_row", "model_call_id values are not unique"
        ) from None


async def _verified(receipt: RolloutReceipt, staged: StagedCapture) -> LinearizedRow:
    missing = staged.missing_call_ids
    if missing and not receipt.capture_poisoned:
        shown = ", ".join(missing[:_SHOWN_MISSING])
        more = f" and {len(missing) - _SHOWN_MISSING} more" if len(missing) > _SHOWN_MISSING else ""
        raise ReceiptVerificationError(
            STAGED_RECORD_MISSING,
            f"the store holds no staged call for manifest record(s) {shown}{more}",
        )
    snapshots: list[StagedCallBaseSnapshot] = [s for s in staged.snapshots if s is not None]
    tokens = sum(snapshot.delta_len for snapshot in snapshots)
    if tokens >= BUILD_IN_THREAD_MIN_TOKENS:
        # A long rollout is verified off the event loop, like a long rebuild.
        return await asyncio.to_thread(verify_and_linearize, receipt, snapshots)
    return verify_and_linearize(receipt, snapshots)


async def _check_extras(
    rollout_id: str,
    row: LinearizedRow,
    frozen: Mapping[str, dict[str, Any] | None] | None,
    extras: ExtrasSource | None,
) -> None:
    """Check the chain's extras: those the freeze carried (`frozen`), else read from `extras`."""
    fetched: Mapping[str, Any] = {}
    if frozen is not None:
        fetched = {call_id: frozen[call_id] for call_id in row.model_call_ids if call_id in frozen}
    elif extras is not None:
        try:
            fetched = await extras.fetch_extras(rollout_id, row.model_call_ids)
        except StoreUnreachable:
            raise
        except Exception as exc:
            logger.warning("extras of rollout %s unreadable: %s", rollout_id, exc)
            raise ReceiptVerificationError(
                "missing_extras", f"the chain's extras could not be read: {describe_exception(exc)}"
            ) from None
    check_extras(row, fetched)


def _reason(error: ReceiptVerificationError) -> MaskReason:
    """The mask reason of a failed check: its code (a code outside the set: build_failed)."""
    try:
        return MaskReason(error.code)
    except ValueError:
        logger.error("staging check code %r has no mask reason", error.code)
        return MaskReason.BUILD_FAILED


def _metrics(
    staged: StagedCapture, receipt: RolloutReceipt | None, row: LinearizedRow | None
) -> dict[str, Any]:
    """What `_ng_token_capture` and the build's metrics report of a staged finalize."""
    chain: Sequence[str] = () if row is None else row.model_call_ids
    return {
        "n_calls": len(staged.manifest.records),
        "failures": len(staged.manifest.failures),
        "staged_records_missing": len(staged.missing_call_ids),
        "terminal_model_call_id": None if receipt is None else receipt.terminal_model_call_id,
        "terminal_selection": None if receipt is None else receipt.terminal_selection,
        "chain_length": len(chain),
        "tokens": 0 if row is None else len(row.token_ids),
        "generated_tokens": 0 if row is None else int(row.token_mask.sum()),
    }
