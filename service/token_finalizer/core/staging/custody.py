"""Stage-time custody checks: refuse a staged call that does not extend its parent exactly.

NeMo Gym 0.7.0 checks a staged record only against itself (its digests
recompute) and trusts the worker's prefix: a wrong prefix mid-chain is
accepted and trained on, because only the terminal's ``cumulative_hash`` is
ever checked against the linearized tokens. A store that keeps every staged
call can do better at the moment a call is staged
(docs/staging.md#custody-checks): a ``token_in`` call must sit on a staged
parent with ``cum_len == prev_len``, chain onto the parent's ``chain_hash``
with its own delta, and its ``cumulative_hash`` must be the token hash of
the parent chain's tokens (the deltas root .. parent) followed by its delta.
A text root must likewise chain from nothing and hash its delta alone.

A refusal raises ``CustodyRefusal`` naming the check; a store answers it as
``StageResult(ok=False, error=str(refusal))``, Gym then records
``worker_capture_failed`` and the rollout is poisoned rather than trained on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from token_finalizer.core.staging._wire import StagingRecordError
from token_finalizer.core.staging.digests import hash_chain, hash_token_parts
from token_finalizer.core.staging.records import StagedCallBaseSnapshot, StagedCallRecord

__all__ = [
    "CHAIN_HASH_MISMATCH",
    "CUMULATIVE_HASH_MISMATCH",
    "INVALID_RECORD",
    "PARENT_CHAIN_BROKEN",
    "PARENT_LENGTH_MISMATCH",
    "PARENT_NOT_STAGED",
    "CustodyRefusal",
    "admit_staged_record",
    "check_custody",
]

INVALID_RECORD = "invalid_record"
PARENT_NOT_STAGED = "parent_not_staged"
PARENT_CHAIN_BROKEN = "parent_chain_broken"
PARENT_LENGTH_MISMATCH = "parent_length_mismatch"
CHAIN_HASH_MISMATCH = "chain_hash_mismatch"
CUMULATIVE_HASH_MISMATCH = "cumulative_hash_mismatch"


class CustodyRefusal(ValueError):
    """A staged call refused at stage time; ``check`` names the check it failed."""

    def __init__(self, check: str, detail: str) -> None:
        self.check = check
        self.detail = detail
        super().__init__(f"{check}: {detail}")


def admit_staged_record(data: Mapping[str, Any]) -> StagedCallRecord:
    """Read a staged record's wire form with the reference's own validation.

    Any broken rule (types, lengths, masks, a digest that does not recompute,
    extras that do not match ``extras_digest``) is an ``invalid_record`` refusal.
    """
    try:
        return StagedCallRecord.from_json(data)
    except StagingRecordError as error:
        raise CustodyRefusal(INVALID_RECORD, str(error)) from None


def check_custody(
    record: StagedCallBaseSnapshot, ancestors: Sequence[StagedCallBaseSnapshot]
) -> None:
    """Refuse ``record`` unless it extends its staged parent chain exactly.

    ``ancestors`` are the already staged calls of the record's chain, root
    first, ending with the record's parent: empty for a text root, and empty
    too when the store holds no parent (then the refusal is
    ``parent_not_staged``). Checks, in order: the parent is staged, the
    ancestors link root to parent within the rollout, ``parent.cum_len ==
    prev_len``, the chain hash, the cumulative hash.
    """
    call = f"call {record.model_call_id}"
    if record.parent_call_id is None:
        # A root carries nothing: its chain starts from nothing.
        ancestors = ()
        parent_chain_hash = None
    else:
        parent = ancestors[-1] if ancestors else None
        if parent is None or parent.model_call_id != record.parent_call_id:
            raise CustodyRefusal(
                PARENT_NOT_STAGED, f"{call}: parent {record.parent_call_id} is not staged"
            )
        _check_links(record, ancestors)
        if parent.cum_len != record.prev_len:
            raise CustodyRefusal(
                PARENT_LENGTH_MISMATCH,
                f"{call} starts at {record.prev_len}, parent ends at {parent.cum_len}",
            )
        parent_chain_hash = parent.chain_hash
    if record.chain_hash != hash_chain(parent_chain_hash, record.token_ids_delta):
        raise CustodyRefusal(
            CHAIN_HASH_MISMATCH, f"{call}: chain_hash does not chain its delta onto its parent's"
        )
    parts = [ancestor.token_ids_delta for ancestor in ancestors]
    parts.append(record.token_ids_delta)
    if record.cumulative_hash != hash_token_parts(parts):
        raise CustodyRefusal(
            CUMULATIVE_HASH_MISMATCH,
            f"{call}: cumulative_hash is not the token hash of its parent chain and delta",
        )


def _check_links(
    record: StagedCallBaseSnapshot, ancestors: Sequence[StagedCallBaseSnapshot]
) -> None:
    expected_parent: str | None = None
    for ancestor in ancestors:
        if ancestor.rollout_id != record.rollout_id or ancestor.parent_call_id != expected_parent:
            raise CustodyRefusal(
                PARENT_CHAIN_BROKEN,
                f"call {record.model_call_id}: staged call {ancestor.model_call_id} "
                "does not continue the chain before it",
            )
        expected_parent = ancestor.model_call_id
