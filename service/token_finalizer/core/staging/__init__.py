"""External staging, NeMo Gym 0.7.0's framework-owned token custody: pure logic (docs/staging.md).

Workers stage one record per model call; the model server's capture ledger
keeps token-free rows and serves a manifest; the trainer builds a receipt,
fetches the staged snapshots and verifies and linearizes the terminal chain.
This package holds every rule of that contract that needs no I/O:

- ``records``, ``manifest``, ``linearized``: the typed wire types;
- ``digests``: the four staging hashes, byte-exact with the reference;
- ``delta``: the staged record a worker computes for a call;
- ``custody``: our stage-time checks (a record must extend its staged parent);
- ``packed``: a stage request's token columns sent as binary images;
- ``ledger``: ledger rows, write-once, the manifest, parent resolution;
- ``attribution``, ``receipt``: terminal attribution and our receipt policy;
- ``verify``: the reference's verification and linearization, and the extras check;
- ``stored``: a frozen staging rollout as a store answers it (``StagedCapture``).
"""

from token_finalizer.core.staging._wire import StagingRecordError
from token_finalizer.core.staging.attribution import (
    RowAttribution,
    TerminalSelection,
    attribute_rows,
    select_terminal_call,
)
from token_finalizer.core.staging.custody import CustodyRefusal, admit_staged_record, check_custody
from token_finalizer.core.staging.delta import build_staged_call
from token_finalizer.core.staging.digests import (
    EMPTY_EXTRAS_DIGEST,
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    hash_chain,
    hash_extras,
    hash_staged_call,
    hash_token_parts,
    hash_tokens,
    staging_key,
)
from token_finalizer.core.staging.ledger import (
    LedgerConflict,
    LedgerMatch,
    LedgerResolution,
    LedgerWrite,
    commit_row,
    failure_row,
    manifest_from_rows,
    plan_commit,
    plan_failure,
    resolve_ledger,
    resolve_ledger_items,
)
from token_finalizer.core.staging.linearized import (
    ExtrasCommitment,
    LinearizedRow,
    WeightVersionSpan,
)
from token_finalizer.core.staging.manifest import (
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    RolloutReceipt,
)
from token_finalizer.core.staging.packed import (
    PACK_ERRORS,
    PACKED_COLUMNS,
    pack_columns,
    unpack_columns,
)
from token_finalizer.core.staging.receipt import ReceiptPolicy, build_receipt
from token_finalizer.core.staging.records import (
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StageResult,
)
from token_finalizer.core.staging.stored import StagedCapture, stored_snapshot
from token_finalizer.core.staging.verify import (
    RebuildError,
    ReceiptVerificationError,
    check_extras,
    verify_and_linearize,
)

__all__ = [
    "EMPTY_EXTRAS_DIGEST",
    "EXTRAS_DIGEST_VERSION",
    "PACKED_COLUMNS",
    "PACK_ERRORS",
    "STAGING_DIGEST_VERSION",
    "STAGING_SCHEMA_VERSION",
    "CallRecord",
    "CustodyRefusal",
    "ExtrasCommitment",
    "LedgerConflict",
    "LedgerMatch",
    "LedgerResolution",
    "LedgerWrite",
    "LinearizedRow",
    "ManifestFailure",
    "RebuildError",
    "ReceiptPolicy",
    "ReceiptVerificationError",
    "RolloutManifest",
    "RolloutReceipt",
    "RowAttribution",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedCallRecord",
    "StagedCapture",
    "StagingRecordError",
    "TerminalSelection",
    "WeightVersionSpan",
    "admit_staged_record",
    "attribute_rows",
    "build_receipt",
    "build_staged_call",
    "check_custody",
    "check_extras",
    "commit_row",
    "failure_row",
    "hash_chain",
    "hash_extras",
    "hash_staged_call",
    "hash_token_parts",
    "hash_tokens",
    "manifest_from_rows",
    "pack_columns",
    "plan_commit",
    "plan_failure",
    "resolve_ledger",
    "resolve_ledger_items",
    "select_terminal_call",
    "staging_key",
    "stored_snapshot",
    "unpack_columns",
    "verify_and_linearize",
]
