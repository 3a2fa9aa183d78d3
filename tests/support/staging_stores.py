"""External staging in a store, driven from test code: synthetic rollouts and the 0.7 vectors.

`Conversation` builds a chain of staged calls and their committed ledger rows
the way NeMo Gym 0.7 would for a simple chat (one user turn per call, each
call continuing the previous one); the other helpers turn the staging
vectors' Gym objects into what our stores take.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from token_finalizer.core.staging import (
    CallRecord,
    StagedCallRecord,
    build_staged_call,
    commit_row,
    staging_key,
)
from token_finalizer.sources.base import LineageQuery
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    assistant_fingerprint,
    context_digests,
    conversation_digest,
)

__all__ = [
    "Conversation",
    "committed_row",
    "manifest_row",
    "query_of",
    "resolution_of",
    "row_of_commit",
    "wire_attachments",
]


def _user(index: int) -> dict[str, Any]:
    return {"role": "user", "content": f"question {index}"}


def _assistant(index: int) -> dict[str, Any]:
    return {"role": "assistant", "content": f"answer {index}"}


@dataclass
class Conversation:
    """A chain of calls of one rollout: call k answers user turn k, on top of call k-1."""

    rollout_id: str
    records: list[StagedCallRecord] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    requests: list[list[dict[str, Any]]] = field(default_factory=list)

    @classmethod
    def of(cls, rollout_id: str, calls: int, *, prefix: str = "c") -> Conversation:
        """`calls` calls named `<prefix>1`, `<prefix>2`, ... (3 prompt, 2 generated tokens each)."""
        conversation = cls(rollout_id)
        for index in range(1, calls + 1):
            conversation.add(f"{prefix}{index}")
        return conversation

    def request_items(self, index: int) -> list[dict[str, Any]]:
        """The items of call `index` (0-based): every earlier turn, then a new user turn."""
        items: list[dict[str, Any]] = []
        for earlier in range(index):
            items += [_user(earlier), _assistant(earlier)]
        return [*items, _user(index)]

    def staged_match(self, index: int) -> dict[str, Any]:
        """The resolve answer's match naming row `index` (0-based): a staged row carries no ids."""
        record = self.records[index]
        return {
            "model_call_id": record.model_call_id,
            "cumulative_token_ids": [],
            "digest": record.cumulative_hash,
            "staging_chain": self.rows[index]["staging_chain"],
            "prev_len": record.cum_len,
            "chain_hash": record.chain_hash,
        }

    def add(self, call_id: str, *, extras: dict[str, Any] | None = None) -> StagedCallRecord:
        """Append the next call: its staged record and its committed ledger row."""
        index = len(self.records)
        parent = self.records[-1] if self.records else None
        before = [] if parent is None else _tokens(self.records)
        record = build_staged_call(
            rollout_id=self.rollout_id,
            model_call_id=call_id,
            parent=parent,
            prompt_token_ids=[*before, 10 * index + 1, 10 * index + 2, 10 * index + 3],
            generated_token_ids=[1000 + 2 * index, 1001 + 2 * index],
            generated_log_probs=[-0.5, -0.25],
            weight_version=7,
            extras=extras,
        )
        request = self.request_items(index)
        self.records.append(record)
        self.requests.append(request)
        chain = [staging_key(self.rollout_id, r.model_call_id) for r in self.records]
        self.rows.append(committed_row(record, request, [_assistant(index)], staging_chain=chain))
        return record


def _tokens(records: list[StagedCallRecord]) -> list[int]:
    return [int(token) for record in records for token in record.token_ids_delta]


def manifest_row(record: StagedCallRecord, **fields: Any) -> CallRecord:
    """`record`'s manifest row, answered as `resp-<call id>`; `fields` set or replace the rest."""
    return CallRecord(
        **{
            "model_call_id": record.model_call_id,
            "parent_call_id": record.parent_call_id,
            "prev_len": record.prev_len,
            "delta_len": record.delta_len,
            "cum_len": record.cum_len,
            "weight_version": record.weight_version,
            "digest": record.digest,
            "extras_digest": record.extras_digest,
            "staging_key": record.staging_key,
            "mode": record.mode,
            "chain_hash": record.chain_hash,
            "cumulative_hash": record.cumulative_hash,
            "response_id": f"resp-{record.model_call_id}",
            **fields,
        }
    )


def committed_row(
    record: StagedCallRecord,
    request_items: list[dict[str, Any]],
    response_items: list[dict[str, Any]],
    *,
    staging_chain: list[str],
    admitted_at: float = 1767225600.0,
) -> dict[str, Any]:
    """The ledger row a model server commits for `record` (lookup keys as a client computes)."""
    call = manifest_row(
        record,
        staging_key=staging_key(record.rollout_id, record.model_call_id),
        admitted_at=admitted_at,
        output_fingerprint=assistant_fingerprint(response_items),
        continuation_fingerprint=assistant_fingerprint(request_items + response_items),
        fingerprint_version=FINGERPRINT_VERSION,
    )
    return commit_row(
        call,
        staging_chain=staging_chain,
        fingerprint=assistant_fingerprint(request_items + response_items),
        context_len=len(request_items),
        context_digest=conversation_digest(request_items),
    )


def row_of_commit(commit: dict[str, Any]) -> dict[str, Any]:
    """Our committed row for a vector's CaptureLedgerCommit, as NeMo Gym's file ledger writes it."""
    request, response = commit["request_items"], commit["response_items"]
    return commit_row(
        CallRecord.from_json(commit["record"]),
        staging_chain=commit["staging_chain"],
        fingerprint=assistant_fingerprint(request + response),
        context_len=len(request),
        context_digest=conversation_digest(request),
    )


def wire_attachments(vector: dict[str, Any] | None) -> dict[str, Any] | None:
    """The vectors' attachments (`{"json"}` / `{"bytes_hex"}`) in their wire form."""
    if vector is None:
        return None
    wire: dict[str, Any] = {}
    for name, value in vector.items():
        if "json" in value:
            wire[name] = {"json": value["json"]}
        else:
            wire[name] = {"bytes": base64.b64encode(bytes.fromhex(value["bytes_hex"])).decode()}
    return wire


def query_of(items: list[dict[str, Any]]) -> LineageQuery:
    """A resolve request for `items`, in its wire form."""
    return LineageQuery(FINGERPRINT_VERSION, assistant_fingerprint(items), context_digests(items))


async def resolution_of(store: Any, rollout_id: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    """What a resolve of `items` answers over a staging rollout, as the store server answers it.

    A request without model-authored items is a root (the client never asks);
    a rollout without ledger rows resolves over its entries: none, `no_match`.
    """
    query = query_of(items)
    if not query.fingerprint:
        return {"status": "root", "reason": "", "match": None}
    resolution = await store.resolve_ledger(rollout_id, query)
    if resolution is None:
        return {"status": "unresolved", "reason": "no_match", "match": None}
    match = resolution.match
    return {
        "status": resolution.status,
        "reason": resolution.reason,
        "match": None if match is None else match.to_json(),
    }
