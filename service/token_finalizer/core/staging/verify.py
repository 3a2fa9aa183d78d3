"""Verify a receipt against its fetched snapshots and linearize the terminal chain.

The checks, their order, their error classes and codes are NeMo Gym 0.7.0's
``verify_and_linearize`` (docs/staging.md#verification-and-linearization,
docs/staging.md#error-codes): a trainer that swaps one for the other sees the
same verdict for the same inputs. Receipt and snapshot checks raise
``ReceiptVerificationError``; graph and chain checks raise its subclass
``RebuildError``.

The work is linear in the rollout: every snapshot digest is recomputed once
from its buffers, the parent graph is checked for cycles with memoized walks,
and the whole-sequence ``cumulative_hash`` is computed once, for the terminal,
over the concatenated ids without a further copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from token_finalizer.core.staging.digests import (
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    hash_chain,
    hash_extras,
    hash_tokens,
)
from token_finalizer.core.staging.linearized import (
    ExtrasCommitment,
    LinearizedRow,
    WeightVersionSpan,
)
from token_finalizer.core.staging.manifest import CallRecord, RolloutReceipt
from token_finalizer.core.staging.records import StagedCallBaseSnapshot, recompute_digest

__all__ = [
    "RebuildError",
    "ReceiptVerificationError",
    "check_extras",
    "verify_and_linearize",
]


class ReceiptVerificationError(ValueError):
    """A receipt or a staged snapshot breaks a custody rule; ``code`` says which."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"{code}: {detail}")


class RebuildError(ReceiptVerificationError):
    """The verified manifest cannot form the terminal's chain (graph and chain checks)."""


# Compared in this order; the first difference is reported as ``wrong_<field>``.
_COMPARED_FIELDS = (
    "model_call_id",
    "parent_call_id",
    "mode",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
    "extras_digest",
    "chain_hash",
    "cumulative_hash",
)
_VERSION_FIELDS = ("schema_version", "digest_version", "extras_digest_version")


def verify_and_linearize(
    receipt: RolloutReceipt, snapshots: Sequence[StagedCallBaseSnapshot]
) -> LinearizedRow:
    """The terminal chain's row, after every check passed; else the first failure raises.

    ``snapshots`` are the fetched base snapshots, one per manifest row, in
    manifest order. Extras are never read here: the row's
    ``extras_commitments`` say what the chain's extras must hash to
    (``check_extras``).
    """
    if not isinstance(receipt, RolloutReceipt):
        raise TypeError("receipt must be a RolloutReceipt")
    _check_receipt(receipt)
    records = _index_manifest(receipt, snapshots)
    by_call_id = _bind_snapshots(receipt, snapshots, records)
    _check_graph(records)
    chain = _terminal_chain(receipt, records)
    return _linearize(receipt.rollout_id, chain, by_call_id)


def check_extras(row: LinearizedRow, fetched_extras: Mapping[str, Any]) -> None:
    """Check the fetched extras of every chain call against the row's commitments.

    ``fetched_extras`` maps each chain call id to its extras (``None`` when it
    staged none). A call left out raises ``missing_extras``, extras that cannot
    be digested ``invalid_extras``, a different digest ``extras_digest_mismatch``
    (all ``ReceiptVerificationError``; these checks are ours, the reference
    leaves them to the framework).
    """
    for commitment in row.extras_commitments:
        call_id = commitment.model_call_id
        if call_id not in fetched_extras:
            raise ReceiptVerificationError("missing_extras", f"call {call_id}: no extras fetched")
        try:
            actual = hash_extras(fetched_extras[call_id])
        except (TypeError, ValueError) as error:
            raise ReceiptVerificationError("invalid_extras", f"call {call_id}: {error}") from None
        if actual != commitment.extras_digest:
            raise ReceiptVerificationError(
                "extras_digest_mismatch",
                f"call {call_id}: fetched extras do not hash to the committed digest",
            )


def _check_receipt(receipt: RolloutReceipt) -> None:
    if receipt.schema_version != STAGING_SCHEMA_VERSION:
        raise ReceiptVerificationError(
            "unsupported_schema", f"receipt schema {receipt.schema_version}"
        )
    if receipt.digest_version != STAGING_DIGEST_VERSION:
        raise ReceiptVerificationError(
            "unsupported_digest", f"receipt digest {receipt.digest_version}"
        )
    if receipt.extras_digest_version != EXTRAS_DIGEST_VERSION:
        raise ReceiptVerificationError(
            "unsupported_extras_digest", f"receipt extras digest {receipt.extras_digest_version}"
        )
    if receipt.failure_reason is not None:
        raise ReceiptVerificationError("rollout_failed", receipt.failure_reason)
    if receipt.capture_poisoned:
        raise ReceiptVerificationError(
            "capture_poisoned", "receipt marks token capture as poisoned"
        )
    if not receipt.manifest:
        raise ReceiptVerificationError(
            "empty_manifest", "successful receipt has no committed calls"
        )


def _index_manifest(
    receipt: RolloutReceipt, snapshots: Sequence[StagedCallBaseSnapshot]
) -> dict[str, CallRecord]:
    records: dict[str, CallRecord] = {}
    staging_keys: set[str] = set()
    for record in receipt.manifest:
        if record.model_call_id in records:
            raise ReceiptVerificationError(
                "duplicate_manifest_row", "model_call_id values are not unique"
            )
        if record.staging_key in staging_keys:
            raise ReceiptVerificationError("duplicate_staging_key", "staging keys are not unique")
        records[record.model_call_id] = record
        staging_keys.add(record.staging_key)
    if len(snapshots) != len(receipt.manifest):
        raise ReceiptVerificationError(
            "row_count_mismatch",
            f"{len(snapshots)} snapshots for {len(receipt.manifest)} manifest rows",
        )
    return records


def _bind_snapshots(
    receipt: RolloutReceipt,
    snapshots: Sequence[StagedCallBaseSnapshot],
    records: dict[str, CallRecord],
) -> dict[str, StagedCallBaseSnapshot]:
    """Pair each manifest row with the snapshot at its position and check the pair."""
    by_call_id: dict[str, StagedCallBaseSnapshot] = {}
    for record, snapshot in zip(receipt.manifest, snapshots, strict=True):
        if not isinstance(snapshot, StagedCallBaseSnapshot):
            raise TypeError("snapshots must contain StagedCallBaseSnapshot values")
        call_id = snapshot.model_call_id
        if call_id in by_call_id:
            raise ReceiptVerificationError(
                "duplicate_snapshot", "model_call_id values are not unique"
            )
        if call_id not in records:
            raise ReceiptVerificationError(
                "snapshot_identity_mismatch", f"snapshot {call_id} is not in the manifest"
            )
        if call_id != record.model_call_id:
            raise ReceiptVerificationError(
                "snapshot_order_mismatch",
                f"key {record.staging_key} expected {record.model_call_id}, received {call_id}",
            )
        by_call_id[call_id] = snapshot
        _compare(receipt, record, snapshot)
        _check_digest(snapshot)
    return by_call_id


def _compare(receipt: RolloutReceipt, record: CallRecord, snapshot: StagedCallBaseSnapshot) -> None:
    # The manifest's staging_key is deliberately not compared: keys are the
    # store's business, the call id and digests bind the content.
    call_id = record.model_call_id
    if snapshot.rollout_id != receipt.rollout_id:
        raise ReceiptVerificationError(
            "wrong_rollout", f"snapshot {call_id} belongs to {snapshot.rollout_id}"
        )
    for name in _COMPARED_FIELDS:
        actual, expected = getattr(snapshot, name), getattr(record, name)
        if actual != expected:
            raise ReceiptVerificationError(
                f"wrong_{name}", f"call {call_id}: snapshot {actual!r}, manifest {expected!r}"
            )
    for name in _VERSION_FIELDS:
        actual, expected = getattr(snapshot, name), getattr(record, name)
        in_receipt = getattr(receipt, name)
        if actual != expected or actual != in_receipt:
            raise ReceiptVerificationError(
                f"wrong_{name}",
                f"call {call_id}: snapshot={actual}, manifest={expected}, receipt={in_receipt}",
            )


def _check_digest(snapshot: StagedCallBaseSnapshot) -> None:
    # Recomputed from the recorded extras digest: the base row never depends
    # on the extras being present.
    call_id = snapshot.model_call_id
    try:
        actual = recompute_digest(snapshot)
    except (TypeError, ValueError, OverflowError) as error:
        raise ReceiptVerificationError("invalid_snapshot", f"call {call_id}: {error}") from None
    if actual != snapshot.digest:
        raise ReceiptVerificationError("corrupt_digest", f"call {call_id}: staged digest mismatch")


def _check_graph(records: dict[str, CallRecord]) -> None:
    """Parents present and length-contiguous, no cycles: row by row, in manifest order."""
    acyclic: set[str] = set()
    for call_id, record in records.items():
        parent_id = record.parent_call_id
        if parent_id is not None:
            parent = records.get(parent_id)
            if parent is None:
                raise RebuildError(
                    "missing_parent", f"call {call_id} names absent parent {parent_id}"
                )
            if parent.cum_len != record.prev_len:
                raise RebuildError(
                    "parent_length_mismatch",
                    f"call {call_id} starts at {record.prev_len}, parent ends at {parent.cum_len}",
                )
        # Walk up until a call already known to reach a root (or a root, or a
        # parent not in the manifest); a call seen twice on this walk is a cycle.
        walked: set[str] = set()
        cursor: CallRecord | None = record
        while cursor is not None and cursor.model_call_id not in acyclic:
            if cursor.model_call_id in walked:
                raise RebuildError("lineage_cycle", f"cycle reaches call {cursor.model_call_id}")
            walked.add(cursor.model_call_id)
            above = cursor.parent_call_id
            cursor = records.get(above) if above is not None else None
        acyclic.update(walked)


def _terminal_chain(receipt: RolloutReceipt, records: dict[str, CallRecord]) -> list[CallRecord]:
    terminal = receipt.terminal_model_call_id
    if terminal is None:
        raise RebuildError("missing_terminal", "successful receipt has no terminal call")
    cursor = records.get(terminal)
    if cursor is None:
        raise RebuildError("missing_terminal", f"terminal call {terminal} is absent")
    chain: list[CallRecord] = []
    while cursor is not None:
        chain.append(cursor)
        cursor = records.get(cursor.parent_call_id) if cursor.parent_call_id is not None else None
    chain.reverse()
    return chain


def _linearize(
    rollout_id: str, chain: list[CallRecord], by_call_id: dict[str, StagedCallBaseSnapshot]
) -> LinearizedRow:
    snapshots = [by_call_id[record.model_call_id] for record in chain]
    spans: list[WeightVersionSpan] = []
    links: list[tuple[str, int, int]] = []
    running: str | None = None
    start = 0
    prompt_len = 0
    for index, (record, snapshot) in enumerate(zip(chain, snapshots, strict=True)):
        call_id = record.model_call_id
        running = hash_chain(running, snapshot.token_ids_delta)
        if record.chain_hash != running:
            raise RebuildError(
                "chain_hash_mismatch", f"call {call_id} does not extend its parent's staged chain"
            )
        carried = _carry_length(snapshot)
        end = start + len(snapshot.token_ids_delta)
        if index == 0:
            prompt_len = carried
        spans.append(WeightVersionSpan(call_id, start, end, record.weight_version))
        links.append((call_id, carried, record.delta_len - carried))
        start = end

    token_ids = _joined([snapshot.token_ids_delta for snapshot in snapshots])
    token_mask = _joined([snapshot.token_mask_delta for snapshot in snapshots])
    logprobs = _joined([snapshot.generation_log_probs_delta for snapshot in snapshots])
    if not token_mask.any():
        raise RebuildError("empty_training_row", "terminal chain has no generated tokens")
    # One whole-sequence check, at the terminal: the chain hashes already
    # link every delta, so per-call cumulative checks would add only cost.
    terminal = chain[-1]
    if terminal.cumulative_hash != hash_tokens(token_ids):
        raise RebuildError(
            "cumulative_hash_mismatch",
            f"terminal call {terminal.model_call_id} cumulative hash does not cover "
            "the linearized tokens",
        )
    return LinearizedRow(
        rollout_id=rollout_id,
        token_ids=token_ids,
        token_mask=token_mask,
        logprobs=logprobs,
        model_call_ids=tuple(record.model_call_id for record in chain),
        prompt_len=prompt_len,
        weight_versions=tuple(record.weight_version for record in chain),
        weight_version_spans=tuple(spans),
        link_spans=tuple(links),
        extras_commitments=tuple(
            ExtrasCommitment(
                record.model_call_id, record.extras_digest_version, record.extras_digest
            )
            for record in chain
        ),
    )


def _carry_length(snapshot: StagedCallBaseSnapshot) -> int:
    """Length of the leading carry (mask 0.0) run; the rest must all be 1.0, and not empty."""
    mask = snapshot.token_mask_delta
    generated = mask != 0.0
    carried = int(generated.argmax()) if generated.any() else len(mask)
    if not (mask[carried:] == 1.0).all():
        raise RebuildError(
            "invalid_mask_order",
            f"call {snapshot.model_call_id} mask is not carry-then-generation",
        )
    if carried == len(mask):
        raise RebuildError(
            "empty_generation",
            f"call {snapshot.model_call_id} contains no policy-generated token",
        )
    return carried


def _joined(columns: list[Any]) -> Any:
    joined = np.concatenate(columns)
    joined.flags.writeable = False
    return joined
