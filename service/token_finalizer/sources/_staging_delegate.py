"""The StagingStore methods of a local store, handed to the store's staging backend.

Each store (memory, file, redis) keeps its token capture in its own class and
its external staging in a companion object (`memory_staging`,
`file/staging`, `redis/staging`), reached as `self._staging`; this mixin
gives the store the staging methods by forwarding to it, so the store class
itself only decides what is shared: the rollout's state, its freeze and drop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from token_finalizer.core.identity import check_new_store_id
from token_finalizer.core.staging import LedgerResolution, RolloutManifest, StagedCallRecord
from token_finalizer.sources.base import (
    Attachment,
    LineageQuery,
    StagedExtras,
    StagingStore,
)

__all__ = ["StagingBackend", "StagingDelegate"]


class StagingBackend(StagingStore, Protocol):
    """A store's staging companion: the StagingStore methods and the extras fetch."""

    async def fetch_extras(self, rollout_id: str, call_ids: Sequence[str]) -> StagedExtras: ...


class StagingDelegate:
    """StagingStore (and `fetch_extras`) by forwarding to `self._staging`."""

    _staging: StagingBackend

    async def record_ledger_row(self, rollout_id: str, row: Mapping[str, Any]) -> bool:
        """Append a committed ledger row (write-once); False for an identical replay."""
        check_new_store_id(rollout_id)
        return await self._staging.record_ledger_row(rollout_id, row)

    async def record_ledger_failure(self, rollout_id: str, model_call_id: str, reason: str) -> bool:
        """Append a failure row; False when that (call, reason) row is already stored."""
        check_new_store_id(rollout_id)
        return await self._staging.record_ledger_failure(rollout_id, model_call_id, reason)

    async def ledger_has_rows(self, rollout_id: str) -> bool:
        """Whether the rollout's ledger holds any row."""
        return await self._staging.ledger_has_rows(rollout_id)

    async def ledger_manifest(self, rollout_id: str) -> RolloutManifest:
        """The manifest of the rollout's ledger."""
        return await self._staging.ledger_manifest(rollout_id)

    async def resolve_ledger(self, rollout_id: str, query: LineageQuery) -> LedgerResolution | None:
        """Parent resolution over ledger rows; None when the rollout holds none."""
        return await self._staging.resolve_ledger(rollout_id, query)

    async def stage(
        self, record: StagedCallRecord, attachments: Mapping[str, Attachment] | None = None
    ) -> bool:
        """Store one staged call after the custody checks; False for an identical replay."""
        check_new_store_id(record.rollout_id)
        return await self._staging.stage(record, attachments)

    async def fetch_staged(
        self, rollout_id: str, call_ids: Sequence[str]
    ) -> tuple[bytes | None, ...]:
        """Each call's base snapshot JSON, in order; None when not staged."""
        return await self._staging.fetch_staged(rollout_id, call_ids)

    async def fetch_extras(self, rollout_id: str, call_ids: Sequence[str]) -> StagedExtras:
        """The extras of the staged calls among `call_ids`."""
        return await self._staging.fetch_extras(rollout_id, call_ids)

    async def fetch_attachments(
        self, rollout_id: str, model_call_id: str
    ) -> dict[str, Attachment] | None:
        """The call's attachments as staged; None when not staged."""
        return await self._staging.fetch_attachments(rollout_id, model_call_id)

    async def clear_staged(self, rollout_id: str, call_ids: Sequence[str]) -> int:
        """Delete exactly these staged calls; how many were held (idempotent)."""
        return await self._staging.clear_staged(rollout_id, call_ids)
