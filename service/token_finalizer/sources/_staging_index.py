"""In-process indexes of external staging, shared by the memory and file stores.

`LedgerIndex` holds one rollout's ledger rows in commit order, indexed by
call id (write-once decisions look at that call's rows only) and by
fingerprint (parent resolution looks at that fingerprint's committed rows
only), so neither costs more than the rows it concerns. It is built
incrementally: the file store feeds it the lines appended since it last
looked.

`StagedCallCache` keeps parsed staged calls by staging digest (the digest
covers every field, the rollout and call id included, so one digest is one
immutable call) under a budget of token ids, least recently used out first:
the custody check of a new call walks its whole parent chain, which is
almost always the chain its predecessor just walked.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from token_finalizer._constants import STAGED_CACHE_MAX_TOKENS
from token_finalizer.core.staging import (
    LedgerResolution,
    LedgerWrite,
    RolloutManifest,
    StagedCallBaseSnapshot,
    manifest_from_rows,
    plan_commit,
    plan_failure,
    resolve_ledger,
)
from token_finalizer.sources.base import LineageQuery

__all__ = ["LedgerIndex", "StagedCallCache"]

Row = Mapping[str, Any]


class LedgerIndex:
    """One rollout's ledger rows, by call id and by fingerprint, in commit order."""

    __slots__ = ("_by_call", "_by_fingerprint", "rows")

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self._by_call: dict[str, list[Row]] = {}
        self._by_fingerprint: dict[str, list[Row]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: Row) -> None:
        """Index one row appended to the ledger."""
        self.rows.append(row)
        call_id = row.get("model_call_id")
        if isinstance(call_id, str):
            self._by_call.setdefault(call_id, []).append(row)
        fingerprint = row.get("fingerprint")
        # Failure rows carry no fingerprint and are never parents.
        if row.get("failure_reason") is None and isinstance(fingerprint, str) and fingerprint:
            self._by_fingerprint.setdefault(fingerprint, []).append(row)

    def plan_commit(self, row: Row) -> LedgerWrite:
        """APPEND or REPLAY for a committed row; LedgerConflict for anything else."""
        return plan_commit(self._by_call.get(row["model_call_id"], ()), row)

    def plan_failure(self, row: Row) -> LedgerWrite:
        """APPEND or REPLAY for a failure row."""
        return plan_failure(self._by_call.get(row["model_call_id"], ()), row)

    def resolve(self, query: LineageQuery) -> LedgerResolution:
        """Parent resolution over the committed rows of the request's fingerprint."""
        candidates = self._by_fingerprint.get(query.fingerprint, ())
        return resolve_ledger(candidates, query.fingerprint, query.context_digests)

    def manifest(self, rollout_id: str) -> RolloutManifest:
        """The rollout's manifest (StagingRecordError for a row that makes no CallRecord)."""
        return manifest_from_rows(rollout_id, self.rows)


class StagedCallCache:
    """Parsed staged calls by staging digest, under a budget of token ids (thread-safe)."""

    def __init__(self, max_tokens: int = STAGED_CACHE_MAX_TOKENS) -> None:
        self._max_tokens = max_tokens
        self._tokens = 0
        self._calls: OrderedDict[str, StagedCallBaseSnapshot] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str) -> StagedCallBaseSnapshot | None:
        """The call with this staging digest, when this process still holds it."""
        with self._lock:
            snapshot = self._calls.get(digest)
            if snapshot is not None:
                self._calls.move_to_end(digest)
            return snapshot

    def put(self, snapshot: StagedCallBaseSnapshot) -> None:
        """Keep a call (one larger than the whole budget is not kept)."""
        size = snapshot.delta_len
        if size > self._max_tokens:
            return
        with self._lock:
            if snapshot.digest in self._calls:
                self._calls.move_to_end(snapshot.digest)
                return
            self._calls[snapshot.digest] = snapshot
            self._tokens += size
            while self._tokens > self._max_tokens:
                _, evicted = self._calls.popitem(last=False)
                self._tokens -= evicted.delta_len
