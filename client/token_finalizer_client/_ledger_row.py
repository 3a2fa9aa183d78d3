"""The capture-ledger row of one committed call, computed on the model server's side.

NeMo Gym 0.7's model server hands its ledger a `CaptureLedgerCommit` per
staged call it served: the manifest row (`CallRecord`), the call's staging
chain and the token-free request and response items. The row a ledger
stores for it is Gym's own file-ledger row, key for key
(docs/staging.md#ledger-rows-and-manifest): the lookup keys of parent
resolution, hashed here so that the store only compares strings, then the
custody columns copied from the record.

- `fingerprint`: the assistant fingerprint of request items + response items;
- `context_len`, `context_digest`: how many request items there are, and
  their conversation digest;
- `digest`: the call's `cumulative_hash`;
- the custody columns, the record's `digest` kept as `staging_digest`.

A commit is Gym's pydantic model (read through `model_dump(mode="json")`)
or the same data as a mapping; a mapping may leave out what the model
defaults (`parent_call_id`, `mode`, `admitted_at`, the two fingerprints,
`fingerprint_version`, `staging_chain`), and an integral `admitted_at` is
read as the float the model would hold, so both forms give one row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from token_finalizer_client._addressing import check_call_id, check_new_rollout_id
from token_finalizer_client._fingerprint import assistant_fingerprint, conversation_digest

__all__ = ["CommittedRow", "committed_row"]

# CallRecord fields a commit must carry, and those the model defaults.
_REQUIRED = (
    "model_call_id",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
    "extras_digest",
    "staging_key",
    "chain_hash",
    "cumulative_hash",
    "response_id",
)
_DEFAULTS: dict[str, Any] = {
    "parent_call_id": None,
    "mode": "token_in",
    "admitted_at": None,
    "output_fingerprint": None,
    "continuation_fingerprint": None,
    "fingerprint_version": 0,
}


@dataclass(frozen=True, slots=True)
class CommittedRow:
    """The rollout a commit belongs to, and the ledger row it stores."""

    rollout_id: str
    model_call_id: str
    row: dict[str, Any]


def _commit_data(commit: object) -> Mapping[str, Any]:
    if isinstance(commit, Mapping):
        return commit
    dump = getattr(commit, "model_dump", None)
    if callable(dump):
        data = dump(mode="json")
        if isinstance(data, Mapping):
            return data
    raise TypeError(
        f"commit must be a CaptureLedgerCommit or a mapping, got {type(commit).__name__}"
    )


def _field(data: Mapping[str, Any], name: str, what: str) -> Any:
    try:
        return data[name]
    except KeyError:
        raise ValueError(f"the commit's {what} has no {name!r}") from None


def _items(data: Mapping[str, Any], name: str) -> list[Any]:
    value = _field(data, name, "commit")
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        raise ValueError(f"the commit's {name} must be a list of items")
    return list(value)


def _record_columns(record: Mapping[str, Any]) -> dict[str, Any]:
    columns = {name: _field(record, name, "record") for name in _REQUIRED}
    for name, default in _DEFAULTS.items():
        columns[name] = record.get(name, default)
    admitted_at = columns["admitted_at"]
    if type(admitted_at) is int:  # the model reads an integral time as a float
        columns["admitted_at"] = float(admitted_at)
    return columns


def committed_row(commit: object) -> CommittedRow:
    """The ledger row of `commit`; ValueError (or TypeError) for a commit that is not one.

    Fingerprinting items the rules leave open raises `FingerprintError` (a ValueError).
    """
    data = _commit_data(commit)
    rollout_id = check_new_rollout_id(_field(data, "rollout_id", "commit"))
    record = _field(data, "record", "commit")
    if not isinstance(record, Mapping):
        raise ValueError("the commit's record must be an object")
    columns = _record_columns(record)
    call_id = check_call_id(columns["model_call_id"])
    chain = data.get("staging_chain") or ()
    if isinstance(chain, str) or not isinstance(chain, Sequence):
        raise ValueError("the commit's staging_chain must be a list of staging keys")
    request_items = _items(data, "request_items")
    response_items = _items(data, "response_items")
    row = {
        "model_call_id": call_id,
        "fingerprint": assistant_fingerprint(request_items + response_items),
        "context_len": len(request_items),
        "context_digest": conversation_digest(request_items),
        "digest": columns["cumulative_hash"],
        "parent_call_id": columns["parent_call_id"],
        "staging_key": columns["staging_key"],
        "weight_version": columns["weight_version"],
        "prev_len": columns["prev_len"],
        "delta_len": columns["delta_len"],
        "cum_len": columns["cum_len"],
        "staging_digest": columns["digest"],
        "extras_digest": columns["extras_digest"],
        "mode": columns["mode"],
        "admitted_at": columns["admitted_at"],
        "staging_chain": list(chain),
        "chain_hash": columns["chain_hash"],
        "cumulative_hash": columns["cumulative_hash"],
        "response_id": columns["response_id"],
        # Gym stores an empty fingerprint as null.
        "output_fingerprint": columns["output_fingerprint"] or None,
        "continuation_fingerprint": columns["continuation_fingerprint"] or None,
        "fingerprint_version": columns["fingerprint_version"],
    }
    return CommittedRow(rollout_id, call_id, row)
